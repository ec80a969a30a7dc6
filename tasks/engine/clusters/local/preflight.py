"""The preflight on the local backend: one copy a process on the plan's first slot
(tasks/engine/preflight.py says what a preflight is)."""

from __future__ import annotations

from tasks.data.plan import Plan
from tasks.data.runctx import RunContext
from tasks.engine.clusters.local.cluster import LocalCluster
from tasks.engine.clusters.reaper import ProcessError
from tasks.engine.interpreter import resolve_workload_argv
from tasks.engine.paths import run_folder
from tasks.engine.preflight import (
    PREFLIGHT_TIMEOUT_S,
    TRIAL,
    PreflightResult,
    WorkloadDoesNotStart,
    await_first_sign,
    log_tail,
)
from tasks.engine.prepared import (
    copy_port,
    prepare_workload,
    workload_argv,
    workload_ready_probe,
)


def preflight_local(
    plan: Plan, ctx: RunContext, cluster: LocalCluster, timeout_s: float = PREFLIGHT_TIMEOUT_S
) -> PreflightResult:
    """Prepare the workload (tasks/engine/prepared.py), start one copy on the plan's first
    slot, see it work, stop it."""
    prepare_workload(plan, timeout_s, cluster.workdir)
    copy_dir = run_folder(ctx) / TRIAL
    copy_dir.mkdir(parents=True, exist_ok=True)
    port = copy_port(plan)
    argv = workload_argv(plan, copy_dir, port)
    ready = workload_ready_probe(plan, copy_dir, port)
    slot = plan.cluster.nodes[0]
    log = cluster.log_path(slot, TRIAL, TRIAL)
    before = log.stat().st_size if log.exists() else 0  # logs are appended to
    what = " ".join(resolve_workload_argv(argv))
    try:
        proc = cluster.start(slot, TRIAL, argv, tag=TRIAL)
    except ProcessError as exc:
        # A workload that exits at once can be gone before its launcher was seen to start it.
        tail = log_tail(log, after_offset=before) or "(the log is empty)"
        raise WorkloadDoesNotStart(
            f"preflight: the workload ({what}) exited at once, before its first progress "
            f"line ({exc}); nothing was measured. Last lines of {log}:\n{tail}"
        ) from exc
    try:
        return await_first_sign(
            plan, proc.log, proc.alive, timeout_s, what, after_offset=before, ready=ready
        )
    finally:
        cluster.kill(proc)
        cluster.wait_gone(proc)
