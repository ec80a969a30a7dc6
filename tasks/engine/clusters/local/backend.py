"""The local backend's entry in the registry: every plan node a slot on this machine."""

from __future__ import annotations

from tasks.engine.clusters.base import ClusterKind
from tasks.engine.clusters.local.copies import LocalBackend
from tasks.engine.clusters.local.faults import LOCAL_FAULTS

BACKEND = ClusterKind(
    "local", "local", LocalBackend.for_plan, nodes_are_this_machine=True, faults=LOCAL_FAULTS
)
