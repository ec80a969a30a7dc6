"""A recovery trial on Slurm with a notice: `preempt`, a warned `time-limit`, `drain`.

The copy's job is submitted `--requeue --signal=B:USR1@N`. The harness acts (a preemptor job,
a cut time limit, a drained node); Slurm or the harness tells the job (USR1: its wrapper
records `notice`, the trial's `fault_injected`, the same moment on both arms); the managed
copy dumps at once and requeues its own job, the unmanaged copy runs on until Slurm ends the
attempt. Either way the same job id comes back in a new allocation (tasks/engine/
slurm_notice.py): the managed copy restored from its newest complete checkpoint, the
unmanaged one from its application checkpoint or the start.

Beside the recovery clock, each row says whether the notice checkpoint beat the deadline
(`notice_checkpoint`: finished | missed | none, `notice_checkpoint_s`) and how long the
requeued job waited in the queue (`queued_s`: first seen back in the queue → its new attempt's
`job_started`), a part of `scheduling_s`. Work lost runs from the recoverable point to when the
copy stopped computing (its notice dump's start, or its end).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from tasks.data.errors import CkptPocError
from tasks.data.plan import Fault, grace_of, warn_of
from tasks.engine.checkpointers.criu import CriuError
from tasks.engine.clock import Event, span_s
from tasks.engine.clusters.slurm import JobNeverStarted, SlurmCluster, SlurmError, SlurmJob
from tasks.engine.faults import NOTICE_SIGNAL, fault_kind, has_notice, inject_fault
from tasks.engine.paths import copy_argv, run_folder
from tasks.engine.probes import LogProgressProbe, last_step_before
from tasks.experiments.recovery_slurm import (
    INCLUDES,
    back_in_new_job,
    job_spec,
    preflight_slurm,
    run_slurm_trial,
)
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
    progress_event,
    restore_attempted,
    serve_and_measure,
)
from tasks.experiments.timed_runs_slurm import wait_job_event

NOTICE_INCLUDES = (
    "detection+scheduling+restore+warmup (slurm, a fault with a notice: detection is the "
    "notice → the attempt seen ended (the grace it ran on in it); scheduling the requeued "
    "job's wait (queued_s) for the node"
)
# A job with no time limit never gets a time-limit warning: @N matters to a warned limit only.
DEFAULT_WARN_S = 60
STATES_BACK_IN_QUEUE = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD")


def _notice_s(fault: Fault) -> float:
    """The seconds from a fault's notice to its kill: its grace, or a time limit's warning."""
    grace = grace_of(fault)
    return grace if grace is not None else float(warn_of(fault) or 0)


def run_any_slurm_trial(setup: TrialSetup, fault: Fault, arm: str, repeat: int) -> dict:
    """A Slurm trial: with a notice here, else recovery_slurm's (a new linked job)."""
    if has_notice(fault):
        return run_slurm_notice_trial(setup, fault, arm, repeat)
    return run_slurm_trial(setup, fault, arm, repeat)


def _notice_spec(
    setup: TrialSetup, fault: Fault, trial: str, arm: str, copy_dir: Path, argv: list[str]
) -> dict[str, Any]:
    """The job's spec: the notice's grace (a warned limit: its warning) and what a
    requeued attempt resumes from when it is unmanaged."""
    plan, log = setup.plan, copy_dir / "workload.log"
    app = plan.workload.app_checkpoint
    app_path = app_checkpoint(plan, copy_dir)
    grace = _notice_s(fault)
    requeued = {
        "app_checkpoint": str(app_path) if app_path else None,
        "resume_argv": [*argv, *(app.resume_args if app else [])],
    }
    return job_spec(
        setup,
        trial,
        arm,
        copy_dir,
        log,
        mode="run",
        argv=argv,
        notice={"grace_s": grace},
        requeued=requeued,
    )


def run_slurm_notice_trial(
    setup: TrialSetup, fault: Fault, arm: str, repeat: int
) -> dict[str, Any]:
    """One trial of a Slurm fault with a notice; failed with a reason, never raising."""
    plan, rec, cluster = setup.plan, setup.recorder, setup.cluster
    assert isinstance(cluster, SlurmCluster)
    node = plan.cluster.nodes[0]
    row = base_row(setup, fault.kind, arm, repeat, node, NOTICE_INCLUDES)
    trial = row["trial_id"]
    regex = plan.workload.progress_probe.log_regex
    copy_dir = run_folder(setup.ctx) / f"{trial}-{arm}"
    copy_dir.mkdir(parents=True, exist_ok=True)
    log, events = copy_dir / "workload.log", copy_dir / "job-events.jsonl"
    argv = copy_argv(plan.workload.command or [], copy_dir)
    probe: LogProgressProbe | None = None
    job: SlurmJob | None = None
    try:
        launched = rec.record(trial, arm, "launch", node=node)
        spec = _notice_spec(setup, fault, trial, arm, copy_dir, argv)
        warn = warn_of(fault) or DEFAULT_WARN_S
        job = cluster.submit(
            node,
            arm,
            spec,
            name=trial,
            log=log,
            gpus=plan.workload.gpus,
            notice_signal=f"B:{NOTICE_SIGNAL}@{warn}",
        )
        row["job_id"] = row["recovery_job_id"] = job.job_id  # requeued: the same id
        cluster.wait_started(job, setup.timeout_s)  # never: the stage ends, with Slurm's reason
        allocated = cluster.allocated_gpus(job)
        if plan.workload.gpus and allocated:
            row.update(gpus=allocated, gpus_from="allocation")
        probe = LogProgressProbe(log, regex, rec, trial, arm).start()
        if not probe.wait_for(lambda s: s.step >= setup.fault_step, setup.timeout_s):
            raise TrialFailed(f"the copy never reached step {setup.fault_step}")
        fault_ev, detected, stopped = _notice_and_end(setup, row, fault, arm, job, events)
        killed_at = end_torn_line(log)
        step_at_fault = last_step_before(log, killed_at, regex)
        # Seen back in the queue before the node is given back (preemptor cancelled, drain
        # resumed), unless the harness is the one to requeue it (a timed-out copy).
        requeued = _back_in_queue(setup, job, trial, arm, detected, timeout=2)
        fault_kind(fault.kind, cluster.kind).settle(cluster, job, fault, rec, trial)
        requeued = requeued or _back_in_queue(setup, job, trial, arm, detected)
        started, restored = back_in_new_job(setup, trial, arm, events, fault_ev, job)
        row["queued_s"] = max(0.0, span_s(requeued, started))
        chosen = wait_job_event(
            rec, events, trial, arm, ("resume_chosen",), fault_ev, setup.timeout_s
        )
        if chosen is None:
            raise TrialFailed(f"the requeued job {job.job_id} never said what it resumed")
        resume_step, recoverable = _recoverable(
            setup, row, chosen, (step_at_fault, killed_at), launched
        )
        if chosen.detail["kind"] == "checkpoint":
            restore_attempted(row)
        moments = Moments(
            fault_ev, detected, started, restored, recoverable, step_at_fault, resume_step, stopped
        )
        serve_and_measure(row, setup, probe, log, killed_at, moments)
    except JobNeverStarted:
        raise
    except (TrialFailed, CriuError, SlurmError, CkptPocError) as exc:
        fail_trial(row, rec, exc, log)
    finally:
        if probe:
            probe.stop()
        if job is not None:
            with contextlib.suppress(SlurmError):
                row["fault_outcome"] = _fault_outcome(setup, job, trial, arm)
        left = cluster.stop_all()
        rec.import_jsonl(events)
        if left:
            rec.record(trial, arm, "left_running", job_ids=left)
    return row


def _notice_and_end(
    setup: TrialSetup, row: dict[str, Any], fault: Fault, arm: str, job: SlurmJob, events: Path
) -> tuple[Event, Event, Event]:
    """Deliver the fault; `fault_injected` (the notice landing in the job), `detected` (the
    attempt seen ended) and when the copy stopped computing. Fills the notice columns."""
    rec, cluster, trial = setup.recorder, setup.cluster, row["trial_id"]
    assert isinstance(cluster, SlurmCluster)
    fault_type = fault_kind(fault.kind, cluster.kind)
    marker = inject_fault(cluster, job, fault, rec, trial)
    notice = wait_job_event(
        rec, events, trial, arm, ("notice",), marker, fault_type.notice_wait(fault)
    )
    if notice is None:
        raise TrialFailed(f"job {job.job_id} was never told of the {fault.kind} (no notice)")
    fault_ev = rec.alias(notice, "fault_injected", fault=fault.kind)
    # Slurm ends the attempt at its deadline (GraceTime, the limit), the harness's requeue,
    # or the managed copy's own requeue once dumped.
    grace = _notice_s(fault)
    wait = setup.fault_timeout_s + grace + fault_type.detect_grace_s + 30
    ended = cluster.wait_until(job, lambda s: s != "RUNNING", wait)
    if ended is None:
        raise TrialFailed(f"job {job.job_id} still RUNNING {wait:.0f} s after its notice")
    detected = rec.record(trial, arm, "detected", job_id=job.job_id, state=ended.state)
    row["detect_latency_ms"] = (ended.t_mono_ns - ended.previous_poll_ns) / 1e6
    gone = wait_job_event(rec, events, trial, arm, ("workload_exited",), fault_ev, wait)
    if gone is None:
        raise TrialFailed(f"job {job.job_id}'s workload never reported its end")
    stopped = _notice_columns(setup, row, arm, events, fault_ev, gone)
    return fault_ev, detected, stopped


def _notice_columns(
    setup: TrialSetup, row: dict[str, Any], arm: str, events: Path, fault_ev: Event, gone: Event
) -> Event:
    """notice_checkpoint (finished | missed | none) and its seconds; returns when the copy
    stopped computing: its notice dump's start when that finished (CRIU froze it there),
    else when the workload was gone."""
    rec, trial = setup.recorder, row["trial_id"]
    if arm != "managed":
        row["notice_checkpoint"] = "none"
        return gone
    rec.import_jsonl(events)
    told = [e for e in rec.events(trial, arm, "notice_checkpoint") if span_s(fault_ev, e) >= 0]
    if not told:
        # Killed before its dump was over (the kill came first): a missed deadline.
        row.update(notice_checkpoint="missed", notice_checkpoint_s=span_s(fault_ev, gone))
        return gone
    outcome = told[0].detail
    row.update(notice_checkpoint=outcome["outcome"], notice_checkpoint_s=outcome["dump_s"])
    if outcome["outcome"] == "finished":
        return checkpoint_started(rec, trial, int(outcome["index"]))
    return gone


def _back_in_queue(
    setup: TrialSetup,
    job: SlurmJob,
    trial: str,
    arm: str,
    detected: Event,
    timeout: float | None = None,
) -> Event | None:
    """`requeued`: the job first seen waiting in the queue again (else when its end was
    seen: it ran again before a poll saw it wait). With ``timeout``: None when not yet."""
    cluster = setup.cluster
    assert isinstance(cluster, SlurmCluster)
    seen = cluster.wait_until(
        job, lambda s: s in STATES_BACK_IN_QUEUE or s == "RUNNING", timeout or setup.timeout_s
    )
    if seen is None and timeout is not None:
        return None
    if seen is None:
        state, reason = cluster.observe(job)
        raise TrialFailed(f"job {job.job_id} was not requeued (state {state}, reason {reason})")
    if seen.state == "RUNNING":
        return setup.recorder.alias(detected, "requeued", job_id=job.job_id)
    return setup.recorder.record(trial, arm, "requeued", job_id=job.job_id, state=seen.state)


def _recoverable(
    setup: TrialSetup,
    row: dict[str, Any],
    chosen: Event,
    at_fault: tuple[int | None, int],  # the step logged by the fault, the log's bytes then
    launched: Event,
) -> tuple[int, Event]:
    """The step the requeued attempt resumes at and when that state was the workload's."""
    plan, rec, trial, arm = setup.plan, setup.recorder, row["trial_id"], row["arm"]
    kind = chosen.detail["kind"]
    row["recoverable_point"] = kind
    log = run_folder(setup.ctx) / f"{trial}-{arm}" / "workload.log"
    if kind == "checkpoint":
        held = int(chosen.detail.get("held_log_bytes") or 0)
        step = last_step_before(log, held, plan.workload.progress_probe.log_regex) or 0
        return step, checkpoint_started(rec, trial, int(chosen.detail["index"]))
    if kind == "app_checkpoint":
        step = app_resume_step(plan, at_fault[0], log, at_fault[1])
        return step, progress_event(rec, trial, arm, step)
    return 0, launched


def _fault_outcome(setup: TrialSetup, job: SlurmJob, trial: str, arm: str) -> str:
    """The first attempt's end in accounting (PREEMPTED, REQUEUED…), or, for a copy the
    harness requeued, the state it saw first (TIMEOUT): accounting rewrites a requeued
    attempt's state to REQUEUED."""
    by_harness = setup.recorder.events(trial, arm, "requeued_by_harness")
    if by_harness:
        return str(by_harness[-1].detail["state"])
    assert isinstance(setup.cluster, SlurmCluster)
    return _first_attempt_state(setup.cluster, job)


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


SLURM_TRIALS = TrialRunner(run_any_slurm_trial, preflight_slurm, INCLUDES)
