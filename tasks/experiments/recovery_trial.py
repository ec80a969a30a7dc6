"""One recovery trial, whatever the cluster: the one skeleton every trial runs (`run_trial`),
its setup, its row, the clock's moments and the measuring once the copy serves again.

The skeleton's steps — launch, reach the fault step, interrupt, bring back, serve — are
the same on every backend; what each does there is the backend's (`Cluster.recovery_steps`:
tasks/engine/clusters/local/recovery.py, …/slurm/recovery.py and recovery_notice.py). Each
step leaves a `trial_step` record in the run's journal (its name, its status, its seconds:
the Chaos Toolkit's journal of activities), so a failed trial says where it failed.
recovery.py runs every trial of the plan, writes and gates."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tasks.data.errors import CkptPocError
from tasks.data.events import Ev
from tasks.data.plan import Fault, Plan
from tasks.data.row_types import RecoveryRow
from tasks.data.runctx import RunContext
from tasks.engine.clock import Event, EventRecorder, span_s
from tasks.engine.clusters.base import Cluster
from tasks.engine.clusters.copies import CopyNeverStarted
from tasks.engine.clusters.trial import (
    Interruption,
    TrialCopy,
    TrialFailed,
    app_resume_step,
    progress_event,
)
from tasks.engine.paths import run_folder
from tasks.engine.preflight import log_tail
from tasks.engine.prepared import workload_argv
from tasks.engine.probes import LogProgressProbe, compile_progress, last_step_before, steps_in
from tasks.experiments.checkpoints import images_place, restore_fork_s
from tasks.experiments.clocks import clock_of
from tasks.experiments.trials import (
    LOG_TAIL,
    workload_hash,
)

FAULT_DELIVERED = "fault_delivered"  # on a failed row's dict, never a `trials` column

# Read by tests and the deadline sweep from here, where a trial's parts are.
__all__ = ["TrialFailed", "app_resume_step", "progress_event"]


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


def base_row(
    setup: TrialSetup, fault: str, arm: str, repeat: int, node: str, includes: str
) -> RecoveryRow:
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


def serve_and_measure(
    row: RecoveryRow,
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
    # The clock ends when the line was written; how late the harness learned of it is
    # the probe's latency, reported beside it.
    learned_ns = time.monotonic_ns()
    serving = rec.record_at(
        row["trial_id"], row["arm"], Ev.SERVING_AGAIN, seen.t_mono_ns, step=seen.step
    )
    row["serving_latency_ms"] = (learned_ns - seen.t_mono_ns) / 1e6
    first_new = first_new_step(log, killed_at, plan.workload.progress_probe.log_regex)
    if first_new != m.resume_step + 1:
        raise TrialFailed(
            f"resumed at step {first_new}, its recoverable point held {m.resume_step}"
        )
    lost_s = max(0.0, span_s(m.recoverable, m.stopped or m.fault))
    if row.get("restore"):
        row["restore"] = "ok"
    # A copy may write its first line before `criu restore` has returned: its restore ended
    # by then at the latest, and the parts still add up to the clock.
    back = min(m.restored, serving, key=lambda e: e.t_mono_ns)
    row.update(
        status="ok",
        recovery_s=span_s(m.fault, serving),
        detection_s=span_s(m.fault, m.detected),
        scheduling_s=span_s(m.detected, m.started),
        restore_s=span_s(m.started, back),
        restore_fork_s=restore_fork_s(m.restored),
        **images_place(m.restored),
        warmup_s=span_s(back, serving),
        work_lost_s=lost_s,
        work_lost_gpu_h=lost_s * row["gpus"] / 3600,
        steps_lost=(m.step_at_fault or 0) - m.resume_step,
    )


def fail_trial(row: RecoveryRow, rec: EventRecorder, exc: Exception, log: Path) -> None:
    """Mark the row failed with its reason; keep the workload log's tail beside it (for the
    flow run's logs and the report, not the dataset) and whether the fault was delivered."""
    row.update(status="failed", reason=str(exc).splitlines()[0][:500])
    row[LOG_TAIL] = log_tail(log)
    row[FAULT_DELIVERED] = bool(rec.events(row["trial_id"], row["arm"], Ev.FAULT_INJECTED))
    rec.record(row["trial_id"], row["arm"], Ev.TRIAL_FAILED, reason=row["reason"])


def wait_for_step(
    probe: LogProgressProbe,
    alive: Callable[[], bool],
    step: int,
    timeout: float,
    slice_s: float = 0.1,
) -> None:
    """Wait until the copy logs ``step``; fail as soon as it exits without reaching it
    (asked every ``slice_s``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe.wait_for(lambda s: s.step >= step, slice_s):
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


@contextlib.contextmanager
def journal_step(rec: EventRecorder, trial: str, arm: str, step: str) -> Iterator[None]:
    """One step of the skeleton, journalled with its status and seconds whatever it does."""
    t0 = time.monotonic()
    status = "failed"
    try:
        yield
        status = "ok"
    finally:
        rec.record(trial, arm, Ev.TRIAL_STEP, step=step, status=status, s=time.monotonic() - t0)


def run_trial(setup: TrialSetup, fault: Fault, arm: str, repeat: int) -> RecoveryRow:
    """One trial on the plan's cluster, both arms on the plan's first node: the copy
    launched, the fault delivered once it reached the fault step, the copy brought back
    and measured. Returns its row, failed with a reason, never raising (but a copy that
    never starts ends the stage: CopyNeverStarted)."""
    plan, rec = setup.plan, setup.recorder
    steps = setup.cluster.recovery_steps(fault)
    node = plan.cluster.nodes[0]
    row = base_row(setup, fault.kind, arm, repeat, node, steps.includes)
    trial = row["trial_id"]
    copy_dir = run_folder(setup.ctx) / f"{trial}-{arm}"
    copy_dir.mkdir(parents=True, exist_ok=True)
    t = TrialCopy(
        plan,
        rec,
        fault,
        trial,
        arm,
        node,
        copy_dir,
        workload_argv(plan, copy_dir),
        row,
        setup.timeout_s,
        setup.fault_timeout_s,
    )
    t.log = steps.log_path(t)
    probe: LogProgressProbe | None = None
    try:
        with journal_step(rec, trial, arm, "launch"):
            t.launched = rec.record(trial, arm, Ev.LAUNCH, node=node)
            steps.launch(t)
        probe = LogProgressProbe(t.log, t.regex, rec, trial, arm).start()
        with journal_step(rec, trial, arm, "reach_fault_step"):
            wait_for_step(
                probe,
                lambda: steps.alive(t),
                setup.fault_step,
                setup.timeout_s,
                steps.alive_every_s,
            )
        # From the fault on, the probe holds no read: the first line back is read alone,
        # so `serving_again` is its own write's time, not a hold's last line's.
        with probe.time_exactly():
            with journal_step(rec, trial, arm, "interrupt"):
                cut: Interruption = steps.interrupt(t)
            killed_at = end_torn_line(t.log)
            step_at_fault = last_step_before(t.log, killed_at, t.regex)
            with journal_step(rec, trial, arm, "bring_back"):
                back = steps.bring_back(t, cut, step_at_fault, killed_at)
            moments = Moments(
                cut.fault,
                cut.detected,
                back.started,
                back.restored,
                back.recoverable,
                step_at_fault,
                back.resume_step,
                cut.stopped,
            )
            with journal_step(rec, trial, arm, "serve"):
                serve_and_measure(row, setup, probe, t.log, killed_at, moments)
    except CopyNeverStarted:
        raise
    except CkptPocError as exc:  # TrialFailed, CriuError, SlurmError…: this trial's row
        fail_trial(row, rec, exc, t.log)
    finally:
        if probe:
            probe.stop()
        steps.finish(t)
    return row
