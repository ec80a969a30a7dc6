"""Overhead and cold start on a real single-node Slurm with real CRIU: every timed run a job.

The overhead runs are jobs pinned to the plan's node with the node to themselves; the cold
start's native copy is a job that the harness asks to dump its ready copy, and the restore a
second job on the node. The rows carry the fingerprint each job read on its node, the job
ids, and whether the job dropped the page cache. A job that cannot start ends the stage with
Slurm's reason and commits nothing.

The cluster is the session's (tests/conftest.py: slurm_env), handed over with no job left.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tasks.data.datasets import TRIALS
from tasks.data.fingerprint import FINGERPRINT_COLUMNS
from tasks.data.plan import Plan, load_plan
from tasks.data.runctx import open_run
from tasks.data.store import read_dataset
from tasks.engine.clusters.slurm import JobNeverStarted
from tasks.experiments.cold_start import cold_start_gate_checks, run_cold_start
from tasks.experiments.overhead import overhead_gate_checks, pair_order, run_overhead
from tasks.experiments.trials import write_and_gate
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


def _accounted(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """The job's allocation row in accounting (scontrol forgets an ended job)."""
    fields = ("NodeList", "AllocCPUS", "State")
    out = _slurm(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", ",".join(fields)], env)
    return dict(zip(fields, out.strip().splitlines()[-1].split("|"), strict=True))


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


def test_overhead_runs_as_exclusive_jobs_on_the_node(slurm_env, tmp_path: Path) -> None:
    plan = slurm_plan(tmp_path)
    with open_run(plan, REPO / "plans" / "demo.yaml", "overhead") as ctx:
        run = run_overhead(plan, ctx, timeout_s=120)
        rows = run.trials[run.trials["measure"] == "overhead"]
        assert (rows["status"] == "ok").all(), rows[["trial_id", "arm", "reason"]].to_string()
        write_and_gate(
            run.trials, ctx, "overhead", overhead_gate_checks(run.trials, plan, run.events)
        )
    written = read_dataset(TRIALS, data_dir=plan.data_dir, poc=plan.poc)
    runs = written[written["measure"] == "overhead"]
    assert len(runs) == 2 * plan.repeats * 2
    assert (runs["steps"] >= 100).all() and (runs["run_s"] > 0).all()
    # Interleaved A B, B A; each run its own job, in submission order.
    for variant, part in runs.groupby("variant"):
        order = part.sort_values("started_at")
        assert [tuple(o) for o in order[["pair", "arm"]].itertuples(index=False)] == [
            (pair, arm) for pair in range(plan.repeats) for arm in pair_order(pair)
        ], variant
        ids = order["job_id"].astype(int).tolist()
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # Each job ran alone on the node and read the node's fingerprint itself.
    node_cpus = _slurm(["sinfo", "-h", "-n", "ckpt-node1", "-o", "%c"], slurm_env).split()[0]
    for job_id in runs["job_id"]:
        row = _accounted(job_id, slurm_env)
        assert row["NodeList"] == "ckpt-node1" and row["State"] == "COMPLETED", row
        assert row["AllocCPUS"] == node_cpus, row  # --exclusive: the whole node
    assert runs[list(FINGERPRINT_COLUMNS)].notna().all().all()
    # The managed arm was dumped while it ran, in the checkpointing variant only.
    dumps = written[written["measure"] == "checkpoint"]
    assert len(dumps) > 0 and set(dumps["trial_id"].str.split("/").str[0]) <= {
        f"checkpointing-{p}" for p in range(plan.repeats)
    }


def test_cold_start_native_job_then_restore_job(slurm_env, tmp_path: Path) -> None:
    plan = slurm_plan(tmp_path)
    with open_run(plan, REPO / "plans" / "demo.yaml", "cold_start") as ctx:
        run = run_cold_start(plan, ctx, timeout_s=60)
        rows = run.trials[run.trials["measure"] == "cold_start"]
        assert (rows["status"] == "ok").all(), rows[["trial_id", "arm", "reason"]].to_string()
        write_and_gate(run.trials, ctx, "cold_start", cold_start_gate_checks(run.trials, plan))
    written = read_dataset(TRIALS, data_dir=plan.data_dir, poc=plan.poc)
    starts = written[written["measure"] == "cold_start"]
    assert sorted(starts["arm"]) == sorted(["managed", "unmanaged"] * plan.repeats)
    assert (starts["ready_s"] > 0).all()
    restores = starts[starts["arm"] == "managed"]
    assert (restores["checkpoint_bytes"] > 0).all() and (restores["restore_s"] > 0).all()
    # Native and restore are two jobs per repeat; both say how they started and what the
    # page cache was (the session's slurmd runs as root: it may drop it).
    assert starts["job_id"].nunique() == 2 * plan.repeats
    assert set(starts["page_cache"]) <= {"dropped", "warm"}
    assert starts["includes"].str.contains("job").all()
    assert set(starts["clock"]) == {"launch→ready", "restore_start→ready"}
    assert run.summary["speedup"] is not None


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
