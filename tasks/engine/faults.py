"""Real faults, delivered only to this PoC's own workload copies on the plan's nodes.

Each fault kind's delivery is one class in the faults module of the backend that runs it
(tasks/engine/clusters/local/faults.py, …/slurm/faults.py); this is where a trial hands a
fault to its cluster's backend. `fault_injected` is recorded immediately before the fault is
delivered; anything the run did not start, or on a node the plan does not name, is refused
(BlastRadiusError).
"""

from __future__ import annotations

from typing import Any

from tasks.data.plan import Fault
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.base import Cluster
from tasks.engine.clusters.fault_kind import NoticeHandler
from tasks.engine.clusters.registry import fault_kind


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
    return found.deliver_fault(cluster, target, fault, recorder, trial_id, on_notice)
