"""Real faults, delivered only to this PoC's own workload copies on the plan's nodes.

`fault_injected` is recorded immediately before the fault is delivered. Anything the run did
not start, or on a node the plan does not name, is refused (BlastRadiusError).

Local: SIGKILL of the workload process, or of its whole process group.
Slurm: `scancel`; the node set DOWN while the job runs (Slurm ends it NODE_FAIL; the node
returns to service after the plan's `down_s`); SIGKILL of the job's batch step
(`scancel --batch --signal=KILL`); the time limit reached (the limit is cut to the next
whole minute of the job's run time; Slurm ends it TIMEOUT at its next limit check, up to
about 30 s later, with a SIGTERM that the job's wrapper records as it lands).
"""

from __future__ import annotations

import math
import os
import signal
import time

from tasks.data.errors import BlastRadiusError
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.local import LocalCluster, WorkloadProcess
from tasks.engine.clusters.slurm import SlurmCluster, SlurmJob

LOCAL_SIGNALS = {"sigkill": signal.SIGKILL, "sigkill-group": signal.SIGKILL}
LOCAL_FAULTS = tuple(LOCAL_SIGNALS)
SLURM_FAULTS = ("scancel", "node-down", "kill-step", "time-limit")


def inject_local_fault(
    cluster: LocalCluster, proc: WorkloadProcess, kind: str, recorder: EventRecorder, trial_id: str
) -> Event:
    """SIGKILL the workload process, or its whole process group (its session's)."""
    if kind not in LOCAL_FAULTS:
        raise BlastRadiusError(f"fault {kind!r} is not a local fault ({', '.join(LOCAL_FAULTS)})")
    if proc.pid not in cluster.tracked or proc.slot not in cluster.nodes:
        raise BlastRadiusError(f"pid {proc.pid} on {proc.slot!r} is not this run's workload copy")
    pgid = os.getpgid(proc.pid)
    if kind == "sigkill-group" and pgid != proc.pid:
        # The copy runs as a session and group leader (setsid): its group is its own.
        raise BlastRadiusError(f"pid {proc.pid} does not lead its process group {pgid}")
    event = recorder.record(trial_id, proc.arm, "fault_injected", fault=kind, pid=proc.pid)
    if kind == "sigkill":
        os.kill(proc.pid, LOCAL_SIGNALS[kind])
    else:
        os.killpg(pgid, LOCAL_SIGNALS[kind])
    return event


def inject_slurm_fault(
    cluster: SlurmCluster, job: SlurmJob, kind: str, recorder: EventRecorder, trial_id: str
) -> Event:
    """Deliver one Slurm fault to one of this run's jobs (or to its plan node)."""
    if kind not in SLURM_FAULTS:
        raise BlastRadiusError(f"fault {kind!r} is not a Slurm fault ({', '.join(SLURM_FAULTS)})")
    cluster.check_job(job)
    detail = {"fault": kind, "job_id": job.job_id, "node": job.node}
    if kind == "time-limit":
        started = cluster.start_time_epoch(job)
        minutes = max(1, math.ceil((time.time() - started + 2) / 60))
        cluster.set_time_limit(job, minutes)
        # Slurm delivers this fault at its next limit check after the lapse. The job's
        # wrapper records the SIGTERM when it lands (`signalled`), and the trial takes that
        # as `fault_injected`; this event marks the lapse, and is the fallback.
        time.sleep(max(0.0, started + minutes * 60 - time.time()))
        return recorder.record(trial_id, job.arm, "time_limit_lapsed", **detail, limit_min=minutes)
    event = recorder.record(trial_id, job.arm, "fault_injected", **detail)
    if kind == "scancel":
        cluster.cancel(job)
    elif kind == "kill-step":
        cluster.cancel(job, signal="KILL", batch=True)
    else:
        cluster.node_down(job.node, reason=f"ckpt-poc fault {trial_id}")
    return event
