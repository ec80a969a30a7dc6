"""The local cluster: the plan's nodes are named slots on this machine.

Each workload copy starts from an argv list in its own PID namespace and session
(`unshare --pid --fork setsid ARGV`), so a CRIU restore never collides with a
lingering PID, with stdout and stderr appended to a log in the run folder. Every process the
engine starts or restores is tracked by pid and ended by pid when the run ends or fails.

When the harness itself dies (SIGKILL included), the run's reaper (tasks.engine.clusters.
reaper) ends the run's processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from tasks.data import env_markers
from tasks.data.errors import BlastRadiusError
from tasks.engine.clusters.process import WorkloadProcess
from tasks.engine.clusters.reaper import ProcessError, RunReaper, child_pids
from tasks.engine.interpreter import resolve_workload_argv, workload_env

if TYPE_CHECKING:  # pydantic loads only where a plan is read: a Slurm job's wrapper starts fast
    from tasks.data.plan import Plan

# No --kill-child (a parent-death signal on the workload): CRIU dumps and restores it, and a
# restored copy would then die as soon as `criu restore -d` exits. The reaper ends copies.
LAUNCHER = ["unshare", "--pid", "--fork", "setsid"]


@dataclass
class LocalCluster:
    """Named slots on this machine; everything it starts is tracked and ended by pid."""

    kind: ClassVar[str] = "local"
    nodes: list[str]
    run_dir: Path
    workdir: Path  # where workload commands run (their relative paths resolve here)
    tracked: dict[int, WorkloadProcess] = field(default_factory=dict)
    workload: str = ""  # the plan's workload name, for the samplers' attribution
    _reaper: RunReaper | None = field(default=None, init=False, repr=False)

    @classmethod
    def for_plan(cls, plan: Plan, run_dir: Path, workdir: Path) -> LocalCluster:
        return cls(list(plan.cluster.nodes), run_dir, workdir, workload=plan.workload.name)

    @property
    def reaper(self) -> RunReaper:
        """The run's reaper, started before the run's first process."""
        if self._reaper is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._reaper = RunReaper(self.run_dir / "reaper.log")
        return self._reaper

    def _check_slot(self, slot: str) -> None:
        if slot not in self.nodes:
            raise BlastRadiusError(f"slot {slot!r} is not one of the plan's nodes {self.nodes}")

    def labels(self, slot: str, arm: str, tag: str) -> dict[str, str]:
        """Environment that names the copy: the samplers read it from /proc/<pid>/environ to
        tie CPU and GPU use to the PoC job, and CRIU restores it with the process."""
        return {
            env_markers.NODE: slot,
            env_markers.ARM: arm,
            env_markers.JOB: f"{self.run_dir.name}/{slot}-{arm}{'-' + tag if tag else ''}",
            env_markers.TRIAL: tag,
            env_markers.WORKLOAD: self.workload,
        }

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
        reaper = self.reaper
        log = self.log_path(slot, arm, tag)
        with open(log, "ab") as out:  # append mode: CRIU restores it whatever it grew to
            launcher = reaper.spawn(
                [*LAUNCHER, *resolve_workload_argv(argv)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env={**workload_env(), **self.labels(slot, arm, tag), **(env or {})},
                cwd=self.workdir,
            )
        try:
            deadline = time.monotonic() + timeout
            while not (kids := child_pids(launcher.pid)):
                if launcher.poll() is not None or time.monotonic() > deadline:
                    raise ProcessError(f"could not start {argv[0]!r} on {slot}: see {log}")
                time.sleep(0.002)
            reaper.track(kids[0])
        except BaseException:
            for pid in [*child_pids(launcher.pid), launcher.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            launcher.wait()
            reaper.forget(launcher.pid)
            raise
        proc = WorkloadProcess(slot, arm, kids[0], log, launcher, reaper)
        self.tracked[proc.pid] = proc
        return proc

    def adopt(self, slot: str, arm: str, pid: int, tag: str = "") -> WorkloadProcess:
        """Track a process the engine did not fork (a CRIU restore re-parents to init)."""
        self._check_slot(slot)
        proc = WorkloadProcess(slot, arm, pid, self.log_path(slot, arm, tag), reaper=self.reaper)
        self.tracked[pid] = proc
        self.reaper.track(pid)
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
            if proc.reaper is not None:
                proc.reaper.forget(proc.pid)
                if proc.launcher is not None and proc.launcher.returncode is not None:
                    proc.reaper.forget(proc.launcher.pid)
        return gone

    def stop_all(self, timeout: float = 10.0) -> list[int]:
        """End every tracked process that is still alive, by pid (SIGKILL: a namespace's
        pid 1 ignores SIGTERM); return the pids still alive afterwards (empty: all gone)."""
        for proc in list(self.tracked.values()):
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        return [p.pid for p in list(self.tracked.values()) if not self.wait_gone(p, timeout)]

    def close(self) -> None:
        """The run is over: end the reaper (after ``stop_all``, it finds nothing to kill)."""
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None
