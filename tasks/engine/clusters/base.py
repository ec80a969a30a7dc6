"""What every cluster backend offers, and the backends keyed by the plan's ``cluster.kind``.

A backend is a cluster class (local.py, slurm.py) and its copies (local_copies.py,
slurm_copies.py: a workload copy started, followed and ended the same way on both), plus one
`ClusterKind` entry in `CLUSTER_KINDS`. Kubernetes is in the plan's contract (its faults, the
Cedana steps) but no backend runs there yet: its entry has no class, and `cluster_for`
refuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.copies import CopyEnd, CopyRequest, WorkloadCopy
from tasks.engine.clusters.local_copies import LocalBackend
from tasks.engine.clusters.slurm import node_host
from tasks.engine.clusters.slurm_copies import SlurmBackend


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


CLUSTER_KINDS: dict[str, ClusterKind] = {
    "local": ClusterKind("local", "local", LocalBackend.for_plan, nodes_are_this_machine=True),
    "slurm": ClusterKind(
        "slurm", "Slurm", SlurmBackend.for_plan, nodes_are_this_machine=False, host_of=node_host
    ),
    "kubernetes": ClusterKind("kubernetes", "Kubernetes", None, nodes_are_this_machine=False),
}


def cluster_kind(plan: Plan) -> ClusterKind:
    return CLUSTER_KINDS[plan.cluster.kind]


def cluster_for(plan: Plan, run_dir: Path, workdir: Path | None = None) -> Cluster:
    """The plan's cluster backend for one run (its files under ``run_dir``; workload
    commands run in ``workdir``, default the current folder)."""
    entry = cluster_kind(plan)
    if entry.build is None:
        raise CkptPocError(f"no {entry.label} cluster backend is built here: it is contract only")
    return entry.build(plan, run_dir, workdir or Path.cwd())
