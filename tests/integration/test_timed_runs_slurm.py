"""Overhead on a real single-node Slurm: a job that cannot start ends the stage with
Slurm's reason and commits nothing. (What the runs are on Slurm, jobs with the node to
themselves, the node's fingerprint, a native and a restore job per cold start, is checked on
the rows of the whole Slurm PoC: tests/integration/test_poc_slurm.py.)

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
from tests.support import slurm_cluster
from tests.support.common import REPO, demo_plan_dict

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


def test_cold_start_times_a_server_by_a_probe_its_jobs_ask_on_the_node(
    slurm_env, tmp_path: Path
) -> None:
    """Cold start on Redis (not the first workload, on a port the harness picks), ready when
    `redis-cli ping` exits 0: each native and restore job asks that on the node and records
    `ready` itself, so both clocks are the node's."""
    from tasks.data.plan import ReadyProbe
    from tasks.experiments.cold_start import run_cold_start

    plan = slurm_plan(tmp_path)
    ping = ReadyProbe(exec=["redis-cli", "-p", "{port}", "ping"])
    workloads = [
        w.model_copy(update={"ready_probe": ping}) if w.name == "redis" else w
        for w in plan.workloads
    ]
    plan = plan.model_copy(
        update={
            "workloads": workloads,
            "cold_start": plan.cold_start.model_copy(update={"workload": "redis", "repeats": 3}),
        }
    )
    with open_run(plan, REPO / "plans" / "demo.yaml", "cold_start") as ctx:
        run = run_cold_start(plan, ctx, timeout_s=60)
    starts = run.trials[run.trials["measure"] == "cold_start"]
    assert (starts["status"] == "ok").all(), starts[["arm", "reason", "log_tail"]].to_dict(
        "records"
    )
    assert starts["job_id"].nunique() == len(starts) == 6
    ready = [e for e in run.events if e.event == "ready"]
    assert len(ready) == 6
    assert all(e.detail["probe"].startswith("exec redis-cli -p ") for e in ready)
    assert all(e.detail["answer"] == "exit 0: PONG" for e in ready)
    assert slurm_cluster.jobs_in_queue(slurm_env) == []
