"""Deadline against size: the line through the sweep's dumps, and what a grace period holds."""

from __future__ import annotations

import pandas as pd
import pytest

from tasks.experiments.deadline import TRIAL_PREFIX, deadline_fit

MIB = 2**20


def _dumps(points: list[tuple[int, float]], status: str = "ok") -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "measure": "checkpoint",
                "status": status,
                "trial_id": f"{TRIAL_PREFIX}{mb}mb/ckpt-{i:05d}",
                "checkpoint_bytes": mb * MIB + 20 * MIB,  # the interpreter's own pages too
                "dump_s": s,
            }
            for i, (mb, s) in enumerate(points, 1)
        ]
    )


def test_fit_reads_fixed_cost_and_throughput_and_labels_what_is_extrapolated() -> None:
    # 0.1 s fixed + 1 GiB/s: 0, 64 and 256 MiB (+20 MiB of interpreter) dumped twice each.
    pts = [(mb, 0.1 + (mb + 20) / 1024) for mb in (0, 0, 64, 64, 256, 256)]
    fit = deadline_fit(_dumps(pts))
    assert fit is not None
    assert fit.fixed_s == pytest.approx(0.1, abs=1e-9)
    assert fit.bytes_per_s == pytest.approx(2**30, rel=1e-9)
    assert (fit.n, fit.largest_bytes) == (6, 276 * MIB)
    inside = fit.holds(0.3)  # 0.2 s of room: 204.8 MiB, within the 276 measured
    assert inside.basis == "measured" and inside.bytes == pytest.approx(0.2 * 2**30)
    beyond = fit.holds(30)
    assert beyond.basis == "extrapolated"
    assert beyond.line.startswith("a grace of 30 s holds a process of up to 29.90 GiB")
    assert "extrapolated beyond the largest measured: fixed cost 0.100 s" in beyond.line
    assert "from 6 dumps of up to 276 MiB" in beyond.line
    assert fit.holds(0.05).bytes == 0.0  # the fixed cost alone is past the deadline


def test_no_fit_from_one_size_or_failed_dumps() -> None:
    assert deadline_fit(_dumps([(64, 0.2), (64, 0.21)])) is None
    assert deadline_fit(_dumps([(0, 0.1), (64, 0.2)], status="failed")) is None


def test_plan_check_warns_when_a_grace_is_shorter_than_the_dumps_measured(
    tmp_path, write_plan, monkeypatch
) -> None:
    from typer.testing import CliRunner

    from cli.app import app
    from tasks.data.plan import load_plan
    from tasks.experiments.deadline import grace_warnings
    from tasks.experiments.trials import workload_hash
    from tests.unit.test_poc import _commit

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    path = write_plan({"faults": [{"kind": "sigkill"}, {"kind": "sigterm-grace", "grace_s": 0.05}]})
    plan = load_plan(path)
    assert grace_warnings(plan) == []  # nothing measured yet: nothing said
    dumps = [
        {"measure": "checkpoint", "status": "ok", "trial_id": f"sigkill-0/ckpt-{i}",
         "dump_s": s, "workload_hash": workload_hash(plan)}
        for i, s in enumerate((0.11, 0.12, 0.2))
    ]  # fmt: skip
    _commit(plan, "recovery", {"trials": dumps})
    want = (
        "faults.1.grace_s: 0.05 s is shorter than the median CRIU dump of digits-train "
        "measured here (0.120 s over 3 dumps): a checkpoint on the notice would miss its deadline"
    )
    assert grace_warnings(plan) == [want]
    done = CliRunner().invoke(app, ["plan", "check", str(path)])
    assert done.exit_code == 0, done.output
    assert want in " ".join(done.output.split())
