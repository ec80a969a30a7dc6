"""What every cluster backend offers, and the backends keyed by the plan's ``cluster.kind``.

A backend is one module beside this one (local.py, slurm.py) whose cluster class has what
`Cluster` names, plus one `ClusterKind` entry in `CLUSTER_KINDS`. Kubernetes is in the plan's
contract (its faults, the Cedana steps) but no backend runs there yet: its entry has no
class, and `cluster_for` refuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan
from tasks.engine.clusters.local import LocalCluster
from tasks.engine.clusters.slurm import SlurmCluster, node_host


class Cluster(Protocol):
    """Where this run's workload copies run: the plan's nodes only, everything it starts
    tracked, and everything still running ended by ``stop_all``."""

    kind: ClassVar[str]  # the plan's cluster.kind this backend runs
    nodes: list[str]
    run_dir: Path
    workdir: Path

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
    "local": ClusterKind("local", "local", LocalCluster.for_plan, nodes_are_this_machine=True),
    "slurm": ClusterKind(
        "slurm", "Slurm", SlurmCluster.for_plan, nodes_are_this_machine=False, host_of=node_host
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
