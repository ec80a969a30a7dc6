"""Slots on this machine for processes the harness runs itself (the local sweep, a Slurm
job's sweep on its node, the GPU check on a bare GPU node): the local backend's, reached
here without the registry's plan and backends (a bare node has neither pydantic nor YAML)."""

from __future__ import annotations

from pathlib import Path

from tasks.engine.clusters.local.cluster import LocalCluster
from tasks.engine.clusters.process import MachineSlots


def process_slots(
    nodes: list[str], run_dir: Path, workdir: Path, workload: str = ""
) -> MachineSlots:
    """Slots named ``nodes`` on this machine: the local backend's."""
    return LocalCluster(list(nodes), run_dir, workdir, workload=workload)
