"""`plan check` for a plan whose checkpointer moves GPU state (``checkpointer.gpu``): the
capability check (tasks/data/gpu_capability.py) run where the plan's nodes are — this
machine for a local plan — so a node without a GPU, with a driver older than the toggle
needs, or in MIG mode is a plan error naming the node and what was found. A Slurm plan's
nodes are not reached from the harness here: each job runs the same check on its node before
its first checkpoint and restore (a refusal is the job's recorded result), and plan check
says so."""

from __future__ import annotations

import yaml

from tasks.data.gpu_capability import read_capability
from tasks.data.plan_yaml import file_line

FIELD = ("checkpointer", "gpu")


def gpu_plan_problems(
    path: str, root: yaml.Node | None, checkpointer: str, cluster: str, nodes: list[str]
) -> tuple[list[str], list[str]]:
    """(problems, warnings) of ``checkpointer.gpu`` on the plan's ``nodes``."""
    here = f"{file_line(path, root, FIELD)}: checkpointer.gpu"
    if checkpointer != "criu":
        return [f"{here}: GPU checkpoints are built for the criu checkpointer, not "
                f"{checkpointer}"], []  # fmt: skip
    if cluster != "local":  # each job runs the capability check on its node
        return [], [
            f"{here}: the {cluster} nodes' GPUs are not checked from here; each job runs the "
            "capability check on its node before its first checkpoint and restore"
        ]
    cap = read_capability()
    if cap.can_checkpoint:
        return [], []
    found = f"driver {cap.driver or 'none'}, {len(cap.gpus)} GPU(s)"
    named = ", ".join(nodes)
    return [f"{here}: node(s) {named} (this machine; {found}): {p}" for p in cap.problems], []
