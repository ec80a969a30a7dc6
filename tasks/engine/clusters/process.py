"""One copy as a process on this machine, and what starts or adopts one there.

The local backend's slots are such a place, and so is the node a Slurm job's wrapper runs
on: the checkpointers dump, restore and restart a `WorkloadProcess` through any
`ProcessSlots` (tasks/engine/clusters/local/cluster.py's `LocalCluster` is the one built).
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from tasks.data.errors import CkptPocError
from tasks.engine.clusters.reaper import RunReaper, pid_alive


@dataclass
class WorkloadProcess:
    """One running copy: the workload's own pid (host view), its slot, arm and log."""

    slot: str
    arm: str
    pid: int
    log: Path
    launcher: subprocess.Popen | None = None  # the `unshare` parent, when we started it
    reaper: RunReaper | None = None  # what ends the copy (and its CRIU) if the harness dies

    def alive(self) -> bool:
        return pid_alive(self.pid)


class ProcessSlots(Protocol):
    """Named slots on this machine where a copy is started, or a restored one adopted."""

    @property
    def reaper(self) -> RunReaper: ...

    def start(
        self,
        slot: str,
        arm: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        timeout: float = 10.0,
        tag: str = "",
    ) -> WorkloadProcess: ...

    def adopt(self, slot: str, arm: str, pid: int, tag: str = "") -> WorkloadProcess: ...


@runtime_checkable
class MachineSlots(ProcessSlots, Protocol):
    """Process slots on the machine the harness runs on, whose processes it starts, signals
    and ends itself: the local backend's, and a Slurm job's own on its node."""

    nodes: list[str]
    run_dir: Path
    workdir: Path
    workload: str  # the plan's workload name, for the samplers' attribution

    def log_path(self, slot: str, arm: str, tag: str = "") -> Path: ...

    def kill(self, proc: WorkloadProcess, sig: int = signal.SIGKILL) -> None: ...

    def wait_gone(self, proc: WorkloadProcess, timeout: float = 10.0) -> bool: ...

    def stop_all(self, timeout: float = 10.0) -> list[int]: ...

    def close(self) -> None: ...


def slots_of(cluster: object) -> MachineSlots:
    """``cluster`` as process slots on this machine; a backend without them is refused."""
    if not isinstance(cluster, MachineSlots):
        raise CkptPocError(f"{type(cluster).__name__} has no process slots on this machine")
    return cluster
