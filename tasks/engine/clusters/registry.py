"""The backends, keyed by the plan's ``cluster.kind``, and the fault kinds they deliver.

Adding a backend is its package (local/ and slurm/ are the pattern) and one line in
`CLUSTER_KINDS`. Kubernetes is in the plan's contract (its faults, the Cedana steps) but no
backend runs there yet: its entry has no class, and `cluster_for` refuses it.
tests/unit/test_backends.py checks this registry against the plan's kinds both ways.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan
from tasks.engine.clusters.base import Cluster, ClusterKind
from tasks.engine.clusters.fault_kind import FaultKind, find_fault
from tasks.engine.clusters.local.backend import BACKEND as LOCAL
from tasks.engine.clusters.machine import process_slots  # noqa: F401 (re-exported)
from tasks.engine.clusters.slurm.backend import BACKEND as SLURM

KUBERNETES = ClusterKind("kubernetes", "Kubernetes", None, nodes_are_this_machine=False)

CLUSTER_KINDS: dict[str, ClusterKind] = {b.kind: b for b in (LOCAL, SLURM, KUBERNETES)}

# The cluster kinds a backend is built for: every stage runs on each of them.
BUILT_KINDS = tuple(kind for kind, entry in CLUSTER_KINDS.items() if entry.build is not None)

# Every fault kind a built backend delivers, by the plan's faults[].kind.
FAULTS: dict[str, FaultKind[Any, Any]] = {
    f.kind: f for entry in CLUSTER_KINDS.values() for f in entry.faults
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


def faults_on(cluster_kind: str) -> tuple[str, ...]:
    """The fault kinds built for a cluster kind, in its backend's order."""
    return tuple(f.kind for f in CLUSTER_KINDS[cluster_kind].faults)


def fault_kind(kind: str, cluster_kind: str) -> FaultKind[Any, Any]:
    """The fault ``kind`` on a ``cluster_kind`` cluster; any other is refused."""
    entry = CLUSTER_KINDS[cluster_kind]
    return find_fault(entry.faults, kind, entry.label)
