"""One recovery trial as every backend runs its steps (tasks/experiments/recovery_trial.py
is the one skeleton that calls them): what a backend is handed (`TrialCopy`), what its fault
and its comeback give back (`Interruption`, `Comeback`), the steps themselves
(`RecoverySteps`), and where a copy's recoverable point is read from (its CRIU checkpoint,
the application's own checkpoint, the start).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from tasks.data.arms import MANAGED
from tasks.data.errors import CkptPocError
from tasks.data.events import Ev
from tasks.data.plan import Fault, Plan
from tasks.data.row_types import RecoveryRow
from tasks.engine.checkpointers.criu import Checkpoint
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.probes import last_step_before


class TrialFailed(CkptPocError):
    """A trial that cannot give a number; its row says why."""


@dataclass
class TrialCopy:
    """One arm's copy in one trial, as the skeleton hands it to its backend's steps."""

    plan: Plan
    recorder: EventRecorder
    fault: Fault
    trial: str
    arm: str
    node: str
    copy_dir: Path  # its own folder: log, job records, checkpoints
    argv: list[str]
    row: RecoveryRow  # the trial's row: the steps fill their columns
    timeout_s: float  # for anything to start, or come back
    fault_timeout_s: float  # for a delivered fault to end the copy
    log: Path = field(init=False)  # where it writes (every attempt appends)
    launched: Event | None = None  # `launch`, recorded as the first step began
    handle: Any = None  # the backend's own: a process, a job

    @property
    def regex(self) -> str:
        return self.plan.workload.progress_probe.log_regex


@dataclass(frozen=True)
class Interruption:
    """The fault as the copy met it: when it landed and when its end was seen; with a
    notice, when the copy stopped computing (its notice dump froze it, or it was gone)."""

    fault: Event
    detected: Event
    stopped: Event | None = None


@dataclass(frozen=True)
class Comeback:
    """What brought the copy back: its `started` and `restored` events, the step its
    recoverable point held and when that state was the workload's."""

    started: Event
    restored: Event
    recoverable: Event
    resume_step: int


class RecoverySteps(Protocol):
    """A backend's part of one recovery trial; each step raises TrialFailed (or another
    CkptPocError) to fail the trial, and a copy that never starts ends the stage
    (CopyNeverStarted)."""

    includes: str  # what `started` includes on this backend (the row's `includes`)
    alive_every_s: float  # how often `alive` may be asked while the copy runs

    def log_path(self, t: TrialCopy) -> Path: ...

    def launch(self, t: TrialCopy) -> None:
        """Start the copy on its node (the managed arm opted in); running when this returns."""
        ...

    def alive(self, t: TrialCopy) -> bool: ...

    def interrupt(self, t: TrialCopy) -> Interruption:
        """Deliver the plan's fault and see the copy end (and its node let go)."""
        ...

    def bring_back(
        self, t: TrialCopy, cut: Interruption, step_at_fault: int | None, killed_at: int
    ) -> Comeback:
        """Restore (managed) or restart (unmanaged) the copy from its recoverable point
        (``killed_at``: the log's size once the copy was gone)."""
        ...

    def finish(self, t: TrialCopy) -> None:
        """Whatever happened: the fault's outcome if still unknown, everything ended."""
        ...


def restore_attempted(row: RecoveryRow) -> None:
    """The checkpointer's restore is about to run: it counts as failed until the restored
    copy serves again (serve_and_measure), so a restore that raises, or whose copy never
    progresses, is a failed restore; a row that never gets here has no restore (null)."""
    row["restore"] = "failed"


def app_checkpoint(plan: Plan, copy_dir: Path) -> Path | None:
    app = plan.workload.app_checkpoint
    return Path(app.path.replace("{copy_dir}", str(copy_dir))) if app and app.path else None


def app_resume_step(plan: Plan, step_at_fault: int | None, log: Path, log_bytes: int) -> int:
    """The step the application's own last complete checkpoint holds: with the plan's
    ``written_regex``, the last line before the fault (the log's first ``log_bytes``) saying
    one was in place, so a checkpoint the fault cut short holds nothing; without it, the
    last multiple of ``every_steps`` at or before the step at fault."""
    app = plan.workload.app_checkpoint
    assert app is not None
    if app.written_regex:
        return last_step_before(log, log_bytes, app.written_regex) or 0
    return (step_at_fault or 0) // app.every_steps * app.every_steps


def progress_event(rec: EventRecorder, trial: str, arm: str, step: int) -> Event:
    """When ``step`` was logged (the application writes its checkpoint right after that
    step, so this is when its recoverable point existed): the `progress` event of the first
    step at or after it; where the probe read ``step`` together with later ones (one event,
    for the newest), interpolated linearly from the event before, as tasks/window/chains.py
    does (not recorded: a moment to measure from)."""
    events = rec.events(trial, arm, Ev.PROGRESS)
    steps = [int(e.detail.get("step", -1)) for e in events]
    i = next((k for k, s in enumerate(steps) if s >= step), None)
    if i is None:  # e.g. the copy ran to its end during a notice: no later step was logged
        last = max(steps, default=None)
        raise TrialFailed(f"no progress at or after step {step} was seen (last step: {last})")
    if i == 0 or not steps[i - 1] < step < steps[i]:
        return events[i]
    prev, ev = events[i - 1], events[i]
    frac = (step - steps[i - 1]) / (steps[i] - steps[i - 1])
    ns = round(frac * (ev.t_mono_ns - prev.t_mono_ns))
    return replace(
        prev,
        t_mono_ns=prev.t_mono_ns + ns,
        t_wall=prev.t_wall + dt.timedelta(microseconds=ns / 1000),
        detail={"step": step, "interpolated_between": [steps[i - 1], steps[i]]},
    )


def checkpoint_started(rec: EventRecorder, trial: str, index: int) -> Event:
    return next(
        e for e in rec.events(trial, MANAGED, Ev.CHECKPOINT_START) if e.detail.get("index") == index
    )


def held_step(log: Path, point: Checkpoint, regex: str) -> int:
    """The last step the workload had logged when CRIU froze it."""
    return last_step_before(log, point.held_log_bytes or 0, regex) or 0
