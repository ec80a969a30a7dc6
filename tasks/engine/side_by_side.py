"""The engine on its own: one workload, a managed and an unmanaged copy, one clock.

`run_side_by_side` starts the plan's workload twice on the plan's cluster, whatever its kind
(`Cluster.start_copy`: a process on a local slot, or a batch job pinned to the Slurm node) —
the managed copy opted in to the plan's checkpointer at its interval, the unmanaged copy
beside it with nothing but its own application checkpoints — follows both logs with the
same probes, and records every moment as an event. The recovery, overhead and cold-start
experiments build on the same pieces.

However the run ends, it leaves nothing running and its record behind: the cluster ends the
copies (locally its reaper, restored copies too, if the harness is killed; on Slurm the
jobs are cancelled), every event is journalled to `<run folder>/events.jsonl` as it
happens, checkpoint folders a killed run left are removed by the next run, and an exception
in a worker thread (a probe, the checkpoint schedule) fails the run with that exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.data.arms import ARMS, MANAGED, UNMANAGED
from tasks.data.errors import CkptPocError
from tasks.data.events import Ev
from tasks.data.jsonform import JsonForm
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext
from tasks.engine.checkpointers.base import ensure_runs_on
from tasks.engine.checkpointers.criu import clean_dead_roots
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.base import Cluster
from tasks.engine.clusters.copies import CopyEnd, CopyRequest, WorkloadCopy
from tasks.engine.clusters.registry import BUILT_KINDS, cluster_for
from tasks.engine.paths import checkpoint_folder, images_roots, run_folder
from tasks.engine.prepared import prepare_workload, workload_argv, workload_ready_probe
from tasks.engine.probes import LogProgressProbe
from tasks.engine.ready import wait_ready

# Every backend that builds a cluster starts copies (the `Cluster` protocol).
RUNS_ON = BUILT_KINDS


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
                    self._trial, self.arm, Ev.THREAD_FAILED, thread="probe", error=repr(exc)[:2000]
                )

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure


class WorkerThreads:
    """The run's probe threads; ``check()`` raises the first exception that ended one."""

    def __init__(self) -> None:
        self.probes: list[SurfacingProbe] = []

    def check(self) -> None:
        for probe in self.probes:
            probe.check()

    def alive_and_well(self, alive: Callable[[], bool]) -> Callable[[], bool]:
        """``alive``, raising first if a worker died (for loops that poll it)."""

        def checked() -> bool:
            self.check()
            return alive()

        return checked

    def stop(self) -> list[BaseException]:
        """Stop every probe; what ended any of them, raised by none of them yet."""
        failures: list[BaseException] = []
        for probe in self.probes:
            probe.stop()
            if probe.failure is not None:
                failures.append(probe.failure)
        return failures


@dataclass
class ArmResult(JsonForm):
    arm: str
    slot: str
    pid: int | None  # a local copy's; a Slurm copy has its job instead
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
    job_ids: dict[str, str] = field(default_factory=dict)  # arm → its Slurm job

    def summary(self) -> SideBySideSummary:
        dumps = [c["dump_s"] for c in self.checkpoints]
        return SideBySideSummary(
            run_dir=str(self.run_dir),
            arms={a: dataclasses.replace(r) for a, r in self.arms.items()},
            checkpoints=len(self.checkpoints),
            median_dump_s=statistics.median(dumps) if dumps else None,
            median_image_bytes=(
                statistics.median(c["image_bytes"] for c in self.checkpoints)
                if self.checkpoints
                else None
            ),
            skipped_ticks=self.skipped_ticks,
            checkpoint_errors=tuple(self.checkpoint_errors),
            dumps_cut_by_exit=self.dumps_cut_by_exit,
            events=self.events,
            job_ids=dict(self.job_ids) or None,
        )


@dataclass(frozen=True, slots=True)
class SideBySideSummary(JsonForm):
    """What a side-by-side run hands on (the flow's result and `--json`); ``job_ids`` is
    absent, not null, where the copies were no Slurm jobs."""

    _OMIT_NONE = ("job_ids",)

    run_dir: str
    arms: Mapping[str, ArmResult]  # a copy of each arm's, as the run ended
    checkpoints: int
    median_dump_s: float | None
    median_image_bytes: float | None
    skipped_ticks: int
    checkpoint_errors: tuple[str, ...]
    dumps_cut_by_exit: int
    events: int
    job_ids: Mapping[str, str] | None = None  # arm → its Slurm job


def ensure_engine_supports(plan: Plan) -> None:
    ensure_runs_on(plan, "the side-by-side engine runs", RUNS_ON)
    if plan.workload.command is None:
        raise CkptPocError(
            "the side-by-side engine runs workload.command on every cluster: give it"
        )


def run_side_by_side(
    plan: Plan, ctx: RunContext, *, timeout_s: float = 300, serve_s: float = 10
) -> SideBySideResult:
    """Run both copies until training ends (or, for a server, ``serve_s`` after ready)."""
    ensure_engine_supports(plan)
    run_dir = run_folder(ctx)
    cluster = cluster_for(plan, run_dir, Path.cwd())
    recorder = EventRecorder(ctx)
    trial = "side-by-side"
    # What killed runs of this PoC left (their owners are gone; a live run's are not touched).
    stale = clean_dead_roots(*images_roots(plan, ctx))
    if stale:
        recorder.record(trial, MANAGED, Ev.STALE_CHECKPOINTS_REMOVED, folders=stale)
    slots = {UNMANAGED: plan.cluster.nodes[-1], MANAGED: plan.cluster.nodes[0]}
    copies: dict[str, WorkloadCopy] = {}
    workers = WorkerThreads()
    ends: dict[str, CopyEnd] = {}
    try:
        prepare_workload(plan, timeout_s)
        _start_copies(plan, cluster, run_dir, recorder, trial, slots, copies, workers, timeout_s)
        ready = _follow_copies(plan, cluster, recorder, trial, copies, workers, timeout_s, serve_s)
        for arm, copy in copies.items():
            if not cluster.copy_alive(copy):
                recorder.record(trial, arm, Ev.EXITED, **copy.names)
    finally:
        failures = workers.stop()
        for arm, copy in copies.items():
            ends[arm] = cluster.end_copy(copy)  # no dump from here on
            failures += ends[arm].failures
            if cluster.copy_alive(copy):  # its chain ends here (tasks/window/chains.py: Ended)
                recorder.record(trial, arm, Ev.STOPPED_BY_HARNESS, **copy.names)
        left = cluster.stop_all()
        if left:
            key = "pids" if all(isinstance(x, int) for x in left) else "job_ids"
            recorder.record(trial, MANAGED, Ev.LEFT_RUNNING, **{key: list(left)})
        cluster.close()
        files = recorder.flush()
    if failures:
        raise failures[0]  # a worker thread died: the run fails with its exception
    return _result(run_dir, recorder, trial, slots, copies, workers, ready, files, ends)


def _start_copies(
    plan: Plan,
    cluster: Cluster,
    run_dir: Path,
    recorder: EventRecorder,
    trial: str,
    slots: dict[str, str],
    copies: dict[str, WorkloadCopy],
    workers: WorkerThreads,
    timeout_s: float,
) -> None:
    """Start each arm's copy on its node, and its progress probe; ``copies`` and ``workers``
    are filled as each starts, so the caller stops what started even when one fails."""
    for arm in ARMS:
        copy_dir = run_dir / f"{arm}-copy"
        request = CopyRequest(
            trial,
            arm,
            slots[arm],
            copy_dir,
            workload_argv(plan, copy_dir),
            checkpoint=arm == MANAGED,  # the managed arm's opt-in
            checkpoint_root=checkpoint_folder(plan, run_dir),
            start_timeout_s=timeout_s,
        )
        recorder.record(trial, arm, Ev.LAUNCH, slot=slots[arm])
        copies[arm] = cluster.start_copy(request, recorder)
        recorder.record(trial, arm, Ev.STARTED, **copies[arm].names)
        if plan.workload.progress_probe and plan.workload.progress_probe.log_regex:
            workers.probes.append(
                SurfacingProbe(
                    copies[arm].log, plan.workload.progress_probe.log_regex, recorder, trial, arm
                ).start()
            )


def _follow_copies(
    plan: Plan,
    cluster: Cluster,
    recorder: EventRecorder,
    trial: str,
    copies: dict[str, WorkloadCopy],
    workers: WorkerThreads,
    timeout_s: float,
    serve_s: float,
) -> dict[str, bool]:
    """Wait while the copies run: a server until both are ready and ``serve_s`` more, a
    training until both end or ``timeout_s``. Returns each arm's readiness (servers only)."""
    ready: dict[str, bool] = {}
    if plan.workload.ready_probe:
        for arm in ARMS:
            probe = workload_ready_probe(plan, copies[arm].request.copy_dir)
            assert probe is not None
            ready[arm] = wait_ready(
                probe,
                recorder,
                trial,
                arm,
                timeout=timeout_s,
                alive=workers.alive_and_well(lambda c=copies[arm]: cluster.copy_alive(c)),
                log=copies[arm].log,
            ).ready
        serve_until = time.monotonic() + serve_s
        while time.monotonic() < serve_until:
            workers.check()
            for copy in copies.values():
                cluster.copy_alive(copy)  # raises what ended its checkpointing
            time.sleep(min(0.05, max(0.0, serve_until - time.monotonic())))
    else:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            workers.check()
            if not any([cluster.copy_alive(c) for c in copies.values()]):
                break
            time.sleep(0.05)
    for probe in workers.probes:
        probe.poll()  # the last lines, written just before the end
    return ready


def _result(
    run_dir: Path,
    recorder: EventRecorder,
    trial: str,
    slots: dict[str, str],
    copies: dict[str, WorkloadCopy],
    workers: WorkerThreads,
    ready: dict[str, bool],
    files: list[Path],
    ends: dict[str, CopyEnd],
) -> SideBySideResult:
    last = {p.arm: p.last for p in workers.probes}
    arms = {
        arm: ArmResult(
            arm,
            slots[arm],
            int(copy.names["pid"]) if "pid" in copy.names else None,
            last_step=last[arm].step if last.get(arm) else None,
            ready=ready.get(arm),
            exited=bool(recorder.events(trial, arm, Ev.EXITED)),
        )
        for arm, copy in copies.items()
    }
    dumps = [e.detail for e in recorder.events(trial, MANAGED, Ev.CHECKPOINT_END)]
    skipped = sum(e.detail["ticks"] for e in recorder.events(event=Ev.CHECKPOINT_SKIPPED))
    end = ends.get(MANAGED, CopyEnd())
    return SideBySideResult(
        run_dir=run_dir,
        arms=arms,
        checkpoints=dumps,
        skipped_ticks=skipped,
        checkpoint_errors=end.checkpoint_errors,
        dumps_cut_by_exit=end.dumps_cut_by_exit,
        events=len(recorder.events()),
        events_files=files,
        job_ids={a: str(c.names["job_id"]) for a, c in copies.items() if "job_id" in c.names},
    )
