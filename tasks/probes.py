"""Probes: how the harness sees a workload progress or become ready, within 50 ms.

A progress probe follows the workload's append-only log (or a file holding a counter) and
yields a step counter; a ready probe asks an HTTP URL until it answers 200. Each records the
moment it observes a change as an event, so its observation latency is bounded by its poll
interval (default 10 ms) plus the read.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tasks.clock import EventRecorder

POLL_S = 0.01


@dataclass(frozen=True)
class StepSeen:
    step: int
    t_mono_ns: int
    offset: int  # byte offset in the log just after the line that carried it


def steps_in(text: str, pattern: re.Pattern[str]) -> list[int]:
    return [int(m.group(1)) for m in pattern.finditer(text)]


def compile_progress(regex: str | re.Pattern[str]) -> re.Pattern[str]:
    """A progress regex, line-anchored: ``^`` and ``$`` match at each line of the log."""
    return regex if isinstance(regex, re.Pattern) else re.compile(regex, re.MULTILINE)


def last_step_before(log: Path, size: int, regex: str | re.Pattern[str]) -> int | None:
    """The last step the log held in its first ``size`` bytes (what a checkpoint froze)."""
    pattern = compile_progress(regex)
    with open(log, "rb") as fh:
        text = fh.read(size).decode("utf-8", "replace")
    steps = steps_in(text, pattern)
    return steps[-1] if steps else None


class LogProgressProbe:
    """Follows an append-only log from a byte offset; records `progress` on each new step."""

    def __init__(
        self,
        log: Path,
        regex: str,
        recorder: EventRecorder,
        trial_id: str,
        arm: str,
        *,
        poll_s: float = POLL_S,
        record_every_step: bool = True,
    ) -> None:
        self.log = log
        self.pattern = compile_progress(regex)
        self._recorder = recorder
        self._trial, self.arm = trial_id, arm
        self._poll_s = poll_s
        self._record_every = record_every_step
        self._read_to = 0  # bytes of the log read so far
        self._offset = 0  # bytes up to the end of the last complete line
        self._partial = b""
        self.seen: list[StepSeen] = []
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LogProgressProbe:
        self._thread = threading.Thread(target=self._run, name=f"progress-{self.arm}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self._poll_s)

    def poll(self) -> None:
        """Read what the log gained since the last poll; record the newest step seen."""
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self._read_to)
                data = fh.read()
        except FileNotFoundError:
            return
        if not data:
            return
        t = time.monotonic_ns()
        self._read_to += len(data)
        buf = self._partial + data
        cut = buf.rfind(b"\n") + 1
        complete, self._partial = buf[:cut], buf[cut:]
        self._offset = self._read_to - len(self._partial)
        steps = steps_in(complete.decode("utf-8", "replace"), self.pattern)
        if not steps:
            return
        seen = StepSeen(steps[-1], t, self._offset)
        with self._lock:
            self.seen.append(seen)
            self._lock.notify_all()
        if self._record_every or len(self.seen) == 1:
            self._recorder.record(self._trial, self.arm, "progress", step=seen.step)

    @property
    def last(self) -> StepSeen | None:
        with self._lock:
            return self.seen[-1] if self.seen else None

    def wait_for(self, predicate: Callable[[StepSeen], bool], timeout: float) -> StepSeen | None:
        """Block until a seen step satisfies ``predicate``; None on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                match = next((s for s in self.seen if predicate(s)), None)
                if match or time.monotonic() >= deadline:
                    return match
                self._lock.wait(min(self._poll_s, max(0.0, deadline - time.monotonic())))


def wait_ready(
    url: str,
    recorder: EventRecorder,
    trial_id: str,
    arm: str,
    *,
    timeout: float,
    poll_s: float = POLL_S,
    alive: Callable[[], bool] = lambda: True,
) -> bool:
    """Poll ``url`` until it answers 200 (records `ready`); False on timeout or death."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        try:
            with urllib.request.urlopen(url, timeout=max(poll_s * 5, 0.2)) as resp:
                if resp.status == 200:
                    recorder.record(trial_id, arm, "ready", url=url)
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(poll_s)
    return False
