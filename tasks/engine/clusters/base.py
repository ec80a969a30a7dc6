"""What every cluster backend offers (`Cluster`) and what the registry knows of one
(`ClusterKind`).

A backend is one package here (local/, slurm/): its cluster class, its copies (a workload
copy started, followed and ended the same way on every backend), its faults' delivery, and
its entry (backend.py), listed once in registry.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from tasks.data.plan import Fault, Plan
from tasks.data.runctx import RunContext
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.copies import CopyEnd, CopyRequest, WorkloadCopy
from tasks.engine.clusters.fault_kind import FaultKind
from tasks.engine.clusters.trial import RecoverySteps
from tasks.engine.preflight import PreflightResult


class Cluster(Protocol):
    """Where this run's workload copies run: the plan's nodes only, everything it starts
    tracked, and everything still running ended by ``stop_all``."""

    kind: ClassVar[str]  # the plan's cluster.kind this backend runs
    nodes: list[str]
    run_dir: Path
    workdir: Path

    def start_copy(self, request: CopyRequest, recorder: EventRecorder) -> WorkloadCopy:
        """Start one copy on its plan node, opted in to the plan's checkpointer there when
        the request says so; it is running (a job: started) when this returns."""
        ...

    def copy_alive(self, copy: WorkloadCopy) -> bool:
        """Whether the copy still runs (raising what ended its checkpointing, if anything)."""
        ...

    def end_copy(self, copy: WorkloadCopy) -> CopyEnd:
        """The copy has ended or is to be left: stop its checkpointing, take in its records."""
        ...

    def copy_gpus(self, copy: WorkloadCopy) -> int | None:
        """The GPUs the copy was given (None: the backend allocates none)."""
        ...

    def preflight(
        self, ctx: RunContext, timeout_s: float, queue_timeout_s: float = 0
    ) -> PreflightResult:
        """Start the workload once on the plan's first node and see it work (a copy that
        may wait in a queue first gets ``queue_timeout_s`` for that too)."""
        ...

    def recovery_steps(self, fault: Fault) -> RecoverySteps:
        """This backend's steps of a recovery trial with ``fault`` (the skeleton is
        tasks/experiments/recovery_trial.run_trial)."""
        ...

    def stop_all(self) -> Sequence[int | str]:
        """End what this run still runs; what is still running afterwards (empty: none)."""
        ...

    def close(self) -> None:
        """The run is over: release what the backend itself holds (after ``stop_all``)."""
        ...


@dataclass(frozen=True)
class ClusterKind:
    kind: str
    label: str  # how messages name it ("a Slurm fault")
    build: Callable[[Plan, Path, Path], Cluster] | None  # (plan, run_dir, workdir); None: none here
    nodes_are_this_machine: bool  # every plan node is a slot on the machine the harness runs on
    # The host a plan node runs on, as the scheduler knows it (None: not known there), for
    # what must run on the node itself (a sampler) to know which node it is on.
    host_of: Callable[[str], str | None] = lambda _node: None
    faults: tuple[FaultKind[Any, Any], ...] = ()  # the plan's fault kinds it delivers
