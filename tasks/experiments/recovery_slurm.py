"""A recovery trial on Slurm: the copy a batch job pinned to the plan's node, a real Slurm
fault, a new linked job that restores (managed) or resubmits (unmanaged) it."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tasks.data.errors import CkptPocError
from tasks.data.plan import Fault
from tasks.engine.checkpointers.criu import (
    CriuCheckpointer,
    CriuError,
)
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.slurm import ACTIVE_STATES, JobNeverStarted, SlurmCluster, SlurmError
from tasks.engine.clusters.slurm_copies import copy_spec
from tasks.engine.faults import fault_kind, inject_fault
from tasks.engine.paths import copy_argv, run_folder
from tasks.engine.preflight import PreflightResult, await_first_sign
from tasks.engine.probes import LogProgressProbe, last_step_before
from tasks.experiments.recovery_trial import (
    Moments,
    TrialFailed,
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
)
from tasks.experiments.timed_runs_slurm import wait_job_event

INCLUDES = (
    "detection+scheduling+restore+warmup (slurm: detection by squeue poll; scheduling is "
    "the old allocation's release, the recovery job's queueing and the node's return)"
)


def job_spec(
    setup: TrialSetup, trial: str, arm: str, copy_dir: Path, log: Path, **mode: Any
) -> dict[str, Any]:
    """A recovery copy's job: the managed arm checkpoints (timed_runs_slurm.copy_spec)."""
    checkpoint = arm == "managed"
    return copy_spec(setup.plan, trial, arm, copy_dir, checkpoint=checkpoint, log=str(log), **mode)


# How long the job's own record of Slurm's SIGTERM may take to appear once the job is seen
# ending: slurmctld marks the job before slurmd signals it; past KillWait the job is killed.
SIGNAL_RECORD_WAIT_S = 10


def _signal_delivery(rec: EventRecorder, events: Path, lapsed: Event, fault: str) -> Event:
    """`fault_injected` for a fault Slurm delivers itself (a time limit): when Slurm's
    SIGTERM reached the job (its wrapper recorded it), else the harness's marker (the lapse;
    a job killed without SIGTERM)."""
    landed = wait_job_event(
        rec, events, lapsed.trial_id, lapsed.arm, ("signalled",), lapsed, SIGNAL_RECORD_WAIT_S
    )
    return rec.alias(landed or lapsed, "fault_injected", fault=fault)


def run_slurm_trial(setup: TrialSetup, fault: Fault, arm: str, repeat: int) -> dict[str, Any]:
    """One trial on Slurm: the copy as a job, a real Slurm fault, a new linked job that
    restores (managed) or resubmits (unmanaged) it; failed with a reason, never raising."""
    plan, rec, cluster = setup.plan, setup.recorder, setup.cluster
    assert isinstance(cluster, SlurmCluster)
    node = plan.cluster.nodes[0]
    row = base_row(setup, fault.kind, arm, repeat, node, INCLUDES)
    trial = row["trial_id"]
    regex = plan.workload.progress_probe.log_regex
    copy_dir = run_folder(setup.ctx) / f"{trial}-{arm}"
    copy_dir.mkdir(parents=True, exist_ok=True)
    log = copy_dir / "workload.log"
    events = copy_dir / "job-events.jsonl"
    argv = copy_argv(plan.workload.command or [], copy_dir)
    gpus = plan.workload.gpus
    probe: LogProgressProbe | None = None
    try:
        launched = rec.record(trial, arm, "launch", node=node)
        spec = job_spec(setup, trial, arm, copy_dir, log, mode="run", argv=argv)
        job = cluster.submit(node, arm, spec, name=trial, log=log, gpus=gpus)
        row["job_id"] = job.job_id
        cluster.wait_started(job, setup.timeout_s)  # never: the stage ends, with Slurm's reason
        allocated = cluster.allocated_gpus(job)
        if gpus and allocated:
            row.update(gpus=allocated, gpus_from="allocation")
        probe = LogProgressProbe(log, regex, rec, trial, arm).start()
        if not probe.wait_for(lambda s: s.step >= setup.fault_step, setup.timeout_s):
            raise TrialFailed(f"the copy never reached step {setup.fault_step}")
        fault_type, fault_ev, detected = _fault_and_release(setup, row, fault, arm, job, events)
        rec.import_jsonl(events)
        killed_at = end_torn_line(log)
        step_at_fault = last_step_before(log, killed_at, regex)
        spec, resume_step, recoverable = _recovery_job(
            setup, row, arm, copy_dir, argv, (step_at_fault, killed_at), launched
        )
        new_job = cluster.submit(
            node, arm, spec, name=trial, log=log, gpus=gpus, linked_to=job.job_id
        )
        row["recovery_job_id"] = new_job.job_id
        rec.record(trial, arm, "recovery_submitted", job_id=new_job.job_id, recovers=job.job_id)
        now_running = cluster.wait_until(new_job, lambda s: s == "RUNNING", setup.timeout_s)
        if now_running is None:
            state, reason = cluster.observe(new_job)
            raise TrialFailed(
                f"recovery job {new_job.job_id} never started within {setup.timeout_s:.0f} s "
                f"(state {state}, reason {reason or 'none'})" + fault_type.never_back
            )
        if arm == "managed":
            restore_attempted(row)  # the recovery job's first act is the restore
        started, restored = back_in_new_job(setup, trial, arm, events, fault_ev, new_job)
        moments = Moments(
            fault_ev, detected, started, restored, recoverable, step_at_fault, resume_step
        )
        serve_and_measure(row, setup, probe, log, killed_at, moments)
    except JobNeverStarted:
        raise
    except (TrialFailed, CriuError, SlurmError, CkptPocError) as exc:
        fail_trial(row, rec, exc, log)
    finally:
        if probe:
            probe.stop()
        if row.get("job_id") and not row.get("fault_outcome"):
            # What accounting says ended the interrupted job (sacct lags: read it last).
            with contextlib.suppress(SlurmError):
                row["fault_outcome"] = cluster.final_state(cluster.tracked[row["job_id"]])
        left = cluster.stop_all()
        rec.import_jsonl(events)
        if left:
            rec.record(trial, arm, "left_running", job_ids=left)
    return row


def _fault_and_release(
    setup: TrialSetup, row: dict[str, Any], fault: Fault, arm: str, job: Any, events: Path
) -> tuple[Any, Event, Event]:
    """Inject the real fault into the copy's job, see it end, and wait until Slurm has
    released its allocation: the fault kind, its `fault_injected` and `detected` events."""
    rec, cluster, trial = setup.recorder, setup.cluster, row["trial_id"]
    assert isinstance(cluster, SlurmCluster)
    fault_type = fault_kind(fault.kind, cluster.kind)
    fault_ev = inject_fault(cluster, job, fault, rec, trial)
    # A fault Slurm delivers at its own next check (a time limit) gets the longer wait.
    grace = setup.fault_timeout_s + fault_type.detect_grace_s
    ended = cluster.wait_until(job, lambda s: s != "RUNNING", grace)
    if ended is None:
        raise TrialFailed(
            f"the workload survived {fault.kind}: job {job.job_id} still RUNNING "
            f"{grace:.0f} s after the fault"
        )
    detected = rec.record(trial, arm, "detected", job_id=job.job_id, state=ended.state)
    if fault_type.lands_when_signalled:
        fault_ev = _signal_delivery(rec, events, fault_ev, fault.kind)
    # The state changed somewhere between the two polls: that window bounds how late
    # the detection was observed.
    row["detect_latency_ms"] = (ended.t_mono_ns - ended.previous_poll_ns) / 1e6
    if fault_type.ends_before_its_kill:
        # Released on paper only: wait for the job's own record of its end, and before
        # the node returns (seen once: resumed at once, the node's kill came ~5 s late
        # and the copy ran and dumped on meanwhile).
        wait_job_event(
            rec, events, trial, arm, ("workload_exited",), fault_ev, SIGNAL_RECORD_WAIT_S
        )
    fault_type.settle(cluster, job, fault, rec, trial)  # node-down: the node away down_s
    # The old allocation must be released (its processes gone) before anything reads
    # what the copy logged or restarts it.
    released = cluster.wait_until(job, lambda s: s not in ACTIVE_STATES, setup.timeout_s)
    if released is None:
        raise TrialFailed(f"job {job.job_id} was not released within {setup.timeout_s} s")
    return fault_type, fault_ev, detected


def _recovery_job(
    setup: TrialSetup,
    row: dict[str, Any],
    arm: str,
    copy_dir: Path,
    argv: list[str],
    at_fault: tuple[int | None, int],  # the step logged by the fault, the log's bytes then
    launched: Event,
) -> tuple[dict[str, Any], int | None, Event]:
    """What the recovery job runs, the step it resumes at and the event its recoverable
    point began: the managed copy restores its last complete CRIU checkpoint; the unmanaged
    one resubmits, from its own checkpoint when it wrote one, else from the start."""
    plan, rec, trial = setup.plan, setup.recorder, row["trial_id"]
    log, regex = copy_dir / "workload.log", plan.workload.progress_probe.log_regex
    if arm == "managed":
        point = CriuCheckpointer.last_complete_under(copy_dir / "criu")
        if point is None:
            raise TrialFailed("no complete CRIU checkpoint before the fault")
        resume_step = held_step(log, point, regex)
        recoverable = checkpoint_started(rec, trial, point.index)
        row.update(recoverable_point="checkpoint", checkpoint_bytes=point.image_bytes)
        spec = job_spec(
            setup, trial, arm, copy_dir, log, mode="restore", restore_from=str(point.path)
        )
        return spec, resume_step, recoverable
    app = plan.workload.app_checkpoint
    app_path = app_checkpoint(plan, copy_dir)
    kind = "app_checkpoint" if app_path and app_path.exists() else "start"
    row["recoverable_point"] = kind
    if kind == "start":
        return job_spec(setup, trial, arm, copy_dir, log, mode="run", argv=argv), 0, launched
    resume_step = app_resume_step(plan, at_fault[0], log, at_fault[1])
    resume = [*argv, *(app.resume_args if app else [])]
    spec = job_spec(setup, trial, arm, copy_dir, log, mode="run", argv=resume)
    return spec, resume_step, progress_event(rec, trial, arm, resume_step)


def back_in_new_job(
    setup: TrialSetup, trial: str, arm: str, events: Path, fault_ev: Event, new_job: Any
) -> tuple[Event, Event]:
    """The recovery job's `started` and `restored` events, from its own record of them."""
    rec = setup.recorder
    # `started` is the job's own first moment on the node (its wrapper records it): the
    # squeue poll that saw it RUNNING may come after the restore has begun.
    job_started = wait_job_event(
        rec, events, trial, arm, ("job_started",), fault_ev, setup.timeout_s
    )
    if job_started is None:
        raise TrialFailed(f"recovery job {new_job.job_id} ran but never reported starting")
    started = rec.alias(job_started, "started", job_id=new_job.job_id)
    names = ("restored", "restore_failed") if arm == "managed" else ("workload_started",)
    restored = wait_job_event(rec, events, trial, arm, names, fault_ev, setup.timeout_s)
    if restored is None or restored.event == "restore_failed":
        tail = restored.detail.get("log_tail", "") if restored else ""
        raise TrialFailed(
            f"recovery job {new_job.job_id} did not bring the copy back: "
            + (tail.strip().splitlines()[-1] if tail.strip() else "no restore event")
        )
    if restored.event == "workload_started":  # the unmanaged copy's fresh process
        restored = rec.alias(restored, "restored", job_id=new_job.job_id)
    return started, restored


def preflight_slurm(setup: TrialSetup, timeout_s: float) -> PreflightResult:
    """The preflight as a Slurm job on the plan's first node (tasks/engine/preflight)."""
    cluster = setup.cluster
    assert isinstance(cluster, SlurmCluster)
    plan, node = setup.plan, setup.plan.cluster.nodes[0]
    copy_dir = run_folder(setup.ctx) / "preflight"
    copy_dir.mkdir(parents=True, exist_ok=True)
    log = copy_dir / "workload.log"
    argv = copy_argv(plan.workload.command or [], copy_dir)
    spec = job_spec(setup, "preflight", "unmanaged", copy_dir, log, mode="run", argv=argv)
    job = cluster.submit(
        node, "preflight", spec, name="preflight", log=log, gpus=plan.workload.gpus
    )
    try:
        return await_first_sign(
            plan,
            log,
            lambda: cluster.observe(job)[0] in ACTIVE_STATES,
            # A Slurm copy may wait in the queue first: the trial timeout covers that.
            max(timeout_s, setup.timeout_s),
            f"job {job.job_id}: {' '.join(argv)}",
            slice_s=0.5,
        )
    finally:
        cluster.stop_all()
