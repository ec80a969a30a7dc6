"""A copy killed in the middle of a progress line: the next attempt, appending to the same
log, is read from its own first line (the Slurm recovery flake "resumed at step None, its
recoverable point held 100": the dead attempt's `step=131 loss=0.10` without its newline,
then the new attempt's `start steps=…` glued to it, read as new progress at step 131)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from tasks.data.plan import load_plan
from tasks.data.plan_workload import AppCheckpoint
from tasks.engine.clock import EventRecorder
from tasks.engine.probes import LogProgressProbe, last_step_before
from tasks.experiments.recovery_trial import (
    app_resume_step,
    end_torn_line,
    first_new_step,
    progress_event,
)

STEP_RE = r"^step=(\d+) "


def test_a_torn_last_line_is_ended_so_the_next_attempt_reads_as_its_own(tmp_path: Path) -> None:
    log = tmp_path / "workload.log"
    log.write_bytes(b"step=130 loss=0.22\nstep=131 loss=0.10")  # killed between two writes
    probe = LogProgressProbe(log, STEP_RE, EventRecorder(None), "t", "unmanaged").start()
    try:
        assert probe.wait_for(lambda s: s.step == 130, timeout=5)
        killed_at = end_torn_line(log)
        assert killed_at == log.stat().st_size and log.read_bytes().endswith(b"0.10\n")
        assert last_step_before(log, killed_at, STEP_RE) == 131
        with open(log, "ab") as fh:  # the next attempt: a fresh start, resumed at step 100
            fh.write(b"start steps=400\nresumed step=100\nstep=101 loss=0.07\n")
        seen = probe.wait_for(lambda s: s.offset > killed_at, timeout=5)
        assert seen is not None and seen.step == 101
        assert first_new_step(log, killed_at, STEP_RE) == 101
    finally:
        probe.stop()
    assert end_torn_line(log) == log.stat().st_size  # a whole last line is left alone
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert end_torn_line(empty) == 0 and empty.read_bytes() == b""


def test_progress_event_interpolates_a_step_read_with_later_ones() -> None:
    """A watched probe reads several lines at once and records only the newest: the moment
    of a step inside such a read lies between the events around it (as chains.py reads it)."""
    rec = EventRecorder(None)
    t0 = time.monotonic_ns() - 10_000_000_000
    for step, at_s in ((40, 0.0), (45, 1.0), (55, 3.0)):  # steps 46..54 came in one read
        rec.record_at("t", "unmanaged", "progress", t0 + int(at_s * 1e9), step=step)
    exact = progress_event(rec, "t", "unmanaged", 45)
    assert exact is rec.events("t", "unmanaged", "progress")[1]
    mid = progress_event(rec, "t", "unmanaged", 50)
    assert mid.t_mono_ns == t0 + 2_000_000_000
    assert mid.detail == {"step": 50, "interpolated_between": [45, 55]}
    prev = rec.events("t", "unmanaged", "progress")[1]
    assert abs((mid.t_wall - prev.t_wall).total_seconds() - 1.0) < 1e-6
    assert len(rec.events()) == 3  # a moment to measure from, not a recorded event
    # Before the first event: that event (nothing earlier to interpolate from).
    assert progress_event(rec, "t", "unmanaged", 10).detail["step"] == 40


def test_a_checkpoint_the_fault_cut_short_is_not_the_resume_point(tmp_path: Path) -> None:
    # Slurm's time-limit kill landed while train_digits wrote its step-3500 checkpoint
    # (ckpt.npz.tmp left behind): the copy resumed from 3450. Counting multiples of
    # every_steps said 3500 and the trial failed; the "checkpoint step=" lines say 3450.
    plan = load_plan(Path(__file__).resolve().parents[2] / "plans" / "demo.yaml")
    log = tmp_path / "workload.log"
    lines = [
        f"step={s} loss=0.1\n" + (f"checkpoint step={s}\n" if s % 50 == 0 else "")
        for s in range(3440, 3500)
    ]
    log.write_text("".join(lines) + "step=3500 loss=0.1\n")  # killed inside its checkpoint
    killed_at = log.stat().st_size
    with open(log, "a") as fh:  # the next attempt, resumed, appends
        fh.write("resumed step=3450\nstep=3451 loss=0.1\ncheckpoint step=3500\n")
    step_at_fault = last_step_before(log, killed_at, STEP_RE)
    assert step_at_fault == 3500
    assert app_resume_step(plan, step_at_fault, log, killed_at) == 3450
    app = plan.workload.app_checkpoint
    assert app is not None and app.written_regex
    counted = plan.model_copy(
        update={
            "workload": plan.workload.model_copy(
                update={"app_checkpoint": app.model_copy(update={"written_regex": None})}
            )
        }
    )
    assert app_resume_step(counted, step_at_fault, log, killed_at) == 3500
    none_yet = tmp_path / "early.log"
    none_yet.write_text("step=1 loss=0.1\nstep=2 loss=0.1\n")
    assert app_resume_step(plan, 2, none_yet, none_yet.stat().st_size) == 0


def test_written_regex_is_refused_without_a_step_group() -> None:
    for bad, why in (("^checkpoint", "one capture group"), ("^(unclosed", "does not compile")):
        with pytest.raises(ValidationError, match=why):
            AppCheckpoint(every_steps=50, written_regex=bad)
    assert AppCheckpoint(every_steps=50, written_regex=r"^checkpoint step=(\d+)$").written_regex
