"""Real faults, delivered only to this PoC's own workload copies on the plan's nodes.

`fault_injected` is recorded immediately before the signal is sent. Anything the run did
not start, or on a slot the plan does not name, is refused (BlastRadiusError).
"""

from __future__ import annotations

import os
import signal

from tasks.clock import Event, EventRecorder
from tasks.clusters.local import LocalCluster, WorkloadProcess
from tasks.errors import BlastRadiusError

LOCAL_FAULTS = ("sigkill", "sigkill-group")


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
        os.kill(proc.pid, signal.SIGKILL)
    else:
        os.killpg(pgid, signal.SIGKILL)
    return event
