"""One recovery trial's shared parts, whatever the cluster: its setup, its row, the clock's
moments and the measuring once the copy serves again (recovery_local.py and
recovery_slurm.py run the trials, each one `TrialRunner`; recovery.py runs them all, keyed
by the plan's cluster.kind, writes and gates)."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tasks.data.errors import CkptPocError
from tasks.data.plan import Fault, Plan
from tasks.data.runctx import RunContext
from tasks.engine.checkpointers.criu import (
    Checkpoint,
)
from tasks.engine.clock import Event, EventRecorder, span_s
from tasks.engine.clusters.base import Cluster
from tasks.engine.preflight import PreflightResult, log_tail
from tasks.engine.probes import LogProgressProbe, compile_progress, last_step_before, steps_in
from tasks.experiments.clocks import clock_of
from tasks.experiments.trials import (
    LOG_TAIL,
    workload_hash,
)

FAULT_DELIVERED = "fault_delivered"  # on a failed row's dict, never a `trials` column


class TrialFailed(CkptPocError):
    """A trial that cannot give a number; its row says why."""


@dataclass
class TrialSetup:
    plan: Plan
    ctx: RunContext
    cluster: Cluster
    recorder: EventRecorder
    fault_step: int
    timeout_s: float
    fault_timeout_s: float = 10  # how long a delivered fault has to end the workload


@dataclass
class Moments:
    """The events one trial's numbers come from, up to the copy being back."""

    fault: Event
    detected: Event
    started: Event
    restored: Event
    recoverable: Event  # when the state recovery resumes from was the workload's
    step_at_fault: int | None
    resume_step: int
    # A fault with a notice: when the copy stopped computing (its notice dump froze it, or it
    # was seen gone); work lost runs to it, not to the notice.
    stopped: Event | None = None


@dataclass(frozen=True)
class TrialRunner:
    """Recovery trials on one cluster kind: one trial's row (failed with a reason, never
    raising), the preflight on the plan's first node, and what `started` includes there."""

    run_trial: Callable[[TrialSetup, Fault, str, int], dict[str, Any]]
    preflight: Callable[[TrialSetup, float], PreflightResult]
    includes: str


def base_row(
    setup: TrialSetup, fault: str, arm: str, repeat: int, node: str, includes: str
) -> dict[str, Any]:
    plan = setup.plan
    return {
        "measure": "recovery",
        "trial_id": f"{fault}-{repeat}",
        "arm": arm,
        "fault": fault,
        "repeat": repeat,
        "started_at": dt.datetime.now(dt.UTC),
        "clock": clock_of("recovery", arm),
        "includes": includes,
        "gpus": plan.workload.gpus,
        "gpus_from": "plan",
        "nodes": node,
        "workload_hash": workload_hash(plan),
    }


def restore_attempted(row: dict[str, Any]) -> None:
    """The checkpointer's restore is about to run: it counts as failed until the restored
    copy serves again (serve_and_measure), so a restore that raises, or whose copy never
    progresses, is a failed restore; a row that never gets here has no restore (null)."""
    row["restore"] = "failed"


def serve_and_measure(
    row: dict[str, Any],
    setup: TrialSetup,
    probe: LogProgressProbe,
    log: Path,
    killed_at: int,
    m: Moments,
) -> None:
    """Wait for the first new progress line (`serving_again`), check the copy resumed
    where its recoverable point said, and fill the row's numbers."""
    plan, rec = setup.plan, setup.recorder
    seen = probe.wait_for(lambda s: s.offset > killed_at, setup.timeout_s)
    if seen is None:
        raise TrialFailed("no new progress after recovery")
    serving = rec.record(row["trial_id"], row["arm"], "serving_again", step=seen.step)
    row["serving_latency_ms"] = (serving.t_mono_ns - seen.t_mono_ns) / 1e6
    first_new = first_new_step(log, killed_at, plan.workload.progress_probe.log_regex)
    if first_new != m.resume_step + 1:
        raise TrialFailed(
            f"resumed at step {first_new}, its recoverable point held {m.resume_step}"
        )
    lost_s = max(0.0, span_s(m.recoverable, m.stopped or m.fault))
    if row.get("restore"):
        row["restore"] = "ok"
    row.update(
        status="ok",
        recovery_s=span_s(m.fault, serving),
        detection_s=span_s(m.fault, m.detected),
        scheduling_s=span_s(m.detected, m.started),
        restore_s=span_s(m.started, m.restored),
        warmup_s=span_s(m.restored, serving),
        work_lost_s=lost_s,
        work_lost_gpu_h=lost_s * row["gpus"] / 3600,
        steps_lost=(m.step_at_fault or 0) - m.resume_step,
    )


def fail_trial(row: dict[str, Any], rec: EventRecorder, exc: Exception, log: Path) -> None:
    """Mark the row failed with its reason; keep the workload log's tail beside it (for the
    flow run's logs and the report, not the dataset) and whether the fault was delivered."""
    row.update(status="failed", reason=str(exc).splitlines()[0][:500])
    row[LOG_TAIL] = log_tail(log)
    row[FAULT_DELIVERED] = bool(rec.events(row["trial_id"], row["arm"], "fault_injected"))
    rec.record(row["trial_id"], row["arm"], "trial_failed", reason=row["reason"])


def wait_for_step(
    probe: LogProgressProbe, alive: Callable[[], bool], step: int, timeout: float
) -> None:
    """Wait until the copy logs ``step``; fail as soon as it exits without reaching it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe.wait_for(lambda s: s.step >= step, 0.1):
            return
        if not alive():
            if probe.wait_for(lambda s: s.step >= step, 0.3):  # lines written before the end
                return
            last = probe.last
            raise TrialFailed(
                f"the copy exited at step {last.step if last else 'none'} before reaching "
                f"step {step}"
            )
    raise TrialFailed(f"the copy never reached step {step} within {timeout:.0f} s")


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
    events = rec.events(trial, arm, "progress")
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
        e
        for e in rec.events(trial, "managed", "checkpoint_start")
        if e.detail.get("index") == index
    )


def held_step(log: Path, point: Checkpoint, regex: str) -> int:
    """The last step the workload had logged when CRIU froze it."""
    return last_step_before(log, point.held_log_bytes or 0, regex) or 0


def end_torn_line(log: Path) -> int:
    """The size of a dead copy's log (``killed_at``), its last line ended first if the copy
    died in the middle of writing it. Every attempt appends to the same log: left torn, the
    next attempt's first line would be glued to the dead one's last step, which the probe
    then takes for new progress ("resumed at step None")."""
    with open(log, "rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return size
        fh.write(b"\n")
        return size + 1


def first_new_step(log: Path, offset: int, regex: str) -> int | None:
    with open(log, "rb") as fh:
        fh.seek(offset)
        steps = steps_in(fh.read().decode("utf-8", "replace"), compile_progress(regex))
    return steps[0] if steps else None
