"""A kill with a notice on the local engine (`sigterm-grace`), real CRIU, both arms.

At the notice the managed arm's checkpointer dumps at once; with a grace period that holds the
dump, the managed copy comes back exactly at the step its notice checkpoint held (nothing lost
but the dump's own moment). A grace period shorter than the dump is a missed deadline: the
dump is cut, the copy is killed at the deadline, and it comes back from its last periodic
checkpoint, work lost counted from there, never reported as a success of the notice.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tasks.data.plan import load_plan, parse_fault
from tasks.data.runctx import make_run_context
from tasks.experiments.checkpoints import checkpoint_rows
from tasks.experiments.deadline import REPEATS, SIZES_MB, grace_lines
from tasks.experiments.recovery import run_recovery
from tests.support.common import REPO
from tests.support.logged_steps import assert_steps_lost_as_logged

pytestmark = pytest.mark.criu


def _trials(tmp_path: Path, grace_s: float, monkeypatch, criu_binary: str) -> pd.DataFrame:
    monkeypatch.setenv("CKPT_POC_CRIU", criu_binary)
    plan = load_plan(REPO / "plans" / "demo.yaml").model_copy(
        update={
            "data_dir": str(tmp_path / "data"),
            "faults": [parse_fault(kind="sigterm-grace", grace_s=grace_s)],
            "repeats": 1,
        }
    )
    ctx = make_run_context(plan, REPO / "plans" / "demo.yaml")
    run = run_recovery(plan, ctx, timeout_s=60)
    _RUNS.append((plan, run))
    return run.trials.set_index("arm")


def copy_log(data: Path, row: pd.Series) -> Path:
    """The local engine's log of one copy: its first attempt and the one after the fault."""
    return next(data.rglob(f"*-{row.name}-{row['trial_id']}.log"))


_RUNS: list = []  # (plan, run) of the last _trials call, for the deadline sweep's dumps


def test_a_notice_with_time_to_checkpoint_loses_nothing_on_the_managed_arm(
    tmp_path: Path, monkeypatch, criu_binary: str
) -> None:
    # 2 s: ten times the demo workload's dump here, and well short of the run it has left.
    trials = _trials(tmp_path, 2.0, monkeypatch, criu_binary)
    assert (trials["status"] == "ok").all(), trials["reason"].tolist()
    managed, unmanaged = trials.loc["managed"], trials.loc["unmanaged"]
    assert managed["notice_checkpoint"] == "finished"
    assert 0 < managed["notice_checkpoint_s"] < 2
    # It resumed at the step the notice checkpoint held: the copy was frozen by the dump and
    # ended by CRIU, so not one step was computed after it.
    assert managed["steps_lost"] == 0 and managed["recoverable_point"] == "checkpoint"
    assert managed["work_lost_s"] < 0.1
    # The unmanaged copy got the SIGTERM and ran on: it is its PID namespace's init, which
    # ignores a signal it has no handler for (a container's PID 1 without an init does the
    # same). SIGKILL at the deadline; back from its own last checkpoint, the steps since lost.
    assert unmanaged["notice_checkpoint"] == "none"
    assert unmanaged["recoverable_point"] == "app_checkpoint"
    assert unmanaged["fault_outcome"] == "killed at the deadline"
    assert_steps_lost_as_logged(
        copy_log(tmp_path, unmanaged), unmanaged["steps_lost"], from_app_checkpoint=True
    )
    assert unmanaged["work_lost_s"] > 0
    assert managed["fault_outcome"] == "ended by its notice checkpoint"
    assert set(trials["clock"]) == {"fault_injected→serving_again"}
    # After the trials, the deadline sweep: the example server at 0, 64 and 256 MiB, dumped as
    # on a notice, and what the plan's 2 s grace holds read from the line through them.
    plan, run = _RUNS[-1]
    dumps = checkpoint_rows(run.events, plan, plan.cluster.nodes[0])
    sweep = dumps[dumps["trial_id"].str.startswith("deadline-")]
    assert len(sweep) == len(SIZES_MB) * REPEATS and (sweep["status"] == "ok").all()
    assert set(sweep["includes"]) == {"one full CRIU dump that ended the workload (on a notice)"}
    (line,) = grace_lines(plan, dumps)
    print(line)
    assert line.startswith("a grace of 2 s holds a process of up to ")


def test_a_notice_too_short_for_the_dump_is_a_missed_deadline(
    tmp_path: Path, monkeypatch, criu_binary: str
) -> None:
    # 1 ms: no CRIU dump of a Python process finishes in that (its start-up alone is longer).
    trials = _trials(tmp_path, 0.001, monkeypatch, criu_binary)
    managed = trials.loc["managed"]
    assert managed["status"] == "ok", managed["reason"]
    assert managed["notice_checkpoint"] == "missed"
    assert managed["notice_checkpoint_s"] >= 0
    assert managed["fault_outcome"] == "killed at the deadline"
    # Back from the last periodic checkpoint: the steps since it are lost, and counted.
    assert managed["recoverable_point"] == "checkpoint"
    assert_steps_lost_as_logged(copy_log(tmp_path, managed), managed["steps_lost"])
    assert managed["work_lost_s"] > 0


def test_a_copy_that_finishes_its_work_during_the_notice_is_its_rows_outcome(
    tmp_path: Path, monkeypatch, criu_binary: str
) -> None:
    """A grace period longer than the run has left (10 s; the fault comes at step 130 of 400,
    about 5.4 s before the end): the unmanaged copy ignores the SIGTERM and runs to its end
    inside the grace. That is the trial's outcome, said on its failed row (there is nothing
    to recover), and the managed arm's trial still runs and recovers from its notice dump."""
    trials = _trials(tmp_path, 10.0, monkeypatch, criu_binary)
    managed, unmanaged = trials.loc["managed"], trials.loc["unmanaged"]
    assert unmanaged["status"] == "failed"
    assert unmanaged["fault_outcome"] == "finished its work during the notice"
    assert "no interruption to recover from" in unmanaged["reason"]
    assert managed["status"] == "ok", managed["reason"]
    assert managed["notice_checkpoint"] == "finished" and managed["steps_lost"] == 0
