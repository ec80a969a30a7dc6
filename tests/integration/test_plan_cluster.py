"""A Slurm plan's nodes and partition checked against the cluster with sinfo, when it answers.

The tests marked ``slurm`` run against the real single-node Slurm of scripts/slurm-up (node
``ckpt-node1`` in partition ``poc``); the others check that a missing, broken or silent sinfo
skips the check with a warning instead of failing the plan.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tasks.data.errors import PlanError
from tasks.data.plan import load_plan
from tests.unit.test_plan_cluster import _line_of, _slurm_plan, on_cluster, slurm_conf  # noqa: F401


@pytest.mark.slurm
def test_plan_with_the_clusters_node_loads_without_warnings(write_plan, on_cluster) -> None:
    plan = load_plan(_slurm_plan(write_plan, ["ckpt-node1"]))
    assert plan.cluster.nodes == ["ckpt-node1"]
    assert plan.check_warnings == ()


@pytest.mark.slurm
def test_unknown_node_is_a_plan_error_naming_node_line_and_sinfo(write_plan, on_cluster) -> None:
    path = _slurm_plan(write_plan, ["ckpt-node1", "ckpt-node9"])
    with pytest.raises(PlanError) as info:
        load_plan(path)
    line = _line_of(path, "  - ckpt-node9")
    assert info.value.problems == [
        f"{path}:{line}: cluster.nodes.1: node 'ckpt-node9' is not in this Slurm cluster "
        "(sinfo lists: ckpt-node1)"
    ]


@pytest.mark.slurm
def test_unknown_partition_is_a_plan_error(write_plan, on_cluster) -> None:
    path = _slurm_plan(write_plan, ["ckpt-node1"], queue="gpu-long")
    with pytest.raises(PlanError) as info:
        load_plan(path)
    line = _line_of(path, "  queue: gpu-long")
    assert info.value.problems == [
        f"{path}:{line}: cluster.queue: partition 'gpu-long' is not in this Slurm cluster "
        "(sinfo lists: poc, poc-urgent)"  # poc-urgent: the preempt fault's, hidden
    ]


@pytest.mark.slurm
def test_node_outside_the_plans_partition_is_a_plan_error(write_plan, on_cluster) -> None:
    # A real partition that holds no node (absent from `sinfo -N`, present in `sinfo -o %P`).
    env = {**os.environ, "SLURM_CONF": on_cluster}
    subprocess.run(["scontrol", "create", "PartitionName=empty-q"], env=env, check=True, timeout=30)
    try:
        path = _slurm_plan(write_plan, ["ckpt-node1"], queue="empty-q")
        with pytest.raises(PlanError) as info:
            load_plan(path)
    finally:
        subprocess.run(
            ["scontrol", "delete", "PartitionName=empty-q"], env=env, check=True, timeout=30
        )
    line = _line_of(path, "  - ckpt-node1")
    assert info.value.problems == [
        f"{path}:{line}: cluster.nodes.0: node 'ckpt-node1' is not in partition 'empty-q' "
        "(sinfo lists it in: poc, poc-urgent)"
    ]
