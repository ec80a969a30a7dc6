"""The local backend's faults: real signals to this run's own copies on this machine.

SIGKILL of the workload process, or of its whole process group; `sigterm-grace`, a kill
with a notice (the managed arm's checkpointer told, SIGTERM, SIGKILL after the plan's
`grace_s`). `fault_injected` is recorded immediately before the fault is delivered.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Any, ClassVar

from tasks.data.errors import BlastRadiusError
from tasks.data.events import Ev
from tasks.data.plan import Fault, grace_of
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.fault_kind import FINISHED_DURING_NOTICE, FaultKind, NoticeHandler
from tasks.engine.clusters.local.cluster import LocalCluster
from tasks.engine.clusters.process import WorkloadProcess

LOCAL_SIGNALS = {"sigkill": signal.SIGKILL, "sigkill-group": signal.SIGKILL}


def _own_copy(cluster: LocalCluster, proc: WorkloadProcess, group: bool) -> int:
    """The copy's process group, once it is sure the copy is this run's; else refused."""
    if proc.pid not in cluster.tracked or proc.slot not in cluster.nodes:
        raise BlastRadiusError(f"pid {proc.pid} on {proc.slot!r} is not this run's workload copy")
    pgid = os.getpgid(proc.pid)
    if group and pgid != proc.pid:
        # The copy runs as a session and group leader (setsid): its group is its own.
        raise BlastRadiusError(f"pid {proc.pid} does not lead its process group {pgid}")
    return pgid


class _LocalSignal(FaultKind[LocalCluster, WorkloadProcess]):
    cluster = "local"
    group: ClassVar[bool]

    def inject(
        self, cluster: LocalCluster, proc: WorkloadProcess, recorder: EventRecorder, trial_id: str
    ) -> Event:
        """SIGKILL the workload process, or its whole process group (its session's)."""
        pgid = _own_copy(cluster, proc, self.group)
        event = recorder.record(
            trial_id, proc.arm, Ev.FAULT_INJECTED, fault=self.kind, pid=proc.pid
        )
        if self.group:
            os.killpg(pgid, LOCAL_SIGNALS[self.kind])
        else:
            os.kill(proc.pid, LOCAL_SIGNALS[self.kind])
        return event


class Sigkill(_LocalSignal):
    kind, group = "sigkill", False


class SigkillGroup(_LocalSignal):
    kind, group = "sigkill-group", True


def _finished(proc: WorkloadProcess) -> bool:
    """The copy exited 0 of its own (its launcher, `unshare`, exits with its status)."""
    if proc.launcher is None:
        return False
    with contextlib.suppress(subprocess.TimeoutExpired):
        return proc.launcher.wait(timeout=5) == 0
    return False


class SigtermGrace(FaultKind[LocalCluster, WorkloadProcess]):
    """A kill with a notice: a Kubernetes pod deletion (SIGTERM, SIGKILL after
    terminationGracePeriodSeconds) or a spot reclaim. At the notice (`fault_injected`) the
    managed arm's checkpointer is told first (as a preStop hook runs before the SIGTERM);
    then SIGTERM to the copy, and SIGKILL to its whole group at the deadline. `work_stopped`
    records when the copy was seen gone and how. A copy is its PID namespace's init, which
    ignores SIGTERM unless it handles it (as a container's PID 1 without an init does): one
    that does not runs on to the SIGKILL."""

    kind, cluster = "sigterm-grace", "local"
    notice = True

    def inject(
        self, cluster: LocalCluster, proc: WorkloadProcess, recorder: EventRecorder, trial_id: str
    ) -> Event:
        raise BlastRadiusError(f"a {self.kind} fault needs its grace period: inject_with_notice")

    def deliver_fault(
        self,
        cluster: LocalCluster,
        proc: WorkloadProcess,
        fault: Fault,
        recorder: EventRecorder,
        trial_id: str,
        on_notice: NoticeHandler | None,
    ) -> Event:
        grace = grace_of(fault)
        assert grace is not None  # the plan requires it
        return self.inject_with_notice(cluster, proc, recorder, trial_id, grace, on_notice)

    def inject_with_notice(
        self,
        cluster: LocalCluster,
        proc: WorkloadProcess,
        recorder: EventRecorder,
        trial_id: str,
        grace_s: float,
        on_notice: NoticeHandler | None,
    ) -> Event:
        pgid = _own_copy(cluster, proc, group=True)
        event = recorder.record(
            trial_id, proc.arm, Ev.FAULT_INJECTED, fault=self.kind, pid=proc.pid, grace_s=grace_s
        )
        deadline = time.monotonic() + grace_s
        stopped = on_notice(deadline) if on_notice is not None else None
        how = "ended by its notice checkpoint" if stopped is not None else ""
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            recorder.record(trial_id, proc.arm, Ev.SIGTERM_SENT, pid=proc.pid)
            how = "exited on SIGTERM"
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.002)
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            recorder.record(trial_id, proc.arm, Ev.SIGKILL_SENT, pid=proc.pid, pgid=pgid)
            how = "killed at the deadline"
            cluster.wait_gone(proc, timeout=5)
        elif stopped is None and _finished(proc):
            how = FINISHED_DURING_NOTICE  # ran to its end inside the grace period
        recorder.record(trial_id, proc.arm, Ev.WORK_STOPPED, how=how or "ended", pid=proc.pid)
        return event


LOCAL_FAULTS: tuple[FaultKind[Any, Any], ...] = (Sigkill(), SigkillGroup(), SigtermGrace())
