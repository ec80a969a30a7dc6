"""`plan check` for a plan whose checkpointer moves GPU state (``checkpointer.gpu``): the
capability check (tasks/data/gpu_capability.py) run where the plan's nodes are — this
machine for a local plan — so a node without a GPU, with a driver older than the toggle
needs, or in MIG mode is a plan error naming the node and what was found. A Slurm plan's
nodes are not reached from the harness here: the GPU checkpointer runs the same check on
the node before every checkpoint and restore, and plan check says so."""

from __future__ import annotations

from typing import TYPE_CHECKING

import yaml

from tasks.data.gpu_capability import read_capability
from tasks.data.plan_yaml import file_line

if TYPE_CHECKING:
    from tasks.data.plan import Plan

FIELD = ("checkpointer", "gpu")


def gpu_plan_problems(path: str, root: yaml.Node | None, plan: Plan) -> tuple[list[str], list[str]]:
    """(problems, warnings) of ``checkpointer.gpu`` on the plan's nodes."""
    here = f"{file_line(path, root, FIELD)}: checkpointer.gpu"
    if plan.checkpointer.kind != "criu":
        return [f"{here}: GPU checkpoints are built for the criu checkpointer, not "
                f"{plan.checkpointer.kind}"], []  # fmt: skip
    if plan.cluster.kind != "local":
        return [], [
            f"{here}: the {plan.cluster.kind} nodes' GPUs are not checked from here; the "
            "capability check runs on each node before its first checkpoint"
        ]
    cap = read_capability()
    if cap.can_checkpoint:
        return [], []
    found = f"driver {cap.driver or 'none'}, {len(cap.gpus)} GPU(s)"
    nodes = ", ".join(plan.cluster.nodes)
    return [f"{here}: node(s) {nodes} (this machine; {found}): {p}" for p in cap.problems], []
