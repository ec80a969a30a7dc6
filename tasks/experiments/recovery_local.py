"""A recovery trial on the local engine: the copy a process on this machine, a real signal,
restarted (unmanaged) or restored from its last complete CRIU checkpoint (managed)."""

from __future__ import annotations

import time
from typing import Any

from tasks.data.errors import CkptPocError
from tasks.data.plan import Fault, grace_of
from tasks.engine.checkpointers.base import Checkpointer, managed_checkpointer
from tasks.engine.checkpointers.criu import CriuError
from tasks.engine.checkpointers.none import NoCheckpointer
from tasks.engine.checkpointers.periodic import PeriodicCheckpoints
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.local import LocalCluster, WorkloadProcess
from tasks.engine.faults import FINISHED_DURING_NOTICE, NoticeHandler, inject_fault
from tasks.engine.paths import copy_argv, run_folder
from tasks.engine.preflight import PreflightResult, preflight_local
from tasks.engine.probes import LogProgressProbe, last_step_before
from tasks.experiments.recovery_trial import (
    Moments,
    TrialFailed,
    TrialRunner,
    TrialSetup,
    app_checkpoint,
    app_resume_step,
    base_row,
    checkpoint_started,
    end_torn_line,
    fail_trial,
    held_step,
    progress_event,
    restore_attempted,
    serve_and_measure,
    wait_for_step,
)

INCLUDES = "detection+scheduling+restore+warmup (local: scheduling is holding the slot again)"


def _wait_gone(proc: WorkloadProcess, cluster: LocalCluster, timeout: float) -> int | None:
    """Monotonic ns when the process was first observed gone, polled every 2 ms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            seen = time.monotonic_ns()
            cluster.wait_gone(proc, timeout=5)
            return seen
        time.sleep(0.002)
    return None


def run_local_trial(setup: TrialSetup, fault: Fault, arm: str, repeat: int) -> dict[str, Any]:
    """One trial on the local engine; returns its row (failed with a reason, never raising)."""
    plan, rec, cluster = setup.plan, setup.recorder, setup.cluster
    assert isinstance(cluster, LocalCluster)
    slot = plan.cluster.nodes[0]  # both arms on the same node
    row = base_row(setup, fault.kind, arm, repeat, slot, INCLUDES)
    trial = row["trial_id"]
    regex = plan.workload.progress_probe.log_regex
    copy_dir = run_folder(setup.ctx) / f"{trial}-{arm}"
    copy_dir.mkdir(parents=True, exist_ok=True)
    argv = copy_argv(plan.workload.command or [], copy_dir)
    probe: LogProgressProbe | None = None
    periodic: PeriodicCheckpoints | None = None
    try:
        launched = rec.record(trial, arm, "launch", slot=slot)
        proc = cluster.start(slot, arm, argv, tag=trial)
        probe = LogProgressProbe(proc.log, regex, rec, trial, arm).start()
        criu = None
        if arm == "managed":
            criu = managed_checkpointer(
                plan, copy_dir / "criu", rec, trial, timeout_s=setup.timeout_s
            )
            periodic = PeriodicCheckpoints(criu, proc, plan.checkpointer.interval_s).start()
        wait_for_step(probe, proc.alive, setup.fault_step, setup.timeout_s)
        if periodic:
            periodic.stop()  # no dump in flight when the fault lands
        fault_ev = _deliver(fault, cluster, proc, criu, rec, row)
        gone_ns = _wait_gone(proc, cluster, timeout=setup.fault_timeout_s)
        if gone_ns is None:
            raise TrialFailed(
                f"the workload survived {fault.kind}: pid {proc.pid} still running "
                f"{setup.fault_timeout_s:.0f} s after the fault"
            )
        detected = rec.record(trial, arm, "detected", pid=proc.pid)
        row["detect_latency_ms"] = (detected.t_mono_ns - gone_ns) / 1e6
        row["fault_outcome"], stopped = _outcome(fault, rec, trial, arm, row)
        if row["fault_outcome"] == FINISHED_DURING_NOTICE:
            raise TrialFailed(
                f"the copy {FINISHED_DURING_NOTICE} ({fault.kind}, grace {grace_of(fault)} s): "
                "no interruption to recover from"
            )
        killed_at = end_torn_line(proc.log)
        step_at_fault = last_step_before(proc.log, killed_at, regex)
        started = rec.record(trial, arm, "started", slot=slot)
        if criu is not None:
            point = criu.last_complete()
            if point is None:
                raise TrialFailed("no complete CRIU checkpoint before the fault")
            resume_step = held_step(proc.log, point, regex)
            recoverable = checkpoint_started(rec, trial, point.index)
            row.update(recoverable_point="checkpoint", checkpoint_bytes=point.image_bytes)
            restore_attempted(row)
            criu.restore(cluster, slot, point)
            restored = rec.events(trial, arm, "restored")[-1]  # CRIU's restore returned
        else:
            app = plan.workload.app_checkpoint
            arm_ckpt = NoCheckpointer(
                rec, trial, app_checkpoint(plan, copy_dir), app.resume_args if app else []
            )
            kind = arm_ckpt.recoverable_point().kind
            resume_step, recoverable = 0, launched
            if kind == "app_checkpoint":
                resume_step = app_resume_step(plan, step_at_fault, proc.log, killed_at)
                recoverable = progress_event(rec, trial, arm, resume_step)
            row["recoverable_point"] = kind
            new = arm_ckpt.restart(cluster, slot, argv, tag=trial)
            restored = rec.record(trial, arm, "restored", pid=new.pid)  # the fresh process
        moments = Moments(
            fault_ev, detected, started, restored, recoverable, step_at_fault, resume_step, stopped
        )
        serve_and_measure(row, setup, probe, proc.log, killed_at, moments)
    except (TrialFailed, CriuError, CkptPocError) as exc:
        fail_trial(row, rec, exc, cluster.log_path(slot, arm, trial))
    finally:
        if periodic:
            periodic.stop()
        if probe:
            probe.stop()
        cluster.stop_all()
    return row


def _deliver(
    fault: Fault,
    cluster: LocalCluster,
    proc: WorkloadProcess,
    criu: Checkpointer | None,
    rec: EventRecorder,
    row: dict[str, Any],
) -> Event:
    """The fault; one with a notice tells the managed arm's checkpointer first."""
    if grace_of(fault) is None:
        return inject_fault(cluster, proc, fault, rec, row["trial_id"])
    if criu is None:
        row["notice_checkpoint"] = "none"
    on_notice = notice_checkpoint(criu, proc, rec, row)
    return inject_fault(cluster, proc, fault, rec, row["trial_id"], on_notice)


def notice_checkpoint(
    criu: Checkpointer | None, proc: WorkloadProcess, rec: EventRecorder, row: dict[str, Any]
) -> NoticeHandler | None:
    """The managed arm on a notice: dump at once (CRIU ends the copy once dumped), within
    the deadline; one still running then is cut, and the arm falls back to its last periodic
    checkpoint. Returns the dump's start: when the copy stopped computing."""
    if criu is None:
        return None

    def on_notice(deadline: float) -> Event | None:
        t0 = time.monotonic()
        try:
            point = criu.dump(proc, leave_running=False, timeout=max(0.001, deadline - t0))
        except CriuError:
            row.update(notice_checkpoint="missed", notice_checkpoint_s=time.monotonic() - t0)
            return None
        row.update(notice_checkpoint="finished", notice_checkpoint_s=point.dump_s)
        return checkpoint_started(rec, row["trial_id"], point.index)

    return on_notice


def _outcome(
    fault: Fault, rec: EventRecorder, trial: str, arm: str, row: dict[str, Any]
) -> tuple[str, Event | None]:
    """How the fault ended the copy; after a notice, also when the copy stopped computing:
    its notice dump's start (a finished one froze it there), else when it was seen gone."""
    if grace_of(fault) is None:
        return "process gone", None
    gone = rec.events(trial, arm, "work_stopped")[-1]
    if row.get("notice_checkpoint") == "finished":
        return gone.detail["how"], rec.events(trial, arm, "checkpoint_start")[-1]
    return gone.detail["how"], gone


def preflight_local_trial(setup: TrialSetup, timeout_s: float) -> PreflightResult:
    """The preflight as a process on the plan's first node (tasks/engine/preflight)."""
    assert isinstance(setup.cluster, LocalCluster)
    return preflight_local(setup.plan, setup.ctx, setup.cluster, timeout_s)


LOCAL_TRIALS = TrialRunner(run_local_trial, preflight_local_trial, INCLUDES)
