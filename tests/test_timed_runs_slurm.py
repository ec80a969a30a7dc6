"""Overhead on a real single-node Slurm: a job that cannot start ends the stage with
Slurm's reason and commits nothing. (What the runs are on Slurm, jobs with the node to
themselves, the node's fingerprint, a native and a restore job per cold start, is checked on
the rows of the whole Slurm PoC: tests/test_poc_slurm.py.)

The cluster is the session's (tests/conftest.py: slurm_env), handed over with no job left.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tasks.data.plan import Plan, load_plan
from tasks.data.runctx import open_run
from tasks.engine.clusters.slurm.cluster import JobNeverStarted
from tasks.experiments.overhead import run_overhead
from tests import slurm_cluster
from tests.conftest import REPO, demo_plan_dict

pytestmark = [pytest.mark.slurm, pytest.mark.criu]

SHORT_RUN = [
    *demo_plan_dict()["workload"]["command"][:3],
    "--steps",
    "120",
    *demo_plan_dict()["workload"]["command"][5:],
]


@pytest.fixture
def slurm_env(slurm_jobs_env: dict[str, str]) -> dict[str, str]:
    return slurm_jobs_env


def _slurm(argv: list[str], env: dict[str, str]) -> str:
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout


def slurm_plan(tmp_path: Path, repeats: int = 2, partition: str = "poc") -> Plan:
    plan = load_plan(REPO / "plans" / "demo.yaml")
    return plan.model_copy(
        update={
            "poc": "slurm-timed",
            "data_dir": str(tmp_path / "data"),
            "cluster": plan.cluster.model_copy(
                update={"kind": "slurm", "nodes": ["ckpt-node1"], "queue": partition}
            ),
            "workload": plan.workload.model_copy(update={"command": SHORT_RUN, "gpus": 1}),
            "repeats": repeats,
        }
    )


def test_a_job_that_never_starts_ends_the_stage_with_slurms_reason(
    slurm_env, tmp_path: Path
) -> None:
    """A partition that is down: the job pends, the stage ends with its id and Slurm's reason
    once the timeout passes, the job is cancelled and nothing is committed."""
    plan = slurm_plan(tmp_path, repeats=1)
    _slurm(["scontrol", "update", "PartitionName=poc", "State=DOWN"], slurm_env)
    try:
        never = r"job \d+ did not start .*reason PartitionDown"
        with (
            pytest.raises(JobNeverStarted, match=never),
            open_run(plan, REPO / "plans" / "demo.yaml", "overhead") as ctx,
        ):
            run_overhead(plan, ctx, timeout_s=5)
    finally:
        _slurm(["scontrol", "update", "PartitionName=poc", "State=UP"], slurm_env)
    assert slurm_cluster.jobs_in_queue(slurm_env) == []
    assert not (Path(plan.data_dir) / plan.poc / "trials").exists()
