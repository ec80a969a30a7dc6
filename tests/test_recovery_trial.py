"""A copy killed in the middle of a progress line: the next attempt, appending to the same
log, is read from its own first line (the Slurm recovery flake "resumed at step None, its
recoverable point held 100": the dead attempt's `step=131 loss=0.10` without its newline,
then the new attempt's `start steps=…` glued to it, read as new progress at step 131)."""

from __future__ import annotations

from pathlib import Path

from tasks.engine.clock import EventRecorder
from tasks.engine.probes import LogProgressProbe, last_step_before
from tasks.experiments.recovery_trial import end_torn_line, first_new_step

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
