"""A workload that cannot start stops the run in seconds and says why.

The plan's `python` is the project's interpreter whoever starts the run (here: with a
`python` on PATH that is not it); the preflight sees the workload work before any trial,
or fails with the workload's own last log lines; and a recovery run whose first trials all
fail the same way before any fault stops instead of running every trial to its timeout.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tasks.data.datasets import TRIALS
from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context, open_run
from tasks.data.store import read_dataset
from tasks.engine.clusters.local.cluster import LocalCluster
from tasks.engine.clusters.local.preflight import preflight_local
from tasks.engine.preflight import WorkloadDoesNotStart
from tasks.experiments.recovery import RecoveryStopped, run_recovery, write_and_gate
from tests.support.common import REPO
from tests.unit.test_preflight import DEMO, _plan_with_command


def test_preflight_fails_on_a_silent_workload_and_passes_a_working_one(tmp_path: Path) -> None:
    silent = _plan_with_command(tmp_path, ["sleep", "30"])
    cluster = LocalCluster(list(silent.cluster.nodes), tmp_path / "run", REPO)
    ctx = make_run_context(silent, DEMO)
    t0 = time.monotonic()
    with pytest.raises(WorkloadDoesNotStart, match="stayed silent for 2 s"):
        preflight_local(silent, ctx, cluster, timeout_s=2)
    assert time.monotonic() - t0 < 5 and cluster.tracked == {}  # and the copy was ended

    plan = load_plan(DEMO).model_copy(update={"data_dir": str(tmp_path / "data")})
    result = preflight_local(plan, make_run_context(plan, DEMO), cluster, timeout_s=60)
    assert result.sign.startswith("progress step ") and result.seconds < 60
    assert cluster.tracked == {}


@pytest.mark.criu
def test_recovery_stops_after_its_first_trials_fail_alike(
    tmp_path: Path, criu_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPT_POC_CRIU", criu_binary)
    # The workload ends at step 60, before the default fault step (2.6 of the application's
    # checkpoint periods): every trial would fail the same way, each waiting for its timeout.
    plan = load_plan(DEMO)
    assert plan.workload.app_checkpoint is not None
    fault_step = int(plan.workload.app_checkpoint.every_steps * 2.6)
    command = [a if a != "300" else "60" for a in plan.workload.command or []]
    plan = _plan_with_command(tmp_path, command)
    # Recorded, then refused: the rows are on disk, and the run ends with the reason.
    with (
        pytest.raises(RecoveryStopped, match="on both arms failed before any fault"),
        open_run(plan, DEMO, "recovery") as ctx,
    ):
        t0 = time.monotonic()
        run = run_recovery(plan, ctx, timeout_s=120)
        assert time.monotonic() - t0 < 60
        assert run.stopped and f"before reaching step {fault_step}" in run.stopped, run.stopped
        assert len(run.trials) == 2 and set(run.trials["status"]) == {"failed"}
        assert all("step=60" in f["log_tail"] for f in run.failures), run.failures
        write_and_gate(run, plan, ctx)
    written = read_dataset(TRIALS, data_dir=Path(plan.data_dir), poc=plan.poc, run_id=ctx.run_id)
    assert len(written[written["measure"] == "recovery"]) == 2
