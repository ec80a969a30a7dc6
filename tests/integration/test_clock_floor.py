"""The clocks time the line, not the read: `serving_again` and a log's `ready` carry the time
the first line after a moment was written, whatever the probe's hold or poll interval.

Before, every managed recovery read 100.0–101.5 ms: the progress probe's 100 ms hold
gathered the restored copy's first line with the ones after it, and the event took the time
the harness learned of the last one. The copies here write the wall time into each line
(`written_unix_ns=`, train_digits --stamp-lines; not CLOCK_MONOTONIC, which a restored copy
reads in the time namespace CRIU gives it, shifted), so the clock is checked against the
moment the line was written, in both probe modes (inotify with its hold, and polling).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tasks.data.runctx import make_run_context
from tasks.engine import probes
from tasks.experiments.recovery import run_recovery
from tests.support.common import REPO
from tests.unit.test_clock_floor import (
    POLLED_TOLERANCE_MS,
    STAMP,
    WATCHED_TOLERANCE_MS,
    _log_of,
    _stamped_plan,
)


@pytest.mark.criu
@pytest.mark.parametrize("watch", [True, False], ids=["inotify", "poll"])
def test_the_recovery_clock_ends_when_the_first_line_back_was_written(
    tmp_path: Path, criu_binary: str, monkeypatch, watch: bool
) -> None:
    monkeypatch.setenv("CKPT_POC_CRIU", criu_binary)
    if not watch:
        monkeypatch.setattr(probes, "_choose_mode", lambda _log, _watch: ("poll", "the test"))
    plan = _stamped_plan(tmp_path)
    run = run_recovery(plan, make_run_context(plan, REPO / "plans" / "demo.yaml"))
    trials = run.trials.set_index("arm")
    assert list(trials["status"]) == ["ok", "ok"], trials.get("reason")
    for arm in ("unmanaged", "managed"):
        trial = trials.loc[arm, "trial_id"]
        events = {e.event: e for e in run.events if e.trial_id == trial and e.arm == arm}
        fault, serving = events["fault_injected"], events["serving_again"]
        text = _log_of(run.run_dir, trial, arm).read_text()
        step = serving.detail["step"]
        wall_minus_mono = time.time_ns() - time.monotonic_ns()
        written = next(
            int(m[2]) - wall_minus_mono for m in STAMP.finditer(text)
            if int(m[1]) == step and int(m[2]) - wall_minus_mono > fault.t_mono_ns
        )  # fmt: skip
        late_ms = (serving.t_mono_ns - written) / 1e6
        tolerance = WATCHED_TOLERANCE_MS if watch else POLLED_TOLERANCE_MS
        assert -5.0 <= late_ms <= tolerance, (arm, late_ms)
        # The recovery clock is fault → that write; the harness's own lateness is apart.
        recovery_ms = trials.loc[arm, "recovery_s"] * 1000
        assert abs(recovery_ms - (written - fault.t_mono_ns) / 1e6) <= tolerance + 5
        assert trials.loc[arm, "serving_latency_ms"] >= 0
