"""A recovery trial's steps on Slurm: the copy a batch job pinned to the plan's node, a real
Slurm fault, a new linked job that restores (managed) or resubmits (unmanaged) it. A fault
with a notice (the job requeued under its id) is slurm/recovery_notice.py's."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tasks.data.arms import MANAGED
from tasks.data.events import Ev
from tasks.engine.checkpointers.criu import CriuCheckpointer
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.fault_kind import FaultKind, find_fault
from tasks.engine.clusters.slurm.cluster import ACTIVE_STATES, SlurmCluster, SlurmError, SlurmJob
from tasks.engine.clusters.slurm.faults import SLURM_FAULTS
from tasks.engine.clusters.slurm.spec import copy_spec, wait_job_event
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

INCLUDES = (
    "detection+scheduling+restore+warmup (slurm: detection by squeue poll; scheduling is "
    "the old allocation's release, the recovery job's queueing and the node's return)"
)

# How long the job's own record of Slurm's SIGTERM may take to appear once the job is seen
# ending: slurmctld marks the job before slurmd signals it; past KillWait the job is killed.
SIGNAL_RECORD_WAIT_S = 10


def job_spec(t: TrialCopy, **mode: Any) -> dict[str, Any]:  # a dict: a job spec (JSON)
    """A recovery copy's job: the managed arm checkpoints (copies.copy_spec)."""
    checkpoint = t.arm == MANAGED
    return copy_spec(
        t.plan, t.trial, t.arm, t.copy_dir, checkpoint=checkpoint, log=str(t.log), **mode
    )


def events_of(t: TrialCopy) -> Path:
    """The file the copy's jobs append their events to."""
    return t.copy_dir / "job-events.jsonl"


def slurm_fault(t: TrialCopy) -> FaultKind[SlurmCluster, SlurmJob]:
    return find_fault(SLURM_FAULTS, t.fault.kind, "Slurm")


class SlurmRecovery:
    """`RecoverySteps` on Slurm for a fault without a notice: the copy's job interrupted,
    its allocation released, a new job linked to it brings the copy back."""

    includes = INCLUDES
    alive_every_s = 1.0  # each ask is an squeue

    def __init__(self, cluster: SlurmCluster) -> None:
        self.cluster = cluster

    def log_path(self, t: TrialCopy) -> Path:
        return t.copy_dir / "workload.log"

    def submit(self, t: TrialCopy, spec: dict[str, Any], **options: Any) -> SlurmJob:
        """The copy's first job, started (one that never starts ends the stage, with
        Slurm's reason); its allocated GPUs on the row."""
        gpus = t.plan.workload.gpus
        job = self.cluster.submit(
            t.node, t.arm, spec, name=t.trial, log=t.log, gpus=gpus, **options
        )
        t.handle = job
        t.row["job_id"] = job.job_id
        self.cluster.wait_started(job, t.timeout_s)
        allocated = self.cluster.allocated_gpus(job)
        if gpus and allocated:
            t.row.update(gpus=allocated, gpus_from="allocation")
        return job

    def launch(self, t: TrialCopy) -> None:
        self.submit(t, job_spec(t, mode="run", argv=t.argv))

    def alive(self, t: TrialCopy) -> bool:
        return self.cluster.observe(t.handle)[0] in ACTIVE_STATES

    def interrupt(self, t: TrialCopy) -> Interruption:
        """Inject the real fault into the copy's job, see it end, and wait until Slurm has
        released its allocation."""
        rec, cluster, job, events = t.recorder, self.cluster, t.handle, events_of(t)
        fault_type = slurm_fault(t)
        fault_ev = fault_type.deliver_fault(cluster, job, t.fault, rec, t.trial, None)
        # A fault Slurm delivers at its own next check (a time limit) gets the longer wait.
        grace = t.fault_timeout_s + fault_type.detect_grace_s
        ended = cluster.wait_until(job, lambda s: s != "RUNNING", grace)
        if ended is None:
            raise TrialFailed(
                f"the workload survived {t.fault.kind}: job {job.job_id} still RUNNING "
                f"{grace:.0f} s after the fault"
            )
        detected = rec.record(t.trial, t.arm, Ev.DETECTED, job_id=job.job_id, state=ended.state)
        if fault_type.lands_when_signalled:
            fault_ev = _signal_delivery(rec, events, fault_ev, t.fault.kind)
        # The state changed somewhere between the two polls: that window bounds how late
        # the detection was observed.
        t.row["detect_latency_ms"] = (ended.t_mono_ns - ended.previous_poll_ns) / 1e6
        if fault_type.ends_before_its_kill:
            # Released on paper only: wait for the job's own record of its end, and before
            # the node returns (seen once: resumed at once, the node's kill came ~5 s late
            # and the copy ran and dumped on meanwhile).
            wait_job_event(
                rec, events, t.trial, t.arm, (Ev.WORKLOAD_EXITED,), fault_ev, SIGNAL_RECORD_WAIT_S
            )
        fault_type.settle(cluster, job, t.fault, rec, t.trial)  # node-down: away down_s
        # The old allocation must be released (its processes gone) before anything reads
        # what the copy logged or restarts it.
        released = cluster.wait_until(job, lambda s: s not in ACTIVE_STATES, t.timeout_s)
        if released is None:
            raise TrialFailed(f"job {job.job_id} was not released within {t.timeout_s} s")
        rec.import_jsonl(events)
        return Interruption(fault_ev, detected)

    def bring_back(
        self, t: TrialCopy, cut: Interruption, step_at_fault: int | None, killed_at: int
    ) -> Comeback:
        rec, cluster, job = t.recorder, self.cluster, t.handle
        spec, resume_step, recoverable = self._recovery_job(t, step_at_fault, killed_at)
        new_job = cluster.submit(
            t.node,
            t.arm,
            spec,
            name=t.trial,
            log=t.log,
            gpus=t.plan.workload.gpus,
            linked_to=job.job_id,
        )
        t.row["recovery_job_id"] = new_job.job_id
        rec.record(
            t.trial, t.arm, Ev.RECOVERY_SUBMITTED, job_id=new_job.job_id, recovers=job.job_id
        )
        now_running = cluster.wait_until(new_job, lambda s: s == "RUNNING", t.timeout_s)
        if now_running is None:
            state, reason = cluster.observe(new_job)
            raise TrialFailed(
                f"recovery job {new_job.job_id} never started within {t.timeout_s:.0f} s "
                f"(state {state}, reason {reason or 'none'})" + slurm_fault(t).never_back
            )
        if t.arm == MANAGED:
            restore_attempted(t.row)  # the recovery job's first act is the restore
        started, restored = back_in_new_job(t, new_job, cut.fault)
        return Comeback(started, restored, recoverable, resume_step or 0)

    def finish(self, t: TrialCopy) -> None:
        if t.row.get("job_id") and not t.row.get("fault_outcome"):
            # What accounting says ended the interrupted job (sacct lags: read it last).
            with contextlib.suppress(SlurmError):
                tracked = self.cluster.tracked[t.row["job_id"]]
                t.row["fault_outcome"] = self.cluster.final_state(tracked)
        stop_and_take_in(self.cluster, t)

    def _recovery_job(
        self, t: TrialCopy, step_at_fault: int | None, killed_at: int
    ) -> tuple[dict[str, Any], int | None, Event]:
        """What the recovery job runs, the step it resumes at and the event its recoverable
        point began: the managed copy restores its last complete CRIU checkpoint; the
        unmanaged one resubmits, from its own checkpoint when it wrote one, else from the
        start."""
        rec, plan = t.recorder, t.plan
        assert t.launched is not None
        if t.arm == MANAGED:
            point = CriuCheckpointer.last_complete_under(checkpoint_folder(t.plan, t.copy_dir))
            if point is None:
                raise TrialFailed("no complete CRIU checkpoint before the fault")
            resume_step = held_step(t.log, point, t.regex)
            recoverable = checkpoint_started(rec, t.trial, point.index)
            t.row.update(recoverable_point="checkpoint", checkpoint_bytes=point.image_bytes)
            spec = job_spec(t, mode="restore", restore_from=str(point.path))
            return spec, resume_step, recoverable
        app = plan.workload.app_checkpoint
        app_path = app_checkpoint(plan, t.copy_dir)
        kind = "app_checkpoint" if app_path and app_path.exists() else "start"
        t.row["recoverable_point"] = kind
        if kind == "start":
            return job_spec(t, mode="run", argv=t.argv), 0, t.launched
        resume_step = app_resume_step(plan, step_at_fault, t.log, killed_at)
        resume = [*t.argv, *(app.resume_args if app else [])]
        spec = job_spec(t, mode="run", argv=resume)
        return spec, resume_step, progress_event(rec, t.trial, t.arm, resume_step)


def _signal_delivery(rec: EventRecorder, events: Path, lapsed: Event, fault: str) -> Event:
    """`fault_injected` for a fault Slurm delivers itself (a time limit): when Slurm's
    SIGTERM reached the job (its wrapper recorded it), else the harness's marker (the lapse;
    a job killed without SIGTERM)."""
    landed = wait_job_event(
        rec, events, lapsed.trial_id, lapsed.arm, (Ev.SIGNALLED,), lapsed, SIGNAL_RECORD_WAIT_S
    )
    return rec.alias(landed or lapsed, Ev.FAULT_INJECTED, fault=fault)


def back_in_new_job(t: TrialCopy, new_job: SlurmJob, fault_ev: Event) -> tuple[Event, Event]:
    """The recovery job's `started` and `restored` events, from its own record of them."""
    rec, events = t.recorder, events_of(t)
    # `started` is the job's own first moment on the node (its wrapper records it): the
    # squeue poll that saw it RUNNING may come after the restore has begun.
    job_started = wait_job_event(
        rec, events, t.trial, t.arm, (Ev.JOB_STARTED,), fault_ev, t.timeout_s
    )
    if job_started is None:
        raise TrialFailed(f"recovery job {new_job.job_id} ran but never reported starting")
    started = rec.alias(job_started, Ev.STARTED, job_id=new_job.job_id)
    names = (Ev.RESTORED, Ev.RESTORE_FAILED) if t.arm == MANAGED else (Ev.WORKLOAD_STARTED,)
    restored = wait_job_event(rec, events, t.trial, t.arm, names, fault_ev, t.timeout_s)
    if restored is None or restored.event == Ev.RESTORE_FAILED:
        tail = restored.detail.get("log_tail", "") if restored else ""
        raise TrialFailed(
            f"recovery job {new_job.job_id} did not bring the copy back: "
            + (tail.strip().splitlines()[-1] if tail.strip() else "no restore event")
        )
    if restored.event == Ev.WORKLOAD_STARTED:  # the unmanaged copy's fresh process
        restored = rec.alias(restored, Ev.RESTORED, job_id=new_job.job_id)
    return started, restored


def stop_and_take_in(cluster: SlurmCluster, t: TrialCopy) -> None:
    """Cancel what the trial still runs and take in what its jobs recorded."""
    left = cluster.stop_all()
    t.recorder.import_jsonl(events_of(t))
    if left:
        t.recorder.record(t.trial, t.arm, Ev.LEFT_RUNNING, job_ids=left)
