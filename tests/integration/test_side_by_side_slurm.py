"""The side-by-side engine on a real single-node Slurm with real CRIU: both copies are batch
jobs on the plan's node (never processes of the harness's own), the managed job is
checkpointed by the node's CRIU at the plan's interval, the unmanaged one is not, and the
jobs' own records are the run's events.

The cluster is the session's (tests/conftest.py: slurm_env), handed over with no job left.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.data.datasets import EVENTS
from tasks.data.runctx import open_run
from tasks.data.store import read_dataset
from tasks.engine.side_by_side import run_side_by_side
from tests.integration.test_timed_runs_slurm import slurm_plan
from tests.support import slurm_cluster
from tests.support.common import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.criu]


def test_both_copies_run_as_jobs_on_the_plan_node(slurm_jobs_env, tmp_path: Path) -> None:
    plan = slurm_plan(tmp_path, repeats=3)
    plan = plan.model_copy(
        update={"checkpointer": plan.checkpointer.model_copy(update={"interval_s": 0.5})}
    )
    with open_run(plan, REPO / "plans" / "demo.yaml", "side_by_side") as ctx:
        result = run_side_by_side(plan, ctx, timeout_s=120)
    summary = result.summary()
    assert {a: r.last_step for a, r in summary.arms.items()} == {
        "managed": 120,
        "unmanaged": 120,
    }
    assert all(r.exited and r.pid is None for r in summary.arms.values())
    assert summary.checkpoints >= 1 and not summary.checkpoint_errors
    job_ids = summary.job_ids
    assert job_ids is not None
    assert set(job_ids) == {"managed", "unmanaged"} and len(set(job_ids.values())) == 2
    for job_id in job_ids.values():
        (attempt,) = slurm_cluster.wait_state(job_id, {"COMPLETED"}, env=slurm_jobs_env)
        assert attempt["NodeList"] == "ckpt-node1", attempt
    assert slurm_cluster.jobs_in_queue(slurm_jobs_env) == []

    events = read_dataset(EVENTS, data_dir=Path(plan.data_dir), poc=plan.poc)
    by_arm = {arm: set(group["event"]) for arm, group in events.groupby("arm")}
    # The jobs' own records (their wrapper's job_started, the dumps on the node) came in.
    assert {"launch", "started", "job_started", "progress", "exited"} <= by_arm["unmanaged"]
    assert {"job_started", "checkpoint_start", "checkpoint_end"} <= by_arm["managed"]
    assert "checkpoint_start" not in by_arm["unmanaged"]
