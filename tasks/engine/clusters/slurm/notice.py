"""Inside a Slurm job with a notice (tasks/engine/clusters/slurm/job.py): what the job does
when Slurm tells it of a coming kill, and what a requeued attempt of it resumes from.

The job was submitted `--requeue --signal=B:USR1@N` (the spec's ``notice``): USR1 reaches the
batch shell — this process — ahead of a preemption's kill (GraceTime), a time limit
(``warn_s``) or a drain's requeue. The managed copy dumps at once, within the spec's grace
(the dump is cut at the deadline: `missed`), and requeues its own job so that the next attempt
restores it; periodic checkpoints stop for it. The unmanaged copy only records the notice: it
runs on until Slurm (or the harness) ends the attempt.

A requeued attempt (the same job id, ``SLURM_RESTART_COUNT`` > 0) decides here what to run:
the managed copy restores its newest complete checkpoint (the notice dump when it finished,
else the last periodic one), the unmanaged copy resumes its application checkpoint when it
wrote one, else starts again. `resume_chosen` records which, with the log bytes the
checkpoint held, so the harness knows the step without reading a folder that may be pruned.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tasks.data.events import Ev
from tasks.engine.checkpointers.criu import CriuCheckpointer, CriuError
from tasks.engine.checkpointers.periodic import PeriodicCheckpoints
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.process import WorkloadProcess


def restarts() -> int:
    """How many times Slurm requeued this job (0: the first attempt)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0


# a dict: a job spec (slurmrestd's JSON), this one with the notice's signal
def resume_spec(spec: dict[str, Any], recorder: EventRecorder) -> dict[str, Any]:
    """The spec a requeued attempt runs: a restore, a resume from the application's own
    checkpoint, or the first attempt's run again."""
    trial, arm = spec["trial_id"], spec["arm"]
    requeued = spec["requeued"]
    if spec.get("checkpoint"):
        point = CriuCheckpointer.last_complete_under(Path(spec["ckpt_root"]))
        if point is not None:
            recorder.record(
                trial,
                arm,
                Ev.RESUME_CHOSEN,
                kind="checkpoint",
                index=point.index,
                held_log_bytes=point.held_log_bytes,
            )
            return {**spec, "mode": "restore", "restore_from": str(point.path)}
    app = requeued.get("app_checkpoint")
    if app and Path(app).exists():
        recorder.record(trial, arm, Ev.RESUME_CHOSEN, kind="app_checkpoint", path=app)
        return {**spec, "mode": "run", "argv": requeued["resume_argv"]}
    recorder.record(trial, arm, Ev.RESUME_CHOSEN, kind="start")
    return {**spec, "mode": "run"}


def requeue_own_job(recorder: EventRecorder, trial: str, arm: str) -> None:
    """``scontrol requeue`` of this job: Slurm ends this attempt and queues the next one."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    done = subprocess.run(
        ["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=30, check=False
    )
    recorder.record(
        trial,
        arm,
        Ev.REQUEUE_REQUESTED,
        job_id=job_id,
        rc=done.returncode,
        error=done.stderr.strip()[-300:],
    )


class NoticeCheckpoint:
    """The managed copy's answer to a notice, on a thread of its own (the signal handler
    only starts it): stop the periodic schedule, dump at once within ``grace_s`` (CRIU ends
    the copy once dumped), record `notice_checkpoint` (finished | missed, with its seconds),
    requeue the job."""

    def __init__(self, spec: dict[str, Any], recorder: EventRecorder) -> None:
        self.trial, self.arm = spec["trial_id"], spec["arm"]
        self.grace_s = float(spec["notice"]["grace_s"])
        self.recorder = recorder
        self.criu: CriuCheckpointer | None = None
        self.proc: WorkloadProcess | None = None
        self.periodic: PeriodicCheckpoints | None = None
        self.thread: threading.Thread | None = None

    def arm_for(
        self, criu: CriuCheckpointer, proc: WorkloadProcess, periodic: PeriodicCheckpoints
    ) -> None:
        self.criu, self.proc, self.periodic = criu, proc, periodic

    def notice(self, signal_name: str) -> None:
        """Called from the signal handler: record, and (managed) start the dump."""
        deadline = time.monotonic() + self.grace_s
        self.recorder.record(self.trial, self.arm, Ev.NOTICE, signal=signal_name)
        if self.criu is None or self.thread is not None:
            return
        self.thread = threading.Thread(
            target=self._checkpoint, args=(deadline,), name="notice", daemon=True
        )
        self.thread.start()

    def _checkpoint(self, deadline: float) -> None:
        assert self.criu is not None and self.proc is not None
        if self.periodic is not None:
            self.periodic.halt()  # a dump in flight finishes first (the checkpointer's lock)
        t0 = time.monotonic()
        try:
            point = self.criu.dump(
                self.proc, leave_running=False, timeout=max(0.001, deadline - t0)
            )
        except CriuError as exc:
            self.recorder.record(
                self.trial,
                self.arm,
                Ev.NOTICE_CHECKPOINT,
                outcome="missed",
                dump_s=time.monotonic() - t0,
                error=str(exc).splitlines()[0][:300] if str(exc) else "",
            )
        else:
            self.recorder.record(
                self.trial,
                self.arm,
                Ev.NOTICE_CHECKPOINT,
                outcome="finished",
                index=point.index,
                dump_s=point.dump_s,
            )
        requeue_own_job(self.recorder, self.trial, self.arm)

    def wait_for_the_kill(self, timeout: float = 60) -> None:
        """After the workload is gone by the notice dump: hold the allocation until Slurm's
        requeue ends this attempt (its SIGTERM), so the job never ends as if completed."""
        if self.thread is None:
            return
        self.thread.join(timeout)
        with contextlib.suppress(InterruptedError):
            time.sleep(timeout)
