"""Job-level utilization (tasks.window.utilization): constructed event sequences whose answers are
worked out by hand below, then the real recovery experiment's events on the demo plan."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from tasks.data.datasets import EVENTS, UTILIZATION
from tasks.data.plan import load_plan, parse_fault
from tasks.data.runctx import make_run_context, open_run
from tasks.data.store import read_dataset
from tasks.window.chains import CATEGORIES, classify_chains
from tasks.window.utilization import compute_utilization
from tests.support.common import REPO
from tests.unit.test_utilization import assert_adds_up, criu_path  # noqa: F401


@pytest.mark.criu
def test_real_recovery_events_add_up_and_managed_loses_less(
    tmp_path: Path, criu_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tasks.experiments.recovery import run_recovery, write_and_gate

    monkeypatch.setenv("CKPT_POC_CRIU", criu_path)
    plan_path = REPO / "plans" / "demo.yaml"
    plan = load_plan(plan_path).model_copy(
        update={
            "data_dir": str(tmp_path / "data"),
            "faults": [parse_fault(kind="sigkill")],
            "repeats": 2,
        }
    )
    with open_run(plan, plan_path, "recovery") as ctx:
        run = run_recovery(plan, ctx)
        write_and_gate(run, plan, ctx)
    # committed on leaving open_run: its events are readable now
    trials = run.trials[run.trials["measure"] == "recovery"]
    assert (trials["status"] == "ok").all(), run.failures

    uctx = make_run_context(plan, plan_path, stage="utilization")
    rows = compute_utilization(plan, uctx)
    uctx.commit()
    assert_adds_up(rows)
    stored = read_dataset(UTILIZATION, data_dir=uctx.data_dir, poc=plan.poc)
    assert len(stored) == len(rows) and set(stored["run_id"]) == {uctx.run_id}
    by_arm = rows.groupby("arm")[[f"{c}_gpu_h" for c in CATEGORIES]].sum()
    print(
        "\nutilization rows:\n"
        + rows.drop(columns=[c for c in rows if c.startswith("fp_")]).to_string()
    )
    assert by_arm.loc["managed", "lost_gpu_h"] < by_arm.loc["unmanaged", "lost_gpu_h"]
    assert (by_arm["delivered_gpu_h"] > 0).all()
    assert by_arm.loc["managed", "idle_checkpoint_gpu_h"] > 0
    assert by_arm.loc["unmanaged", "idle_checkpoint_gpu_h"] == 0

    # Chain by chain, against the recovery experiment's own numbers from the same events.
    ev_frame = read_dataset(EVENTS, data_dir=ctx.data_dir, poc=plan.poc)
    chains = {
        (c.trial_id, c.arm): c for c in classify_chains(ev_frame, default_gpus=plan.workload.gpus)
    }
    for t in trials.itertuples():
        chain = chains[(t.trial_id, t.arm)]
        rec = sum(b - a for a, b in chain.parts["idle_recovery"])
        lost = sum(b - a for a, b in chain.parts["lost"])
        frozen = sum(b - a for a, b in chain.parts["idle_checkpoint"])
        print(
            f"{t.trial_id} {t.arm}: recovery {rec:.4f} s (trials {t.recovery_s:.4f}), "
            f"lost {lost:.4f} s (trials work_lost_s {t.work_lost_s:.4f}, steps "
            f"{t.steps_lost}), frozen {frozen:.4f} s"
        )
        assert rec == pytest.approx(t.recovery_s, abs=1e-6)  # the same two events
        # Lost is the same span less what was frozen in it; the step interpolation of the
        # unmanaged arm may differ from its progress event by a fraction of a step.
        assert t.work_lost_s - frozen - 0.05 <= lost <= t.work_lost_s + 0.05
        assert math.isclose(
            sum(sum(b - a for a, b in chain.parts[c]) for c in CATEGORIES),
            sum(b - a for a, b in chain.allocated),
            rel_tol=1e-12,
        )
    assert os.environ["CKPT_POC_CRIU"] == criu_path
