"""A recovery trial's steps on Slurm with a notice: `preempt`, a warned `time-limit`, `drain`.

The copy's job is submitted `--requeue --signal=B:USR1@N`. The harness acts (a preemptor job,
a cut time limit, a drained node); Slurm or the harness tells the job (USR1: its wrapper
records `notice`, the trial's `fault_injected`, the same moment on both arms); the managed
copy dumps at once and requeues its own job, the unmanaged copy runs on until Slurm ends the
attempt. Either way the same job id comes back in a new allocation (slurm/notice.py): the
managed copy restored from its newest complete checkpoint, the unmanaged one from its
application checkpoint or the start.

Beside the recovery clock, each row says whether the notice checkpoint beat the deadline
(`notice_checkpoint`: finished | missed | none, `notice_checkpoint_s`) and how long the
requeued job waited in the queue (`queued_s`: first seen back in the queue → its new attempt's
`job_started`), a part of `scheduling_s`. Work lost runs from the recoverable point to when the
copy stopped computing (its notice dump's start, or its end).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from tasks.data.arms import MANAGED
from tasks.data.events import Ev
from tasks.data.plan import Fault, grace_of, warn_of
from tasks.engine.clock import Event, span_s
from tasks.engine.clusters.slurm.cluster import SlurmCluster, SlurmError, SlurmJob
from tasks.engine.clusters.slurm.faults import NOTICE_SIGNAL
from tasks.engine.clusters.slurm.recovery import (
    SlurmRecovery,
    back_in_new_job,
    events_of,
    job_spec,
    slurm_fault,
    stop_and_take_in,
)
from tasks.engine.clusters.slurm.spec import wait_job_event
from tasks.engine.clusters.trial import (
    Comeback,
    Interruption,
    TrialCopy,
    TrialFailed,
    app_checkpoint,
    app_resume_step,
    checkpoint_started,
    progress_event,
    restore_attempted,
)
from tasks.engine.probes import last_step_before

NOTICE_INCLUDES = (
    "detection+scheduling+restore+warmup (slurm, a fault with a notice: detection is the "
    "notice → the attempt seen ended (the grace it ran on in it); scheduling the requeued "
    "job's wait (queued_s) for the node"
)
# A job with no time limit never gets a time-limit warning: @N matters to a warned limit only.
DEFAULT_WARN_S = 60
STATES_BACK_IN_QUEUE = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD")


def notice_s(fault: Fault) -> float:
    """The seconds from a fault's notice to its kill: its grace, or a time limit's warning."""
    grace = grace_of(fault)
    return grace if grace is not None else float(warn_of(fault) or 0)


class SlurmNoticeRecovery(SlurmRecovery):
    """`RecoverySteps` on Slurm for a fault with a notice: the same job, requeued."""

    includes = NOTICE_INCLUDES

    def launch(self, t: TrialCopy) -> None:
        warn = warn_of(t.fault) or DEFAULT_WARN_S
        job = self.submit(t, _notice_spec(t), notice_signal=f"B:{NOTICE_SIGNAL}@{warn}")
        t.row["recovery_job_id"] = job.job_id  # requeued: the same id

    def interrupt(self, t: TrialCopy) -> Interruption:
        """Deliver the fault; `fault_injected` (the notice landing in the job), `detected`
        (the attempt seen ended) and when the copy stopped computing. Fills the notice
        columns."""
        rec, cluster, job, events = t.recorder, self.cluster, t.handle, events_of(t)
        fault_type = slurm_fault(t)
        marker = fault_type.deliver_fault(cluster, job, t.fault, rec, t.trial, None)
        notice = wait_job_event(
            rec, events, t.trial, t.arm, (Ev.NOTICE,), marker, fault_type.notice_wait(t.fault)
        )
        if notice is None:
            raise TrialFailed(f"job {job.job_id} was never told of the {t.fault.kind} (no notice)")
        fault_ev = rec.alias(notice, Ev.FAULT_INJECTED, fault=t.fault.kind)
        # Slurm ends the attempt at its deadline (GraceTime, the limit), the harness's
        # requeue, or the managed copy's own requeue once dumped.
        wait = t.fault_timeout_s + notice_s(t.fault) + fault_type.detect_grace_s + 30
        ended = cluster.wait_until(job, lambda s: s != "RUNNING", wait)
        if ended is None:
            raise TrialFailed(f"job {job.job_id} still RUNNING {wait:.0f} s after its notice")
        detected = rec.record(t.trial, t.arm, Ev.DETECTED, job_id=job.job_id, state=ended.state)
        t.row["detect_latency_ms"] = (ended.t_mono_ns - ended.previous_poll_ns) / 1e6
        gone = wait_job_event(rec, events, t.trial, t.arm, (Ev.WORKLOAD_EXITED,), fault_ev, wait)
        if gone is None:
            raise TrialFailed(f"job {job.job_id}'s workload never reported its end")
        stopped = _notice_columns(t, fault_ev, gone)
        return Interruption(fault_ev, detected, stopped)

    def bring_back(
        self, t: TrialCopy, cut: Interruption, step_at_fault: int | None, killed_at: int
    ) -> Comeback:
        rec, job, events = t.recorder, t.handle, events_of(t)
        # Seen back in the queue before the node is given back (preemptor cancelled, drain
        # resumed), unless the harness is the one to requeue it (a timed-out copy).
        requeued = self._back_in_queue(t, cut.detected, timeout=2)
        slurm_fault(t).settle(self.cluster, job, t.fault, rec, t.trial)
        requeued = requeued or self._back_in_queue(t, cut.detected)
        started, restored = back_in_new_job(t, job, cut.fault)
        t.row["queued_s"] = max(0.0, span_s(requeued, started))
        chosen = wait_job_event(
            rec, events, t.trial, t.arm, (Ev.RESUME_CHOSEN,), cut.fault, t.timeout_s
        )
        if chosen is None:
            raise TrialFailed(f"the requeued job {job.job_id} never said what it resumed")
        resume_step, recoverable = _recoverable(t, chosen, step_at_fault, killed_at)
        if chosen.detail["kind"] == "checkpoint":
            restore_attempted(t.row)
        return Comeback(started, restored, recoverable, resume_step)

    def finish(self, t: TrialCopy) -> None:
        if t.handle is not None:
            with contextlib.suppress(SlurmError):
                t.row["fault_outcome"] = _fault_outcome(self.cluster, t)
        stop_and_take_in(self.cluster, t)

    def _back_in_queue(
        self, t: TrialCopy, detected: Event, timeout: float | None = None
    ) -> Event | None:
        """`requeued`: the job first seen waiting in the queue again (else when its end was
        seen: it ran again before a poll saw it wait). With ``timeout``: None when not yet."""
        cluster, job = self.cluster, t.handle
        seen = cluster.wait_until(
            job, lambda s: s in STATES_BACK_IN_QUEUE or s == "RUNNING", timeout or t.timeout_s
        )
        if seen is None and timeout is not None:
            return None
        if seen is None:
            state, reason = cluster.observe(job)
            raise TrialFailed(f"job {job.job_id} was not requeued (state {state}, reason {reason})")
        if seen.state == "RUNNING":
            return t.recorder.alias(detected, Ev.REQUEUED, job_id=job.job_id)
        return t.recorder.record(t.trial, t.arm, Ev.REQUEUED, job_id=job.job_id, state=seen.state)


def _notice_spec(t: TrialCopy) -> dict[str, Any]:  # a dict: a job spec (JSON)
    """The job's spec: the notice's grace (a warned limit: its warning) and what a
    requeued attempt resumes from when it is unmanaged."""
    app = t.plan.workload.app_checkpoint
    app_path = app_checkpoint(t.plan, t.copy_dir)
    requeued = {
        "app_checkpoint": str(app_path) if app_path else None,
        "resume_argv": [*t.argv, *(app.resume_args if app else [])],
    }
    return job_spec(
        t,
        mode="run",
        argv=t.argv,
        notice={"grace_s": notice_s(t.fault)},
        requeued=requeued,
    )


def _notice_columns(t: TrialCopy, fault_ev: Event, gone: Event) -> Event:
    """notice_checkpoint (finished | missed | none) and its seconds; returns when the copy
    stopped computing: its notice dump's start when that finished (CRIU froze it there),
    else when the workload was gone."""
    rec, row = t.recorder, t.row
    if t.arm != MANAGED:
        row["notice_checkpoint"] = "none"
        return gone
    rec.import_jsonl(events_of(t))
    told = [e for e in rec.events(t.trial, t.arm, Ev.NOTICE_CHECKPOINT) if span_s(fault_ev, e) >= 0]
    if not told:
        # Killed before its dump was over (the kill came first): a missed deadline.
        row.update(notice_checkpoint="missed", notice_checkpoint_s=span_s(fault_ev, gone))
        return gone
    outcome = told[0].detail
    row.update(notice_checkpoint=outcome["outcome"], notice_checkpoint_s=outcome["dump_s"])
    if outcome["outcome"] == "finished":
        return checkpoint_started(rec, t.trial, int(outcome["index"]))
    return gone


def _recoverable(
    t: TrialCopy, chosen: Event, step_at_fault: int | None, killed_at: int
) -> tuple[int, Event]:
    """The step the requeued attempt resumes at and when that state was the workload's."""
    rec = t.recorder
    assert t.launched is not None
    kind = chosen.detail["kind"]
    t.row["recoverable_point"] = kind
    if kind == "checkpoint":
        held = int(chosen.detail.get("held_log_bytes") or 0)
        step = last_step_before(t.log, held, t.regex) or 0
        return step, checkpoint_started(rec, t.trial, int(chosen.detail["index"]))
    if kind == "app_checkpoint":
        step = app_resume_step(t.plan, step_at_fault, t.log, killed_at)
        return step, progress_event(rec, t.trial, t.arm, step)
    return 0, t.launched


def _fault_outcome(cluster: SlurmCluster, t: TrialCopy) -> str:
    """The first attempt's end in accounting (PREEMPTED, REQUEUED…), or, for a copy the
    harness requeued, the state it saw first (TIMEOUT): accounting rewrites a requeued
    attempt's state to REQUEUED."""
    by_harness = t.recorder.events(t.trial, t.arm, Ev.REQUEUED_BY_HARNESS)
    if by_harness:
        return str(by_harness[-1].detail["state"])
    return _first_attempt_state(cluster, t.handle)


def _first_attempt_state(cluster: SlurmCluster, job: SlurmJob, timeout: float = 10) -> str:
    """The interrupted attempt's state in accounting (sacct lags a few seconds)."""
    deadline = time.monotonic() + timeout
    states: list[str] = []
    while time.monotonic() < deadline:
        states = cluster.attempt_states(job)
        if len(states) > 1:
            return states[0]
        time.sleep(0.5)
    return states[0] if states else ""
