"""The Slurm backend's faults, delivered only to this run's own jobs on the plan's node.

`scancel`; the node set DOWN while the job runs (Slurm ends it NODE_FAIL; the node
returns to service after the plan's `down_s`); SIGKILL of the job's batch step
(`scancel --batch --signal=KILL`); the time limit reached (the limit is cut to the next
whole minute of the job's run time; Slurm ends it TIMEOUT at its next limit check, up to
about 30 s later, with a SIGTERM that the job's wrapper records as it lands).
With a notice (the job submitted `--requeue --signal=B:USR1@N`, requeued under its id after
the fault): `preempt` (a real higher-priority job of the PoC's own in the plan's
``preemptor_partition``; Slurm's GraceTime between notice and kill), the time limit with a
warning (``warn_s``), `drain` (the node drained, the job told and requeued ``grace_s`` later).

What a trial must know of each kind is on its class: a longer wait for the copy to end, a
fault whose moment is the job's own record of the signal, what it does once the loss is seen.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Any, ClassVar

from tasks.data.errors import BlastRadiusError
from tasks.data.events import Ev
from tasks.data.plan import Fault
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.fault_kind import FaultKind, NoticeHandler, has_notice
from tasks.engine.clusters.slurm.cluster import SlurmCluster, SlurmError, SlurmJob

TIME_LIMIT_CHECK_S = 60  # slurmctld's limit check runs about every 30 s; twice that
# The notice a Slurm job with a notice is sent (its `--signal=B:USR1@N`, to the batch shell).
NOTICE_SIGNAL = "USR1"


class _SlurmFault(FaultKind[SlurmCluster, SlurmJob]):
    cluster = "slurm"

    def inject(
        self, cluster: SlurmCluster, job: SlurmJob, recorder: EventRecorder, trial_id: str
    ) -> Event:
        """Deliver the fault to one of this run's jobs (or to its plan node)."""
        cluster.check_job(job)
        detail = {"fault": self.kind, "job_id": job.job_id, "node": job.node}
        event = recorder.record(trial_id, job.arm, Ev.FAULT_INJECTED, **detail)
        self.deliver(cluster, job, trial_id)
        return event

    def deliver(self, cluster: SlurmCluster, job: SlurmJob, trial_id: str) -> None:
        raise NotImplementedError

    def deliver_fault(
        self,
        cluster: SlurmCluster,
        job: SlurmJob,
        fault: Fault,
        recorder: EventRecorder,
        trial_id: str,
        on_notice: NoticeHandler | None,
    ) -> Event:
        """With a notice, the managed arm is told by Slurm itself, inside the job (job.py)."""
        if has_notice(fault):
            return self.inject_notice(cluster, job, recorder, trial_id, fault)
        return self.inject(cluster, job, recorder, trial_id)

    def inject_notice(
        self,
        cluster: SlurmCluster,
        job: SlurmJob,
        recorder: EventRecorder,
        trial_id: str,
        fault: Fault,
    ) -> Event:
        raise BlastRadiusError(f"a {self.kind} fault has no notice (no grace_s or warn_s)")


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
            recorder.record(trial_id, job.arm, Ev.NODE_RETURNED, node=job.node, down_s=fault.down_s)


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

    kind, marker = "preempt", Ev.PREEMPTOR_SUBMITTED

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
                Ev.PREEMPTOR_CANCELLED,
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

    kind, marker = "drain", Ev.NODE_DRAINED
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
        recorder.record(trial_id, job.arm, Ev.NODE_RETURNED, node=job.node)


class TimeLimit(_SlurmFault):
    kind = "time-limit"
    detect_grace_s = TIME_LIMIT_CHECK_S  # Slurm checks time limits about every 30 s
    lands_when_signalled = True
    marker = Ev.TIME_LIMIT_SET

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
            recorder.record(trial_id, job.arm, Ev.REQUEUED_BY_HARNESS, state=state)
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
        return recorder.record(trial_id, job.arm, Ev.TIME_LIMIT_LAPSED, **detail, limit_min=minutes)


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


SLURM_FAULTS: tuple[FaultKind[Any, Any], ...] = (
    Scancel(),
    NodeDown(),
    KillStep(),
    TimeLimit(),
    Preempt(),
    Drain(),
)
