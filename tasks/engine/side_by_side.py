"""The embedded default engine: one workload, a managed and an unmanaged copy, one clock.

`run_side_by_side` starts the plan's workload twice on the local cluster's slots — the
managed copy checkpointed by CRIU at the plan's interval, the unmanaged copy beside it with
nothing but its own application checkpoints — follows both with the same probes, and
records every moment as an event. The recovery, overhead and cold-start experiments build
on it.

However the run ends, it leaves nothing running and its record behind: the cluster's reaper
ends the copies (restored ones too) if the harness is killed, every event is journalled to
`<run folder>/events.jsonl` as it happens, checkpoint folders a killed run left are removed
by the next run, and an exception in a worker thread (a probe, the checkpoint schedule)
fails the run with that exception.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.data.arms import ARMS
from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext
from tasks.engine.checkpointers.base import Checkpointer, ensure_runs_on, managed_checkpointer
from tasks.engine.checkpointers.criu import clean_dead_roots
from tasks.engine.checkpointers.periodic import PeriodicCheckpoints
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.local import LocalCluster, WorkloadProcess
from tasks.engine.paths import copy_argv, run_folder
from tasks.engine.probes import LogProgressProbe, wait_ready

LOCAL_ONLY = ("local",)  # the copies are LocalCluster processes, side by side on its slots


class SurfacingProbe(LogProgressProbe):
    """The progress probe, plus what ended its thread if it raised: kept in ``failure`` and
    raised by ``check()`` in the run's own thread (with the worker's traceback), so the run
    fails with it instead of going on blind."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failure: BaseException | None = None

    def _run(self) -> None:
        try:
            super()._run()
        except BaseException as exc:
            self.failure = exc
            with contextlib.suppress(Exception):
                self._recorder.record(
                    self._trial, self.arm, "thread_failed", thread="probe", error=repr(exc)[:2000]
                )

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure


class WorkerThreads:
    """The run's worker threads; ``check()`` raises the first exception that ended one."""

    def __init__(self) -> None:
        self.periodic: PeriodicCheckpoints | None = None
        self.probes: list[SurfacingProbe] = []

    def check(self) -> None:
        for probe in self.probes:
            probe.check()
        if self.periodic is not None:
            self.periodic.check()

    def alive_and_well(self, proc: WorkloadProcess) -> Callable[[], bool]:
        """``proc.alive``, raising first if a worker died (for loops that poll ``alive``)."""

        def alive() -> bool:
            self.check()
            return proc.alive()

        return alive

    def stop(self) -> list[BaseException]:
        """Stop every worker; what ended any of them, raised by none of them yet."""
        failures: list[BaseException] = []
        if self.periodic is not None:
            try:
                self.periodic.stop()
            except BaseException as exc:
                failures.append(exc)
        for probe in self.probes:
            probe.stop()
            if probe.failure is not None:
                failures.append(probe.failure)
        return failures


@dataclass
class ArmResult:
    arm: str
    slot: str
    pid: int
    last_step: int | None = None
    ready: bool | None = None
    exited: bool = False


@dataclass
class SideBySideResult:
    run_dir: Path
    arms: dict[str, ArmResult]
    checkpoints: list[dict[str, Any]]
    skipped_ticks: int
    checkpoint_errors: list[str]
    events: int
    dumps_cut_by_exit: int = 0
    events_files: list[Path] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        dumps = [c["dump_s"] for c in self.checkpoints]
        return {
            "run_dir": str(self.run_dir),
            "arms": {a: vars(r) for a, r in self.arms.items()},
            "checkpoints": len(self.checkpoints),
            "median_dump_s": statistics.median(dumps) if dumps else None,
            "median_image_bytes": (
                statistics.median(c["image_bytes"] for c in self.checkpoints)
                if self.checkpoints
                else None
            ),
            "skipped_ticks": self.skipped_ticks,
            "checkpoint_errors": self.checkpoint_errors,
            "dumps_cut_by_exit": self.dumps_cut_by_exit,
            "events": self.events,
        }


def ensure_engine_supports(plan: Plan) -> None:
    ensure_runs_on(plan, "the side-by-side engine runs", LOCAL_ONLY)
    if plan.workload.command is None:
        raise CkptPocError("workload.script is for Slurm and Kubernetes: give workload.command")


def run_side_by_side(
    plan: Plan, ctx: RunContext, *, timeout_s: float = 300, serve_s: float = 10
) -> SideBySideResult:
    """Run both copies until training ends (or, for a server, ``serve_s`` after ready)."""
    ensure_engine_supports(plan)
    run_dir = run_folder(ctx)
    cluster = LocalCluster(
        list(plan.cluster.nodes), run_dir, workdir=Path.cwd(), workload=plan.workload.name
    )
    recorder = EventRecorder(ctx)
    trial = "side-by-side"
    # What killed runs of this PoC left (their owners are gone; a live run's are not touched).
    stale = clean_dead_roots(run_dir.parent)
    if stale:
        recorder.record(trial, "managed", "stale_checkpoints_removed", folders=stale)
    slots = {"unmanaged": plan.cluster.nodes[-1], "managed": plan.cluster.nodes[0]}
    procs: dict[str, WorkloadProcess] = {}
    workers = WorkerThreads()
    criu: Checkpointer | None = None
    try:
        _start_copies(plan, cluster, run_dir, recorder, trial, slots, procs, workers)
        criu = managed_checkpointer(plan, run_dir / "criu", recorder, trial)
        workers.periodic = PeriodicCheckpoints(
            criu, procs["managed"], plan.checkpointer.interval_s
        ).start()
        ready = _follow_copies(plan, recorder, trial, procs, workers, timeout_s, serve_s)
        for arm, proc in procs.items():
            if not proc.alive():
                recorder.record(trial, arm, "exited", pid=proc.pid)
    finally:
        failures = workers.stop()
        for arm, proc in procs.items():
            if proc.alive():  # its chain ends here (tasks/window/chains.py: Ended)
                recorder.record(trial, arm, "stopped_by_harness", pid=proc.pid)
        left = cluster.stop_all()
        if left:
            recorder.record(trial, "managed", "left_running", pids=left)
        cluster.close()
        if criu is not None:
            criu.close()
        files = recorder.flush()
    if failures:
        raise failures[0]  # a worker thread died: the run fails with its exception
    return _result(run_dir, recorder, trial, slots, procs, workers, ready, files)


def _start_copies(
    plan: Plan,
    cluster: LocalCluster,
    run_dir: Path,
    recorder: EventRecorder,
    trial: str,
    slots: dict[str, str],
    procs: dict[str, WorkloadProcess],
    workers: WorkerThreads,
) -> None:
    """Start each arm's copy on its slot, and its progress probe; ``procs`` and ``workers``
    are filled as each starts, so the caller stops what started even when one fails."""
    for arm in ARMS:
        copy_dir = run_dir / f"{arm}-copy"
        copy_dir.mkdir(parents=True, exist_ok=True)
        recorder.record(trial, arm, "launch", slot=slots[arm])
        procs[arm] = cluster.start(slots[arm], arm, copy_argv(plan.workload.command, copy_dir))
        recorder.record(trial, arm, "started", pid=procs[arm].pid)
        if plan.workload.progress_probe and plan.workload.progress_probe.log_regex:
            workers.probes.append(
                SurfacingProbe(
                    procs[arm].log, plan.workload.progress_probe.log_regex, recorder, trial, arm
                ).start()
            )


def _follow_copies(
    plan: Plan,
    recorder: EventRecorder,
    trial: str,
    procs: dict[str, WorkloadProcess],
    workers: WorkerThreads,
    timeout_s: float,
    serve_s: float,
) -> dict[str, bool]:
    """Wait while the copies run: a server until both are ready and ``serve_s`` more, a
    training until both end or ``timeout_s``. Returns each arm's readiness (servers only)."""
    ready: dict[str, bool] = {}
    if plan.workload.ready_probe:
        for arm in ARMS:
            ready[arm] = wait_ready(
                plan.workload.ready_probe.url,
                recorder,
                trial,
                arm,
                timeout=timeout_s,
                alive=workers.alive_and_well(procs[arm]),
            )
        serve_until = time.monotonic() + serve_s
        while time.monotonic() < serve_until:
            workers.check()
            time.sleep(min(0.05, max(0.0, serve_until - time.monotonic())))
    else:
        deadline = time.monotonic() + timeout_s
        while any(p.alive() for p in procs.values()) and time.monotonic() < deadline:
            workers.check()
            time.sleep(0.05)
    return ready


def _result(
    run_dir: Path,
    recorder: EventRecorder,
    trial: str,
    slots: dict[str, str],
    procs: dict[str, WorkloadProcess],
    workers: WorkerThreads,
    ready: dict[str, bool],
    files: list[Path],
) -> SideBySideResult:
    probes = workers.probes
    periodic = workers.periodic
    last = {p.arm: p.last for p in probes}
    arms = {
        arm: ArmResult(
            arm,
            slots[arm],
            procs[arm].pid,
            last_step=last[arm].step if last.get(arm) else None,
            ready=ready.get(arm),
            exited=bool(recorder.events(trial, arm, "exited")),
        )
        for arm in procs
    }
    ends = [e.detail for e in recorder.events(trial, "managed", "checkpoint_end")]
    # A dump the workload's own end cut short (it reached its last step while CRIU dumped
    # it) is said as that, as the trials say it (checkpoints.WORKLOAD_EXITED), not as an error.
    errors = periodic.errors if periodic else []
    skipped = sum(e.detail["ticks"] for e in recorder.events(event="checkpoint_skipped"))
    return SideBySideResult(
        run_dir=run_dir,
        arms=arms,
        checkpoints=ends,
        skipped_ticks=skipped,
        checkpoint_errors=[str(e).splitlines()[0] for e in errors if not e.workload_exited],
        dumps_cut_by_exit=sum(1 for e in errors if e.workload_exited),
        events=len(recorder.events()),
        events_files=files,
    )
