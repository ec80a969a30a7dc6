"""One clock for every event, and the recorder that writes them to the `events` dataset.

Each event takes the wall clock (UTC, for people and partitions) and CLOCK_MONOTONIC (for
durations: it never jumps) in the same call. A measured span is always a pair of event
names, the same pair on both arms.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd

from tasks.datasets import EVENTS, write_dataset
from tasks.runctx import RunContext


@dataclass(frozen=True)
class Event:
    trial_id: str
    arm: str
    event: str
    t_wall: dt.datetime
    t_mono_ns: int
    host: str
    detail: dict[str, Any]


def now() -> tuple[dt.datetime, int]:
    """(UTC wall time, monotonic ns), read together."""
    return dt.datetime.now(dt.UTC), time.monotonic_ns()


class EventRecorder:
    """Thread-safe, in-memory until ``flush`` writes one events file for the run."""

    def __init__(self, ctx: RunContext) -> None:
        self._ctx = ctx
        self._host = socket.gethostname()
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._flushed = 0

    def record(self, trial_id: str, arm: str, event: str, **detail: Any) -> Event:
        wall, mono = now()
        ev = Event(trial_id, arm, event, wall, mono, self._host, detail)
        with self._lock:
            self._events.append(ev)
        return ev

    def events(
        self, trial_id: str | None = None, arm: str | None = None, event: str | None = None
    ) -> list[Event]:
        with self._lock:
            return [
                e
                for e in self._events
                if (trial_id is None or e.trial_id == trial_id)
                and (arm is None or e.arm == arm)
                and (event is None or e.event == event)
            ]

    def frame(self) -> pd.DataFrame:
        with self._lock:
            events = list(self._events)
        return pd.DataFrame(
            [
                {
                    **self._ctx.stamp(),
                    "trial_id": e.trial_id,
                    "arm": e.arm,
                    "event": e.event,
                    "t_wall": e.t_wall,
                    "t_mono_ns": e.t_mono_ns,
                    "host": e.host,
                    "detail": json.dumps(e.detail, sort_keys=True, default=str),
                }
                for e in events
            ],
            columns=EVENTS.column_names,
        )

    def flush(self) -> list:
        """Write every event recorded since the last flush (one file per flush)."""
        frame = self.frame().iloc[self._flushed :]
        if frame.empty:
            return []
        part = self._flushed or None
        files = write_dataset(
            frame,
            EVENTS,
            data_dir=self._ctx.data_dir,
            poc=self._ctx.poc,
            run_id=self._ctx.run_id,
            part=part,
            metadata=self._ctx.file_metadata,
        )
        self._flushed += len(frame)
        return files


def span_s(start: Event, end: Event) -> float:
    """Seconds between two events, on the monotonic clock."""
    return (end.t_mono_ns - start.t_mono_ns) / 1e9
