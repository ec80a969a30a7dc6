"""The local cluster: the plan's nodes are named slots on this machine.

Each workload copy starts from an argv list in its own PID namespace and session
(`unshare --pid --fork setsid ARGV`), so a CRIU restore never collides with a lingering
PID, with stdout and stderr appended to a log in the run folder. Every process the engine
starts or restores is tracked by pid and ended by pid when the run ends or fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tasks.errors import BlastRadiusError, CkptPocError
from tasks.interpreter import resolve_workload_argv, workload_env


class ProcessError(CkptPocError):
    """A workload process could not be started or found."""


@dataclass
class WorkloadProcess:
    """One running copy: the workload's own pid (host view), its slot, arm and log."""

    slot: str
    arm: str
    pid: int
    log: Path
    launcher: subprocess.Popen | None = None  # the `unshare` parent, when we started it

    def alive(self) -> bool:
        return pid_alive(self.pid)


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def child_pids(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            return [int(p) for p in fh.read().split()]
    except FileNotFoundError:
        return []


@dataclass
class LocalCluster:
    """Named slots on this machine; everything it starts is tracked and ended by pid."""

    nodes: list[str]
    run_dir: Path
    workdir: Path  # where workload commands run (their relative paths resolve here)
    tracked: dict[int, WorkloadProcess] = field(default_factory=dict)

    def _check_slot(self, slot: str) -> None:
        if slot not in self.nodes:
            raise BlastRadiusError(f"slot {slot!r} is not one of the plan's nodes {self.nodes}")

    def log_path(self, slot: str, arm: str, tag: str = "") -> Path:
        return self.run_dir / f"{slot}-{arm}{'-' + tag if tag else ''}.log"

    def start(
        self,
        slot: str,
        arm: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        timeout: float = 10.0,
        tag: str = "",
    ) -> WorkloadProcess:
        """Start ``argv`` in a new PID namespace and session on ``slot``; ``tag`` names
        its log apart from other copies of the same arm (one log per trial)."""
        self._check_slot(slot)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path(slot, arm, tag)
        with open(log, "ab") as out:  # append mode: CRIU restores it whatever it grew to
            launcher = subprocess.Popen(
                ["unshare", "--pid", "--fork", "setsid", *resolve_workload_argv(argv)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env={**workload_env(), **(env or {})},
                cwd=self.workdir,
            )
        deadline = time.monotonic() + timeout
        while not (kids := child_pids(launcher.pid)):
            if launcher.poll() is not None or time.monotonic() > deadline:
                launcher.kill()
                launcher.wait()
                raise ProcessError(f"could not start {argv[0]!r} on {slot}: see {log}")
            time.sleep(0.002)
        proc = WorkloadProcess(slot, arm, kids[0], log, launcher)
        self.tracked[proc.pid] = proc
        return proc

    def adopt(self, slot: str, arm: str, pid: int, tag: str = "") -> WorkloadProcess:
        """Track a process the engine did not fork (a CRIU restore re-parents to init)."""
        self._check_slot(slot)
        proc = WorkloadProcess(slot, arm, pid, self.log_path(slot, arm, tag))
        self.tracked[pid] = proc
        return proc

    def kill(self, proc: WorkloadProcess, sig: int = signal.SIGKILL) -> None:
        """Signal one of this run's own processes (and nothing else)."""
        if proc.pid not in self.tracked:
            raise BlastRadiusError(f"pid {proc.pid} is not a process this run started")
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)

    def wait_gone(self, proc: WorkloadProcess, timeout: float = 10.0) -> bool:
        """Wait until the process is gone; a gone process is no longer tracked (its pid may
        be reused by another process, which must never be signalled)."""
        deadline = time.monotonic() + timeout
        while proc.alive() and time.monotonic() < deadline:
            if proc.launcher is not None:
                proc.launcher.poll()  # reap our own child so it cannot linger as a zombie
            time.sleep(0.005)
        if proc.launcher is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.launcher.wait(timeout=max(0.0, deadline - time.monotonic()))
        gone = not proc.alive()
        if gone:
            self.tracked.pop(proc.pid, None)
        return gone

    def stop_all(self, timeout: float = 10.0) -> list[int]:
        """End every tracked process that is still alive, by pid (SIGKILL: a namespace's
        pid 1 ignores SIGTERM); return the pids still alive afterwards (empty: all gone)."""
        for proc in list(self.tracked.values()):
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        return [p.pid for p in list(self.tracked.values()) if not self.wait_gone(p, timeout)]
