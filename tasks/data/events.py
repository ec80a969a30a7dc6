"""Every event name, declared once: what the harness, the checkpointers and a Slurm job's
wrapper record (tasks/engine/clock.py) and what the clocks, the chains and the stages match
on. The `events` dataset allows exactly ``ALL_EVENTS`` in its `event` column.

Plain strings, not an Enum: an event name is written to the journal and the dataset as it
is, and the journal's writer takes the fast path only for an exact ``str``.
"""

from __future__ import annotations

from typing import Final


class Ev:
    """The event names, by who records them."""

    # A copy of the workload and its trial (the harness)
    LAUNCH: Final = "launch"  # a copy launched (or, on Slurm, its job seen started)
    STARTED: Final = "started"  # a copy (again) holds its resources: recovery's start
    PROGRESS: Final = "progress"  # a workload step seen in its log
    READY: Final = "ready"  # the ready probe said ready: cold start's stop
    READY_FAILED: Final = "ready_failed"  # the ready probe never said ready
    SERVING_AGAIN: Final = "serving_again"  # the first new step after a fault: recovery's stop
    EXITED: Final = "exited"  # the copy ended of its own
    STOPPED_BY_HARNESS: Final = "stopped_by_harness"
    LEFT_RUNNING: Final = "left_running"  # copies still running when the trial ended
    STALE_CHECKPOINTS_REMOVED: Final = "stale_checkpoints_removed"
    THREAD_FAILED: Final = "thread_failed"  # a probe's or the periodic checkpointer's thread
    TRIAL_STEP: Final = "trial_step"  # one step of a recovery trial, with its status
    TRIAL_FAILED: Final = "trial_failed"
    RUN_FAILED: Final = "run_failed"  # a timed run (overhead, cold start) failed
    START_FAILED: Final = "start_failed"  # a cold start never became ready
    DEADLINE_SWEEP_FAILED: Final = "deadline_sweep_failed"

    # Faults and the way back
    FAULT_INJECTED: Final = "fault_injected"  # recovery's start
    DETECTED: Final = "detected"  # the harness saw the copy gone
    WORK_STOPPED: Final = "work_stopped"  # a local copy's process ended after its fault
    SIGTERM_SENT: Final = "sigterm_sent"
    SIGKILL_SENT: Final = "sigkill_sent"
    NOTICE: Final = "notice"  # the job had its notice signal (Slurm's word of a coming kill)
    NOTICE_CHECKPOINT: Final = "notice_checkpoint"  # the dump on the notice, and its outcome
    PREEMPTOR_SUBMITTED: Final = "preemptor_submitted"
    PREEMPTOR_CANCELLED: Final = "preemptor_cancelled"
    NODE_DRAINED: Final = "node_drained"
    NODE_RETURNED: Final = "node_returned"
    TIME_LIMIT_SET: Final = "time_limit_set"
    TIME_LIMIT_LAPSED: Final = "time_limit_lapsed"
    REQUEUE_REQUESTED: Final = "requeue_requested"  # the job asked Slurm to requeue it
    REQUEUED: Final = "requeued"
    REQUEUED_BY_HARNESS: Final = "requeued_by_harness"
    RECOVERY_SUBMITTED: Final = "recovery_submitted"  # a new job submitted to recover
    RESUME_CHOSEN: Final = "resume_chosen"  # a requeued attempt: restore, resume or rerun
    RESTART_START: Final = "restart_start"  # the unmanaged arm's restart (no checkpointer)
    RESTARTED: Final = "restarted"
    RESTORED: Final = "restored"  # the copy runs again (CRIU's restore, or a fresh process)

    # The checkpointer
    CHECKPOINT_START: Final = "checkpoint_start"
    CHECKPOINT_END: Final = "checkpoint_end"
    CHECKPOINT_FAILED: Final = "checkpoint_failed"
    CHECKPOINT_SKIPPED: Final = "checkpoint_skipped"  # periodic ticks due while a dump ran
    RESTORE_START: Final = "restore_start"
    RESTORE_FAILED: Final = "restore_failed"
    FILES_PUT_BACK: Final = "files_put_back"  # files a restore needs, put back first
    GPU_PHASES: Final = "gpu_phases"  # the GPU toggle's phases of a dump or a restore
    GPU_RECOVERY: Final = "gpu_recovery"
    DUMP_REQUESTED: Final = "dump_requested"  # a Slurm job's wrapper asked for a dump
    DUMP_FAILED: Final = "dump_failed"

    # A Slurm job's wrapper, on the node
    MANAGED_JOB: Final = "managed_job"  # the managed wrapper ran, opted in or not
    RESTORE_REFUSED: Final = "restore_refused"  # a restore in a job not opted in
    NODE_FINGERPRINT: Final = "node_fingerprint"
    PAGE_CACHE: Final = "page_cache"  # the page cache dropped (or not) before a start
    JOB_STARTED: Final = "job_started"
    SIGNALLED: Final = "signalled"
    WORKLOAD_STARTED: Final = "workload_started"
    WORKLOAD_EXITED: Final = "workload_exited"

    # Install, opt-in and the way out (tasks/exit/install.py: `<what>_step`)
    INSTALL_STEP: Final = "install_step"
    UNINSTALL_STEP: Final = "uninstall_step"
    INSTALL_SKIPPED: Final = "install_skipped"
    INSTALLED: Final = "installed"
    OPTED_IN: Final = "opted_in"
    UNINSTALLED: Final = "uninstalled"


# Every event name, in the order declared above: the `events` dataset's allowed values.
ALL_EVENTS: tuple[str, ...] = tuple(v for k, v in vars(Ev).items() if k.isupper())
