"""A recovery trial's steps on the local backend: the copy a process on this machine, a
real signal, restarted (unmanaged) or restored from its last complete CRIU checkpoint
(managed) on the same slot."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tasks.data.arms import MANAGED
from tasks.data.events import Ev
from tasks.data.plan import Fault, grace_of
from tasks.data.row_types import RecoveryRow
from tasks.engine.checkpointers.base import Checkpointer, managed_checkpointer
from tasks.engine.checkpointers.criu import CriuError
from tasks.engine.checkpointers.none import NoCheckpointer
from tasks.engine.checkpointers.periodic import PeriodicCheckpoints
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.fault_kind import FINISHED_DURING_NOTICE, NoticeHandler, find_fault
from tasks.engine.clusters.local.cluster import LocalCluster
from tasks.engine.clusters.local.faults import LOCAL_FAULTS
from tasks.engine.clusters.process import WorkloadProcess
from tasks.engine.clusters.trial import (
    Comeback,
    Interruption,
    TrialCopy,
    TrialFailed,
    app_checkpoint,
    app_resume_step,
    checkpoint_started,
    held_step,
    progress_event,
    restore_attempted,
)
from tasks.engine.paths import checkpoint_folder

INCLUDES = "detection+scheduling+restore+warmup (local: scheduling is holding the slot again)"


@dataclass
class _Copy:
    process: WorkloadProcess
    checkpointer: Checkpointer | None = None  # the managed arm's
    periodic: PeriodicCheckpoints | None = None


class LocalRecovery:
    """`RecoverySteps` on the local backend, both arms on the plan's first slot."""

    includes = INCLUDES
    alive_every_s = 0.1

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    def log_path(self, t: TrialCopy) -> Path:
        return self.cluster.log_path(t.node, t.arm, t.trial)

    def launch(self, t: TrialCopy) -> None:
        copy = t.handle = _Copy(self.cluster.start(t.node, t.arm, t.argv, tag=t.trial))
        if t.arm == MANAGED:
            copy.checkpointer = managed_checkpointer(
                t.plan,
                checkpoint_folder(t.plan, t.copy_dir),
                t.recorder,
                t.trial,
                timeout_s=t.timeout_s,
            )
            copy.periodic = PeriodicCheckpoints(
                copy.checkpointer, copy.process, t.plan.checkpointer.interval_s
            ).start()

    def alive(self, t: TrialCopy) -> bool:
        return bool(t.handle.process.alive())

    def interrupt(self, t: TrialCopy) -> Interruption:
        copy: _Copy = t.handle
        proc, rec = copy.process, t.recorder
        if copy.periodic:
            copy.periodic.stop()  # no dump in flight when the fault lands
        fault_ev = self._deliver(t, copy)
        gone_ns = self._wait_gone(proc, timeout=t.fault_timeout_s)
        if gone_ns is None:
            raise TrialFailed(
                f"the workload survived {t.fault.kind}: pid {proc.pid} still running "
                f"{t.fault_timeout_s:.0f} s after the fault"
            )
        detected = rec.record(t.trial, t.arm, Ev.DETECTED, pid=proc.pid)
        t.row["detect_latency_ms"] = (detected.t_mono_ns - gone_ns) / 1e6
        t.row["fault_outcome"], stopped = _outcome(t.fault, rec, t.trial, t.arm, t.row)
        if t.row["fault_outcome"] == FINISHED_DURING_NOTICE:
            raise TrialFailed(
                f"the copy {FINISHED_DURING_NOTICE} ({t.fault.kind}, grace "
                f"{grace_of(t.fault)} s): no interruption to recover from"
            )
        return Interruption(fault_ev, detected, stopped)

    def bring_back(
        self, t: TrialCopy, cut: Interruption, step_at_fault: int | None, killed_at: int
    ) -> Comeback:
        copy: _Copy = t.handle
        rec, log = t.recorder, copy.process.log
        assert t.launched is not None
        started = rec.record(t.trial, t.arm, Ev.STARTED, slot=t.node)
        if copy.checkpointer is not None:
            point = copy.checkpointer.last_complete()
            if point is None:
                raise TrialFailed("no complete CRIU checkpoint before the fault")
            resume_step = held_step(log, point, t.regex)
            recoverable = checkpoint_started(rec, t.trial, point.index)
            t.row.update(recoverable_point="checkpoint", checkpoint_bytes=point.image_bytes)
            restore_attempted(t.row)
            copy.checkpointer.restore(self.cluster, t.node, point)
            restored = rec.events(t.trial, t.arm, Ev.RESTORED)[-1]  # CRIU's restore returned
            return Comeback(started, restored, recoverable, resume_step)
        app = t.plan.workload.app_checkpoint
        arm_ckpt = NoCheckpointer(
            rec, t.trial, app_checkpoint(t.plan, t.copy_dir), app.resume_args if app else []
        )
        kind = arm_ckpt.recoverable_point().kind
        resume_step, recoverable = 0, t.launched
        if kind == "app_checkpoint":
            resume_step = app_resume_step(t.plan, step_at_fault, log, killed_at)
            recoverable = progress_event(rec, t.trial, t.arm, resume_step)
        t.row["recoverable_point"] = kind
        new = arm_ckpt.restart(self.cluster, t.node, t.argv, tag=t.trial)
        restored = rec.record(t.trial, t.arm, Ev.RESTORED, pid=new.pid)  # the fresh process
        return Comeback(started, restored, recoverable, resume_step)

    def finish(self, t: TrialCopy) -> None:
        copy: _Copy | None = t.handle
        if copy is not None and copy.periodic:
            copy.periodic.stop()
        self.cluster.stop_all()

    def _wait_gone(self, proc: WorkloadProcess, timeout: float) -> int | None:
        """Monotonic ns when the process was first observed gone, polled every 2 ms."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                seen = time.monotonic_ns()
                self.cluster.wait_gone(proc, timeout=5)
                return seen
            time.sleep(0.002)
        return None

    def _deliver(self, t: TrialCopy, copy: _Copy) -> Event:
        """The fault; one with a notice tells the managed arm's checkpointer first."""
        rec, proc = t.recorder, copy.process
        kind = find_fault(LOCAL_FAULTS, t.fault.kind, "local")
        on_notice = None
        if grace_of(t.fault) is not None:
            if copy.checkpointer is None:
                t.row["notice_checkpoint"] = "none"
            on_notice = notice_checkpoint(copy.checkpointer, proc, rec, t.row)
        return kind.deliver_fault(self.cluster, proc, t.fault, rec, t.trial, on_notice)


def notice_checkpoint(
    criu: Checkpointer | None, proc: WorkloadProcess, rec: EventRecorder, row: RecoveryRow
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
    fault: Fault, rec: EventRecorder, trial: str, arm: str, row: RecoveryRow
) -> tuple[str, Event | None]:
    """How the fault ended the copy; after a notice, also when the copy stopped computing:
    its notice dump's start (a finished one froze it there), else when it was seen gone."""
    if grace_of(fault) is None:
        return "process gone", None
    gone = rec.events(trial, arm, Ev.WORK_STOPPED)[-1]
    if row.get("notice_checkpoint") == "finished":
        return gone.detail["how"], rec.events(trial, arm, Ev.CHECKPOINT_START)[-1]
    return gone.detail["how"], gone
