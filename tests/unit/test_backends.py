"""The backend registries agree with the plan's kinds: every cluster, checkpointer and fault
kind a plan may name has its entry, and what is built here is what the plan allows."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from tasks.data.errors import BlastRadiusError, CkptPocError
from tasks.data.plan import FAULTS_BY_CLUSTER, Checkpointer, Cluster, load_plan
from tasks.engine.checkpointers.base import CHECKPOINTERS, RUN_HERE
from tasks.engine.clusters.registry import CLUSTER_KINDS, FAULTS, cluster_for, fault_kind, faults_on

REPO = Path(__file__).resolve().parents[2]


def _literal(model: type, field: str) -> set[str]:
    return set(typing.get_args(model.model_fields[field].annotation))


def test_every_plan_kind_has_its_entry() -> None:
    assert set(CLUSTER_KINDS) == _literal(Cluster, "kind") == set(FAULTS_BY_CLUSTER)
    assert set(CHECKPOINTERS) == _literal(Checkpointer, "kind")
    assert RUN_HERE == ("criu",)


def test_the_faults_built_are_the_plans_faults_of_each_built_cluster() -> None:
    for kind, entry in CLUSTER_KINDS.items():
        built = faults_on(kind)
        if entry.build is None:
            assert built == (), kind  # contract only: its faults are the plan's, none built
        else:
            assert built == FAULTS_BY_CLUSTER[kind], kind
    assert all(f.kind == k for k, f in FAULTS.items())


def test_a_cluster_backend_is_its_kind_and_kubernetes_is_refused(tmp_path: Path) -> None:
    for name in ("demo", "slurm-example"):
        plan = load_plan(REPO / "plans" / f"{name}.yaml")
        cluster = cluster_for(plan, tmp_path / name, tmp_path)
        assert cluster.kind == plan.cluster.kind
        assert cluster.nodes == list(plan.cluster.nodes) and cluster.run_dir == tmp_path / name
        assert cluster.stop_all() == []
        cluster.close()
    k8s = load_plan(REPO / "plans" / "k8s-example.yaml")
    with pytest.raises(CkptPocError, match="no Kubernetes cluster backend"):
        cluster_for(k8s, tmp_path / "k8s")


def test_a_fault_of_another_cluster_is_refused() -> None:
    with pytest.raises(BlastRadiusError, match=r"not a Slurm fault \(scancel, node-down"):
        fault_kind("sigkill", "slurm")
    local = r"not a local fault \(sigkill, sigkill-group, sigterm-grace\)"
    with pytest.raises(BlastRadiusError, match=local):
        fault_kind("node-down", "local")
