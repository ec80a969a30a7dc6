"""What a fault kind is to the backend that delivers it (each backend's faults.py).

The plan declares each kind once, with its fields (tasks/data/plan_faults.py); its delivery
is one class in the faults module of the backend that runs it, listed in that backend's
entry (its backend.py). A delivery is refused for anything the run did not start, or on a
node the plan does not name (BlastRadiusError).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from tasks.data.errors import BlastRadiusError
from tasks.data.plan import Fault, grace_of, warn_of
from tasks.engine.clock import Event, EventRecorder

C = TypeVar("C")  # the cluster the fault is delivered on
T = TypeVar("T")  # what it hits there: a process, a job

# Told of a coming kill ``grace_s`` ahead: the deadline (monotonic s) it must beat. The managed
# arm's checkpointer dumps there; what it returns is when the copy stopped computing (None: it
# did not stop it).
NoticeHandler = Callable[[float], Event | None]

# The outcome of a copy that ran to its end inside a notice: no interruption to recover from.
FINISHED_DURING_NOTICE = "finished its work during the notice"


def has_notice(fault: Fault) -> bool:
    """A fault the job is told of ahead of the kill: a grace period, or a warned limit."""
    return grace_of(fault) is not None or warn_of(fault) is not None


class FaultKind(Generic[C, T]):
    """One kind of fault on one kind of cluster."""

    kind: ClassVar[str]  # the plan's faults[].kind
    cluster: ClassVar[str]  # the plan's cluster.kind it applies to
    detect_grace_s: ClassVar[float] = 0.0  # longer than the trial's fault timeout to end it
    # Its moment is when the job's wrapper recorded the scheduler's signal (`signalled`),
    # not when the harness acted: `inject` returns a marker, the trial aliases the landing.
    lands_when_signalled: ClassVar[bool] = False
    never_back: ClassVar[str] = ""  # said when the recovery job never starts after it
    # The scheduler lists the job ended before its processes are stopped: the trial reads
    # the copy's log only once the job's wrapper recorded its workload gone.
    ends_before_its_kill: ClassVar[bool] = False

    def inject(self, cluster: C, target: T, recorder: EventRecorder, trial_id: str) -> Event:
        raise NotImplementedError

    def deliver_fault(
        self,
        cluster: C,
        target: T,
        fault: Fault,
        recorder: EventRecorder,
        trial_id: str,
        on_notice: NoticeHandler | None,
    ) -> Event:
        """The plan's fault, as its fields say (a kind with a notice overrides this)."""
        return self.inject(cluster, target, recorder, trial_id)

    def settle(
        self, cluster: C, target: T, fault: Fault, recorder: EventRecorder, trial_id: str
    ) -> None:
        """What the fault does once the loss is seen, before recovery starts (nothing)."""


def find_fault(faults: Sequence[FaultKind[Any, Any]], kind: str, label: str) -> FaultKind[Any, Any]:
    """The fault ``kind`` among a backend's ``faults``; any other is refused, naming the
    backend (``label``) and the kinds it has."""
    for found in faults:
        if found.kind == kind:
            return found
    names = ", ".join(f.kind for f in faults)
    raise BlastRadiusError(f"fault {kind!r} is not a {label} fault ({names})")
