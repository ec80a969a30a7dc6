"""The compatibility sweep on Slurm: each workload's sweep one job pinned to the plan's node.

The harness submits, per workload, one job with the node to itself (`--exclusive`) that runs
this module (`python -m tasks.experiments.backends.slurm.sweep SPEC.json`). Inside the job,
on the node, the workload goes through exactly the local sweep
(tasks/experiments/compatibility.py): the reference run and every cycle are the job's own
processes, dumped and restored by the node's CRIU, and CRIU's causes and fidelity are read
as locally. The job writes the workload's result (`sweep.json`, atomically) and its events;
the harness reads both once the job has ended. A job that never starts ends the stage with
Slurm's reason; a job that ends without a result is that workload's result, naming the job
and how it ended.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any

from tasks.data.arms import MANAGED
from tasks.data.fingerprint import collect_fingerprint, tool_version_of
from tasks.data.plan import Plan, Workload
from tasks.data.runctx import RunContext
from tasks.engine.checkpointers.criu import clean_dead_roots, find_criu
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.registry import cluster_for, process_slots
from tasks.engine.clusters.slurm.cluster import ACTIVE_STATES, SlurmCluster
from tasks.engine.paths import prepared_root, run_folder
from tasks.engine.preflight import log_tail
from tasks.experiments.compatibility import (
    CompatibilityRun,
    Sweep,
    WorkloadSweep,
    chosen_workloads,
    ensure_compatibility_runs,
    sweep_workload,
)
from tasks.experiments.compatibility_cycle import CycleRecord

MODULE = "tasks.experiments.backends.slurm.sweep"
# A workload's whole sweep (the reference, each cycle, the end) within this many of the
# plan's per-step timeouts before the harness gives up on its job.
SWEEP_BUDGET_TIMEOUTS = 4


def run_compatibility_on_slurm(
    plan: Plan,
    ctx: RunContext,
    *,
    cycles: int | None = None,
    timeout_s: float | None = None,
    only: list[str] | None = None,
) -> CompatibilityRun:
    """Every workload (or those named in ``only``) swept by a job of its own on the plan's
    first node, one after another."""
    ensure_compatibility_runs(plan)
    chosen = chosen_workloads(plan, only)
    cluster = cluster_for(plan, run_folder(ctx), Path.cwd())
    assert isinstance(cluster, SlurmCluster)
    recorder = EventRecorder(ctx)
    clean_dead_roots(run_folder(ctx).parent)  # checkpoint folders killed runs left
    n = cycles or plan.compatibility.cycles
    timeout = timeout_s or plan.compatibility.timeout_s
    sweeps: list[WorkloadSweep] = []
    versions: list[str] = []
    try:
        for index, w in chosen:
            sweep, criu_version = _sweep_job(plan, cluster, recorder, index, w, n, timeout)
            sweeps.append(sweep)
            versions.append(criu_version)
    finally:
        cluster.stop_all()
        cluster.close()
        recorder.flush()
    # The node's CRIU, as the jobs read it (the harness's host may have none).
    criu = next((v for v in versions if v != "unknown"), "unknown")
    return CompatibilityRun(sweeps, run_folder(ctx), criu, n)


def _sweep_job(
    plan: Plan,
    cluster: SlurmCluster,
    recorder: EventRecorder,
    index: int,
    w: Workload,
    cycles: int,
    timeout_s: float,
) -> tuple[WorkloadSweep, str]:
    """One workload's sweep as a job; its result and the node's CRIU version."""
    node = plan.cluster.nodes[0]
    job_dir = cluster.run_dir / f"sweep-{w.name}"
    job_dir.mkdir(parents=True, exist_ok=True)
    result, events, log = job_dir / "sweep.json", job_dir / "job-events.jsonl", job_dir / "job.log"
    spec = {
        "trial_id": f"compat-{w.name}",
        "arm": MANAGED,
        "node": node,
        "workload": w.model_dump(mode="json"),
        "index": index,
        "cycles": cycles,
        "timeout_s": timeout_s,
        "run_dir": str(cluster.run_dir),
        "workdir": str(cluster.workdir),
        # {prepared}: the PoC's folder, on the storage the node shares (data_dir).
        "prepared_root": str(prepared_root(plan.data_dir, plan.poc)),
        "images_dir": plan.checkpointer.images_dir,
        "events": str(events),
        "result": str(result),
    }
    started = dt.datetime.now(dt.UTC)
    job = cluster.submit(
        node, "sweep", spec, name=f"compat-{w.name}", log=log, gpus=w.gpus, exclusive=True,
        module=MODULE,
    )  # fmt: skip
    cluster.wait_started(job, timeout_s)
    budget = timeout_s * (cycles + SWEEP_BUDGET_TIMEOUTS)
    ended = cluster.wait_until(job, lambda s: s not in ACTIVE_STATES, budget)
    recorder.import_jsonl(events)
    where = f"workloads.{index}"
    if ended is None:
        cluster.stop_all()
        error = f"{where}: the sweep job {job.job_id} did not end within {budget:.0f} s"
        return WorkloadSweep(w.name, started, error=error), "unknown"
    try:
        done = json.loads(result.read_text())
    except (OSError, ValueError):
        state = cluster.final_state(job)
        tail = (log_tail(log, 3) or "(its log is empty)").strip().splitlines()[-1]
        error = f"{where}: the sweep job {job.job_id} ended {state} without a result: {tail}"
        return WorkloadSweep(w.name, started, error=error), "unknown"
    return sweep_from_json(done["sweep"]), str(done["criu_version"])


# a dict: the JSON document the sweep job writes and the harness reads back
def sweep_to_json(sweep: WorkloadSweep) -> dict[str, Any]:
    out = dataclasses.asdict(sweep)
    out["started_at"] = sweep.started_at.isoformat()
    return out


def sweep_from_json(data: dict[str, Any]) -> WorkloadSweep:
    cycles = [CycleRecord(**c) for c in data.pop("cycles")]
    started = dt.datetime.fromisoformat(data.pop("started_at"))
    return WorkloadSweep(started_at=started, cycles=cycles, **data)


def run_in_job(spec: dict[str, Any]) -> int:
    """Inside the job, on the node: the local sweep of one workload; its result written."""
    w = Workload.model_validate(spec["workload"])
    node, run_dir = spec["node"], Path(spec["run_dir"])
    cluster = process_slots([node], run_dir, Path(spec["workdir"]), workload=w.name)
    recorder = EventRecorder(None, jsonl=Path(spec["events"]))
    find_criu()  # none on the node: the job fails, and its log says so
    sweep = Sweep(
        cluster,
        recorder,
        run_dir,
        node,
        int(spec["cycles"]),
        float(spec["timeout_s"]),
        Path(spec["prepared_root"]),
        spec.get("images_dir"),
    )
    try:
        out = sweep_workload(sweep, w, int(spec["index"]))
    finally:
        cluster.stop_all()
        cluster.close()
    criu = tool_version_of(collect_fingerprint(), "criu")
    result = Path(spec["result"])
    tmp = result.with_suffix(".tmp")
    tmp.write_text(json.dumps({"sweep": sweep_to_json(out), "criu_version": criu}))
    os.replace(tmp, result)
    return 0


def main() -> int:
    return run_in_job(json.loads(Path(sys.argv[1]).read_text()))


if __name__ == "__main__":
    sys.exit(main())
