"""Before any trial: start the plan's workload once and see it work.

A workload that cannot start (a missing dependency, a wrong path, the wrong interpreter)
would otherwise fail every trial the same way, each after its own timeout. The preflight
starts one copy, waits for its first progress line (or its ready probe), and stops it; if
the copy exits or stays silent, the run stops at once with the workload's own last log
lines in the error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan, ReadyProbe
from tasks.engine.clock import EventRecorder
from tasks.engine.probes import LogProgressProbe
from tasks.engine.ready import poll_ready

PREFLIGHT_TIMEOUT_S = 60  # longer than any sane import-and-first-step; an exit ends it sooner
TRIAL = "preflight"
LOG_TAIL_LINES = 15


class WorkloadDoesNotStart(CkptPocError):
    """The plan's workload exited or stayed silent before its first sign of life."""


@dataclass(frozen=True)
class PreflightResult:
    seconds: float  # launch → first sign of life
    sign: str  # what was seen: "progress step N" or "ready at URL"
    log: Path


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, after_offset: int = 0) -> str:
    """The last ``lines`` lines of a log past ``after_offset`` ('' when there are none)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(after_offset, fh.tell() - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def await_first_sign(
    plan: Plan,
    log: Path,
    alive: Callable[[], bool],
    timeout_s: float,
    what: str,
    slice_s: float = 0.1,
    after_offset: int = 0,
    ready: ReadyProbe | None = None,
) -> PreflightResult:
    """Wait for the workload's ready probe (``ready``: the plan's, its placeholders filled
    for this copy) or, without one, its first progress line past ``after_offset`` in its log
    (what an earlier copy wrote does not count), while ``alive()``; raise
    WorkloadDoesNotStart with the log's tail when it exits or stays silent."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    last = ""
    if ready is not None:
        answer = poll_ready(
            ready, timeout=timeout_s, alive=alive, log=log, after_offset=after_offset
        )
        if answer.ready:
            return PreflightResult(time.monotonic() - t0, f"ready: {ready.describe()}", log)
        exited, last = not alive(), f" (its last answer: {answer.last})"
    else:
        regex = plan.workload.progress_probe.log_regex if plan.workload.progress_probe else None
        if regex is None:
            raise CkptPocError("the preflight needs workload.progress_probe.log_regex")
        probe = LogProgressProbe(log, regex, EventRecorder(None), TRIAL, TRIAL).start()
        try:
            seen = None
            while seen is None and time.monotonic() < deadline:
                seen = probe.wait_for(lambda s: s.offset > after_offset, slice_s)
                if seen is None and not alive():
                    # Lines written just before the end.
                    seen = probe.wait_for(lambda s: s.offset > after_offset, 0.3)
                    break
            if seen is not None:
                return PreflightResult(time.monotonic() - t0, f"progress step {seen.step}", log)
        finally:
            probe.stop()
        exited = not alive()
    sign = (
        f"its ready probe ({ready.describe()}) said ready{last}"
        if ready
        else "its first progress line"
    )
    how = (
        f"exited after {time.monotonic() - t0:.1f} s"
        if exited
        else f"stayed silent for {timeout_s:.0f} s"
    )
    tail = log_tail(log) or "(the log is empty)"
    raise WorkloadDoesNotStart(
        f"preflight: the workload ({what}) {how} before {sign}; nothing was measured. "
        f"Last lines of {log}:\n{tail}"
    )
