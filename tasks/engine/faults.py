"""Real faults, delivered only to this PoC's own workload copies on the plan's nodes.

`fault_injected` is recorded immediately before the fault is delivered. Anything the run did
not start, or on a node the plan does not name, is refused (BlastRadiusError).

Local: SIGKILL of the workload process, or of its whole process group; `sigterm-grace`, a
kill with a notice (the managed arm's checkpointer told, SIGTERM, SIGKILL after the plan's
`grace_s`).
Slurm: `scancel`; the node set DOWN while the job runs (Slurm ends it NODE_FAIL; the node
returns to service after the plan's `down_s`); SIGKILL of the job's batch step
(`scancel --batch --signal=KILL`); the time limit reached (the limit is cut to the next
whole minute of the job's run time; Slurm ends it TIMEOUT at its next limit check, up to
about 30 s later, with a SIGTERM that the job's wrapper records as it lands).
With a notice (the job submitted `--requeue --signal=B:USR1@N`, requeued under its id after
the fault): `preempt` (a real higher-priority job of the PoC's own in the plan's
``preemptor_partition``; Slurm's GraceTime between notice and kill), the time limit with a
warning (``warn_s``), `drain` (the node drained, the job told and requeued ``grace_s`` later).

Each fault kind is one class below and one entry in `FAULTS`, keyed by the plan's
``faults[].kind``: how it is delivered, and what a trial must know of it (a longer wait
for the copy to end, a fault whose moment is the job's own record of the signal, what it
does once the loss is seen). tests/test_backends.py checks `FAULTS` against the plan's
FAULTS_BY_CLUSTER.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

from tasks.data.errors import BlastRadiusError
from tasks.data.plan import Fault, grace_of, warn_of
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.base import CLUSTER_KINDS, Cluster
from tasks.engine.clusters.local import LocalCluster, WorkloadProcess
from tasks.engine.clusters.slurm import SlurmCluster, SlurmError, SlurmJob

LOCAL_SIGNALS = {"sigkill": signal.SIGKILL, "sigkill-group": signal.SIGKILL}
TIME_LIMIT_CHECK_S = 60  # slurmctld's limit check runs about every 30 s; twice that
# The notice a Slurm job with a notice is sent (its `--signal=B:USR1@N`, to the batch shell).
NOTICE_SIGNAL = "USR1"

C = TypeVar("C")  # the cluster the fault is delivered on
T = TypeVar("T")  # what it hits there: a process, a job


class FaultKind(Generic[C, T]):
    """One kind of fault on one kind of cluster."""

    kind: ClassVar[str]  # the plan's faults[].kind
    cluster: ClassVar[str]  # the plan's cluster.kind it applies to
    detect_grace_s: ClassVar[float] = 0.0  # longer than the trial's fault timeout to end it
    # Its moment is when the job's wrapper recorded the scheduler's signal (`signalled`),
    # not when the harness acted: `inject` returns a marker, the trial aliases the landing.
    lands_when_signalled: ClassVar[bool] = False
    never_back: ClassVar[str] = ""  # said when the recovery job never starts after it
    # The scheduler lists the job ended before its processes are stopped: the trial reads
    # the copy's log only once the job's wrapper recorded its workload gone.
    ends_before_its_kill: ClassVar[bool] = False

    def inject(self, cluster: C, target: T, recorder: EventRecorder, trial_id: str) -> Event:
        raise NotImplementedError

    def settle(
        self, cluster: C, target: T, fault: Fault, recorder: EventRecorder, trial_id: str
    ) -> None:
        """What the fault does once the loss is seen, before recovery starts (nothing)."""


# --- local ---------------------------------------------------------------------------------------


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
        event = recorder.record(trial_id, proc.arm, "fault_injected", fault=self.kind, pid=proc.pid)
        if self.group:
            os.killpg(pgid, LOCAL_SIGNALS[self.kind])
        else:
            os.kill(proc.pid, LOCAL_SIGNALS[self.kind])
        return event


class Sigkill(_LocalSignal):
    kind, group = "sigkill", False


class SigkillGroup(_LocalSignal):
    kind, group = "sigkill-group", True


# Told of a coming kill ``grace_s`` ahead: the deadline (monotonic s) it must beat. The managed
# arm's checkpointer dumps there; what it returns is when the copy stopped computing (None: it
# did not stop it).
NoticeHandler = Callable[[float], Event | None]


FINISHED_DURING_NOTICE = "finished its work during the notice"


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
            trial_id, proc.arm, "fault_injected", fault=self.kind, pid=proc.pid, grace_s=grace_s
        )
        deadline = time.monotonic() + grace_s
        stopped = on_notice(deadline) if on_notice is not None else None
        how = "ended by its notice checkpoint" if stopped is not None else ""
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            recorder.record(trial_id, proc.arm, "sigterm_sent", pid=proc.pid)
            how = "exited on SIGTERM"
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.002)
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            recorder.record(trial_id, proc.arm, "sigkill_sent", pid=proc.pid, pgid=pgid)
            how = "killed at the deadline"
            cluster.wait_gone(proc, timeout=5)
        elif stopped is None and _finished(proc):
            how = FINISHED_DURING_NOTICE  # ran to its end inside the grace period
        recorder.record(trial_id, proc.arm, "work_stopped", how=how or "ended", pid=proc.pid)
        return event


# --- Slurm ---------------------------------------------------------------------------------------


class _SlurmFault(FaultKind[SlurmCluster, SlurmJob]):
    cluster = "slurm"

    def inject(
        self, cluster: SlurmCluster, job: SlurmJob, recorder: EventRecorder, trial_id: str
    ) -> Event:
        """Deliver the fault to one of this run's jobs (or to its plan node)."""
        cluster.check_job(job)
        detail = {"fault": self.kind, "job_id": job.job_id, "node": job.node}
        event = recorder.record(trial_id, job.arm, "fault_injected", **detail)
        self.deliver(cluster, job, trial_id)
        return event

    def deliver(self, cluster: SlurmCluster, job: SlurmJob, trial_id: str) -> None:
        raise NotImplementedError


class Scancel(_SlurmFault):
    kind = "scancel"

    def deliver(self, cluster: SlurmCluster, job: SlurmJob, trial_id: str) -> None:
        cluster.cancel(job)


class KillStep(_SlurmFault):
    kind = "kill-step"

    def deliver(self, cluster: SlurmCluster, job: SlurmJob, trial_id: str) -> None:
        cluster.cancel(job, signal="KILL", batch=True)


class NodeDown(_SlurmFault):
    kind = "node-down"
    never_back = " — the node never came back"
    # slurmctld ends the job NODE_FAIL (no COMPLETING) as it marks the node down; the
    # node's slurmd signals the job after that, and the copy logs on until then.
    ends_before_its_kill = True

    def deliver(self, cluster: SlurmCluster, job: SlurmJob, trial_id: str) -> None:
        cluster.node_down(job.node, reason=f"ckpt-poc fault {trial_id}")

    def settle(
        self,
        cluster: SlurmCluster,
        job: SlurmJob,
        fault: Fault,
        recorder: EventRecorder,
        trial_id: str,
    ) -> None:
        """The node stays away the plan's ``down_s`` (a reboot, a repair), then returns to
        service; with no ``down_s`` it never comes back within the trial."""
        if fault.down_s is not None:
            time.sleep(fault.down_s)
            cluster.node_resume(job.node)
            recorder.record(trial_id, job.arm, "node_returned", node=job.node, down_s=fault.down_s)


class _SlurmNotice(_SlurmFault):
    """A Slurm fault with a notice. The harness acts (``marker``, its own event); Slurm (or
    the harness, for a drain) tells the job (``B:USR1``: its wrapper records `notice`, which
    the trial takes as `fault_injected`), then ends the attempt and the job is requeued under
    its id; `settle` gives the node back once the attempt is gone."""

    marker: ClassVar[str]
    notice_wait_s: ClassVar[float] = 30.0  # from the act until the job has had its notice

    def notice_wait(self, fault: Fault) -> float:
        return self.notice_wait_s

    def inject(
        self, cluster: SlurmCluster, job: SlurmJob, recorder: EventRecorder, trial_id: str
    ) -> Event:
        raise BlastRadiusError(f"a {self.kind} fault needs its notice: inject_notice")

    def inject_notice(
        self,
        cluster: SlurmCluster,
        job: SlurmJob,
        recorder: EventRecorder,
        trial_id: str,
        fault: Fault,
    ) -> Event:
        cluster.check_job(job)
        detail = {"fault": self.kind, "job_id": job.job_id, "node": job.node}
        event = recorder.record(trial_id, job.arm, self.marker, **detail)
        self.act(cluster, job, fault, trial_id)
        return event

    def act(self, cluster: SlurmCluster, job: SlurmJob, fault: Fault, trial_id: str) -> None:
        raise NotImplementedError


class Preempt(_SlurmNotice):
    """A real higher-priority job (the PoC's own sleep, `--exclusive` on the job's node, in
    the plan's ``preemptor_partition``) preempts the copy: Slurm sends the job its notice
    signal, requeues it GraceTime later and starts the preemptor; `settle` cancels the
    preemptor once it runs, so the requeued job gets the node back."""

    kind, marker = "preempt", "preemptor_submitted"

    def act(self, cluster: SlurmCluster, job: SlurmJob, fault: Fault, trial_id: str) -> None:
        partition = fault.preemptor_partition
        assert partition is not None  # the plan requires it
        # Whatever else runs on the node would be preempted too: refused, named.
        others = [j for j in cluster.running_on(job.node) if j[0] != job.job_id]
        if others:
            named = ", ".join(f"{i} ({name}, {part})" for i, name, part in others)
            raise BlastRadiusError(
                f"a preemptor in {partition!r} on {job.node} would also preempt {named}"
            )
        cluster.submit_preemptor(job.node, partition, f"{trial_id}-{job.arm}")

    def settle(
        self,
        cluster: SlurmCluster,
        job: SlurmJob,
        fault: Fault,
        recorder: EventRecorder,
        trial_id: str,
    ) -> None:
        for pre in [j for j in cluster.tracked.values() if j.arm == "preemptor"]:
            running = cluster.wait_until(pre, lambda s: s == "RUNNING" or s is None, 60)
            with contextlib.suppress(SlurmError):
                cluster.cancel(pre)
            cluster.tracked.pop(pre.job_id, None)
            recorder.record(
                trial_id,
                job.arm,
                "preemptor_cancelled",
                job_id=pre.job_id,
                ran=bool(running and running.state == "RUNNING"),
            )


def _first_attempt(cluster: SlurmCluster, job: SlurmJob) -> bool:
    return cluster.job_fields(job).get("Restarts", "0") == "0"


class Drain(_SlurmNotice):
    """Maintenance: the node drained under the job (no new job starts there), the job told
    (USR1 to its batch shell, as a site's drain script would), requeued ``grace_s`` later
    if it still runs; `settle` resumes the node once the attempt has left it. The requeue
    waits on a thread of its own: the trial watches the job meanwhile (a copy that requeues
    itself sooner is seen leaving at once, not after the grace)."""

    kind, marker = "drain", "node_drained"
    notice_wait_s = 10.0

    def __init__(self) -> None:
        self._requeues: dict[str, tuple[threading.Thread, list[BaseException]]] = {}

    def act(self, cluster: SlurmCluster, job: SlurmJob, fault: Fault, trial_id: str) -> None:
        assert fault.grace_s is not None  # the plan requires it
        cluster.node_drain(job.node, reason=f"ckpt-poc fault {trial_id}")
        cluster.cancel(job, signal=NOTICE_SIGNAL, batch=True)
        errors: list[BaseException] = []
        thread = threading.Thread(
            target=self._requeue_after,
            args=(cluster, job, fault.grace_s, errors),
            name=f"drain-requeue-{job.job_id}",
            daemon=True,
        )
        self._requeues[job.job_id] = (thread, errors)
        thread.start()

    @staticmethod
    def _requeue_after(
        cluster: SlurmCluster, job: SlurmJob, grace_s: float, errors: list[BaseException]
    ) -> None:
        time.sleep(grace_s)

        def still_in_its_first_run() -> bool:
            # Not when the copy requeued itself within the grace (the managed arm, once
            # dumped), nor once the trial has ended the job.
            return cluster.observe(job)[0] == "RUNNING" and _first_attempt(cluster, job)

        try:
            if still_in_its_first_run():
                cluster.requeue(job)
        except SlurmError as exc:
            with contextlib.suppress(SlurmError):
                if still_in_its_first_run():
                    errors.append(exc)

    def settle(
        self,
        cluster: SlurmCluster,
        job: SlurmJob,
        fault: Fault,
        recorder: EventRecorder,
        trial_id: str,
    ) -> None:
        thread, errors = self._requeues.pop(job.job_id, (None, []))
        if thread is not None:
            thread.join()
        if errors:
            raise errors[0]
        cluster.wait_until(job, lambda s: s not in ("RUNNING", "COMPLETING"), 60)
        cluster.node_resume(job.node)
        recorder.record(trial_id, job.arm, "node_returned", node=job.node)


class TimeLimit(_SlurmFault):
    kind = "time-limit"
    detect_grace_s = TIME_LIMIT_CHECK_S  # Slurm checks time limits about every 30 s
    lands_when_signalled = True
    marker = "time_limit_set"

    def notice_wait(self, fault: Fault) -> float:
        """The warning lands ``warn_s`` before the (cut) limit, at Slurm's next check."""
        return 60.0 + TIME_LIMIT_CHECK_S + 2 * float(fault.warn_s or 0)

    def inject_notice(
        self,
        cluster: SlurmCluster,
        job: SlurmJob,
        recorder: EventRecorder,
        trial_id: str,
        fault: Fault,
    ) -> Event:
        """The warned limit (``warn_s``): cut to the first whole minute that leaves the job
        ``warn_s`` before it; Slurm's warning (the job's ``--signal=B:USR1@warn_s``) comes
        at its next check after limit − warn_s, the kill at the limit."""
        cluster.check_job(job)
        warn = float(fault.warn_s or 0)
        started = cluster.start_time_epoch(job)
        minutes = max(1, math.ceil((time.time() - started + warn + 2) / 60))
        event = recorder.record(
            trial_id,
            job.arm,
            self.marker,
            fault=self.kind,
            job_id=job.job_id,
            node=job.node,
            limit_min=minutes,
            warn_s=fault.warn_s,
        )
        cluster.set_time_limit(job, minutes)
        return event

    def settle(
        self,
        cluster: SlurmCluster,
        job: SlurmJob,
        fault: Fault,
        recorder: EventRecorder,
        trial_id: str,
    ) -> None:
        """A warned limit: the job back in the queue (a copy that did not requeue itself
        on the warning timed out: requeued now, before Slurm forgets it, as a chain's next
        job would be submitted), its limit as it was (none)."""
        if fault.warn_s is None:
            return
        ended = cluster.wait_until(job, lambda s: s not in ("RUNNING", "COMPLETING"), 60)
        if ended is not None and ended.state not in ("PENDING", "REQUEUED", "CONFIGURING"):
            state = ended.state or _accounted_end(cluster, job)  # read before the requeue
            cluster.requeue(job)
            recorder.record(trial_id, job.arm, "requeued_by_harness", state=state)
        cluster.set_time_limit(job, "UNLIMITED")

    def inject(
        self, cluster: SlurmCluster, job: SlurmJob, recorder: EventRecorder, trial_id: str
    ) -> Event:
        cluster.check_job(job)
        detail = {"fault": self.kind, "job_id": job.job_id, "node": job.node}
        started = cluster.start_time_epoch(job)
        minutes = max(1, math.ceil((time.time() - started + 2) / 60))
        cluster.set_time_limit(job, minutes)
        # Slurm delivers this fault at its next limit check after the lapse. The job's
        # wrapper records the SIGTERM when it lands (`signalled`), and the trial takes that
        # as `fault_injected`; this event marks the lapse, and is the fallback.
        time.sleep(max(0.0, started + minutes * 60 - time.time()))
        return recorder.record(trial_id, job.arm, "time_limit_lapsed", **detail, limit_min=minutes)


def _accounted_end(cluster: SlurmCluster, job: SlurmJob, timeout: float = 10) -> str:
    """How a job squeue no longer lists ended (TIMEOUT…), from accounting, which lags a few
    seconds behind: its latest attempt's state once that is no longer an active one."""
    deadline, state = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        states = cluster.attempt_states(job)
        state = states[-1] if states else ""
        if state and state not in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING"):
            break
        time.sleep(0.5)
    return state or "unknown"


# --- the registry --------------------------------------------------------------------------------

FAULTS: dict[str, FaultKind[Any, Any]] = {
    f.kind: f
    for f in (
        Sigkill(),
        SigkillGroup(),
        SigtermGrace(),
        Scancel(),
        NodeDown(),
        KillStep(),
        TimeLimit(),
        Preempt(),
        Drain(),
    )
}


def has_notice(fault: Fault) -> bool:
    """A fault the job is told of ahead of the kill: a grace period, or a warned limit."""
    return grace_of(fault) is not None or warn_of(fault) is not None


def faults_on(cluster_kind: str) -> tuple[str, ...]:
    """The fault kinds built for a cluster kind, in the registry's order."""
    return tuple(k for k, f in FAULTS.items() if f.cluster == cluster_kind)


def fault_kind(kind: str, cluster_kind: str) -> FaultKind[Any, Any]:
    """The fault ``kind`` on a ``cluster_kind`` cluster; any other is refused."""
    found = FAULTS.get(kind)
    if found is None or found.cluster != cluster_kind:
        label = CLUSTER_KINDS[cluster_kind].label
        raise BlastRadiusError(
            f"fault {kind!r} is not a {label} fault ({', '.join(faults_on(cluster_kind))})"
        )
    return found


def inject_fault(
    cluster: Cluster,
    target: Any,
    fault: Fault,
    recorder: EventRecorder,
    trial_id: str,
    on_notice: NoticeHandler | None = None,
) -> Event:
    """Deliver one fault to ``target`` (a process, a job) of this run's cluster; a fault
    with a notice tells ``on_notice`` first (its grace period is the plan's)."""
    found = fault_kind(fault.kind, cluster.kind)
    if isinstance(found, SigtermGrace):
        grace = grace_of(fault)
        assert grace is not None  # the plan requires it
        return found.inject_with_notice(cluster, target, recorder, trial_id, grace, on_notice)
    if isinstance(found, _SlurmNotice | TimeLimit) and has_notice(fault):
        # The managed arm is told by Slurm itself, inside the job (slurm_job.py).
        return found.inject_notice(cluster, target, recorder, trial_id, fault)
    return found.inject(cluster, target, recorder, trial_id)
