"""Overhead and cold start on the local cluster: every timed run a process on the plan's
first slot (tasks/engine/clusters/local/cluster.py), started, dumped and restored by the harness.

What the rows mean is in tasks/experiments/timed_runs.py, shared with the Slurm runs
(tasks/experiments/backends/slurm/timed_runs.py).
"""

from __future__ import annotations

import time

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.errors import CkptPocError
from tasks.data.events import Ev
from tasks.data.plan import Plan
from tasks.data.row_types import ColdStartRow, OverheadRow
from tasks.data.runctx import RunContext
from tasks.engine.checkpointers.base import managed_checkpointer
from tasks.engine.checkpointers.criu import CriuError
from tasks.engine.checkpointers.periodic import PeriodicCheckpoints
from tasks.engine.clock import EventRecorder, span_s
from tasks.engine.clusters.base import Cluster
from tasks.engine.clusters.process import slots_of
from tasks.engine.page_cache import prepare_cache
from tasks.engine.paths import checkpoint_folder, run_folder
from tasks.engine.preflight import PREFLIGHT_TIMEOUT_S, log_tail
from tasks.engine.prepared import (
    copy_port,
    workload_argv,
    workload_prepared,
    workload_ready_probe,
)
from tasks.engine.probes import LogProgressProbe
from tasks.experiments.timed_runs import (
    RunFailed,
    StartFailed,
    cache_columns,
    cold_start_row,
    cold_start_trial,
    fail_starts,
    fill_progress_span,
    overhead_row,
    progress_regex,
    raw_read_numbers,
    restored_numbers,
    wait_for_ready,
)
from tasks.experiments.trials import LOG_TAIL


def preflight(plan: Plan, ctx: RunContext, cluster: Cluster) -> None:
    """The workload started once on the plan's first slot (tasks/engine/preflight)."""
    cluster.preflight(ctx, PREFLIGHT_TIMEOUT_S)


def overhead_run_local(
    plan: Plan,
    ctx: RunContext,
    cluster: Cluster,
    rec: EventRecorder,
    variant: str,
    pair: int,
    arm: str,
    timeout_s: float,
) -> OverheadRow:
    """One whole run of the workload; its row (failed with a reason, never raising)."""
    slots = slots_of(cluster)
    slot = plan.cluster.nodes[0]
    trial = f"{variant}-{pair}"
    copy_dir = run_folder(ctx) / f"overhead-{trial}-{arm}"  # fresh: nothing to resume
    copy_dir.mkdir(parents=True, exist_ok=True)
    row = overhead_row(plan, variant, pair, arm, slot, "the progress span of one whole run")
    probe: LogProgressProbe | None = None
    periodic: PeriodicCheckpoints | None = None
    try:
        rec.record(trial, arm, Ev.LAUNCH, slot=slot)
        proc = slots.start(slot, arm, workload_argv(plan, copy_dir), tag=trial)
        probe = LogProgressProbe(proc.log, plan.workload.progress_probe.log_regex, rec, trial, arm)
        probe.start()
        if arm == MANAGED and variant == "checkpointing":
            criu = managed_checkpointer(
                plan, checkpoint_folder(plan, copy_dir), rec, trial, timeout_s=timeout_s
            )
            periodic = PeriodicCheckpoints(criu, proc, plan.checkpointer.interval_s).start()
        deadline = time.monotonic() + timeout_s
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.alive():
            raise RunFailed(f"the run did not end within {timeout_s:.0f} s")
        if periodic:
            periodic.stop()
        probe.poll()  # the last lines, written just before exit
        rc = proc.launcher.wait(timeout=10) if proc.launcher else None
        rec.record(trial, arm, Ev.EXITED, rc=rc)
        if rc:
            raise RunFailed(f"the workload exited {rc}")
        fill_progress_span(row, probe)
        if periodic and periodic.errors:
            row["reason"] = f"{len(periodic.errors)} dump(s) failed: {periodic.errors[0]}"[:500]
    except (RunFailed, CriuError, CkptPocError) as exc:
        row.update(status="failed", reason=str(exc).splitlines()[0][:500])
        row[LOG_TAIL] = log_tail(slots.log_path(slot, arm, trial))
        rec.record(trial, arm, Ev.RUN_FAILED, reason=row["reason"])
    finally:
        if periodic:
            periodic.stop()
        if probe:
            probe.stop()
        cluster.stop_all()
    return row


COLD_START_INCLUDES = {
    UNMANAGED: "process start, imports and initialisation up to ready",
    MANAGED: "criu restore of the ready copy, then up to ready",
}


def cold_start_pair_local(
    plan: Plan,
    ctx: RunContext,
    cluster: Cluster,
    rec: EventRecorder,
    repeat: int,
    timeout_s: float,
    page_cache: str,
) -> list[ColdStartRow]:
    """One native start and one restore of the same copy, the page cache as ``page_cache``
    asks before each; two rows, failed ones kept."""
    slots = slots_of(cluster)
    slot = plan.cluster.nodes[0]
    trial = cold_start_trial(page_cache, repeat)
    copy_dir = run_folder(ctx) / f"{trial}-copy"
    copy_dir.mkdir(parents=True, exist_ok=True)
    native = cold_start_row(plan, trial, UNMANAGED, repeat, slot, COLD_START_INCLUDES[UNMANAGED])
    restore: ColdStartRow | None = None
    regex = progress_regex(plan)
    probes: list[LogProgressProbe] = []
    try:
        cache_files = [workload_prepared(plan), copy_dir]  # its weights, data and images
        native.update(cache_columns(prepare_cache(page_cache, cache_files)))
        port = copy_port(plan)  # the restored copy listens on it again
        ready_probe = workload_ready_probe(plan, copy_dir, port)
        launch = rec.record(trial, UNMANAGED, Ev.LAUNCH, slot=slot)
        argv = workload_argv(plan, copy_dir, port)
        proc = slots.start(slot, UNMANAGED, argv, tag=trial)  # one log per repeat
        probe = LogProgressProbe(proc.log, regex, rec, trial, UNMANAGED).start()
        probes.append(probe)
        ready = wait_for_ready(
            ready_probe, probe, rec, trial, UNMANAGED,
            after_offset=-1, timeout_s=timeout_s, alive=proc.alive, who=UNMANAGED,
        )  # fmt: skip
        native.update(status="ok", ready_s=span_s(launch, ready))

        restore = cold_start_row(plan, trial, MANAGED, repeat, slot, COLD_START_INCLUDES[MANAGED])
        criu = managed_checkpointer(
            plan, checkpoint_folder(plan, copy_dir), rec, trial, keep=1, timeout_s=timeout_s
        )
        point = criu.dump(proc)  # the fully initialised copy
        slots.kill(proc)
        if not slots.wait_gone(proc, timeout=10):
            raise StartFailed(f"the native copy (pid {proc.pid}) did not end after its dump")
        probe.stop()
        restore["checkpoint_bytes"] = point.image_bytes
        killed_at = proc.log.stat().st_size
        restore.update(cache_columns(prepare_cache(page_cache, cache_files)))
        restore["restore"] = "failed"  # until the restored copy is ready (restore_attempted)
        # The restored copy writes on into the native copy's log (CRIU restores its file
        # descriptors): only lines past what the native copy wrote count. The probe follows
        # from before the restore, unheld: a first line written as criu returns is timed.
        probe = LogProgressProbe(proc.log, regex, rec, trial, MANAGED, from_offset=killed_at)
        probes.append(probe.start())
        with probe.time_exactly():
            new = criu.restore(slots, slot, point)
            started = rec.events(trial, MANAGED, Ev.RESTORE_START)[-1]
            restored = rec.events(trial, MANAGED, Ev.RESTORED)[-1]
            ready = wait_for_ready(
                ready_probe, probe, rec, trial, MANAGED,
                after_offset=killed_at, timeout_s=timeout_s, alive=new.alive, who=MANAGED,
                restored=restored,
            )  # fmt: skip
        restore.update(restored_numbers(point.image_bytes, started, restored, ready))
        cluster.stop_all()  # the restored copy: the read below is alone on the node
        restore.update(raw_read_numbers(point.path, restore["page_cache"]))
    except (StartFailed, CriuError, CkptPocError) as exc:
        tail = log_tail(slots.log_path(slot, UNMANAGED, trial))  # the restore writes on in it
        fail_starts([native, restore], rec, trial, exc, tail)
    finally:
        for probe in probes:
            probe.stop()
        cluster.stop_all()
    return [native] + ([restore] if restore is not None else [])
