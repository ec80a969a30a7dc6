"""The Slurm backend's entry in the registry: the plan's nodes are Slurm nodes, each copy a
batch job pinned to one."""

from __future__ import annotations

from tasks.engine.clusters.base import ClusterKind
from tasks.engine.clusters.slurm.cluster import node_host
from tasks.engine.clusters.slurm.copies import SlurmBackend
from tasks.engine.clusters.slurm.faults import SLURM_FAULTS

BACKEND = ClusterKind(
    "slurm",
    "Slurm",
    SlurmBackend.for_plan,
    nodes_are_this_machine=False,
    host_of=node_host,
    faults=SLURM_FAULTS,
)
