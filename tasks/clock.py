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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas and the datasets load only where events are written: a Slurm
    import pandas as pd  # job's wrapper records events without them, and starts faster

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
    """Thread-safe, in-memory until ``flush`` writes one events file for the run.

    Inside a Slurm job there is no run context: the recorder then only appends each event
    as a JSON line to ``jsonl`` (flushed at once, so the harness sees it while the job
    runs), and the harness takes those lines in with ``import_jsonl``.
    """

    def __init__(self, ctx: RunContext | None, jsonl: Path | None = None) -> None:
        self._ctx = ctx
        self._jsonl = jsonl
        self._host = socket.gethostname()
        self._events: list[Event] = []
        self._imported: dict[Path, int] = {}  # bytes of each JSON-lines file taken in
        self._lock = threading.Lock()
        self._flushed = 0

    def record(self, trial_id: str, arm: str, event: str, **detail: Any) -> Event:
        wall, mono = now()
        ev = Event(trial_id, arm, event, wall, mono, self._host, detail)
        with self._lock:
            self._events.append(ev)
            if self._jsonl is not None:
                with open(self._jsonl, "a", encoding="utf-8") as fh:
                    fh.write(_event_line(ev) + "\n")
        return ev

    def alias(self, source: Event, event: str, **detail: Any) -> Event:
        """Record ``source``'s moment again under a clock's name (`started`, `restored`),
        when another process observed it first (a Slurm job's wrapper)."""
        ev = Event(
            source.trial_id,
            source.arm,
            event,
            source.t_wall,
            source.t_mono_ns,
            source.host,
            {**detail, "as_observed_by": source.event},
        )
        with self._lock:
            self._events.append(ev)
        return ev

    def import_jsonl(self, path: Path) -> list[Event]:
        """Take in the events another process appended to ``path`` since the last call."""
        with self._lock:
            start = self._imported.get(path, 0)
            try:
                with open(path, "rb") as fh:
                    fh.seek(start)
                    data = fh.read()
            except FileNotFoundError:
                return []
            complete = data[: data.rfind(b"\n") + 1]
            self._imported[path] = start + len(complete)
            new = [_event_from_line(line) for line in complete.decode().splitlines() if line]
            self._events.extend(new)
            return new

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
        import pandas as pd

        from tasks.datasets import EVENTS

        if self._ctx is None:
            raise ValueError("an EventRecorder without a run context only writes JSON lines")
        ctx = self._ctx
        with self._lock:
            events = list(self._events)
        return pd.DataFrame(
            [
                {
                    **ctx.stamp(),
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
        from tasks.datasets import EVENTS, write_dataset

        if self._ctx is None:
            return []
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
    """Seconds between two events: on the monotonic clock when one host recorded both,
    else on the wall clock (a Slurm job's events come from its node)."""
    if start.host == end.host:
        return (end.t_mono_ns - start.t_mono_ns) / 1e9
    return (end.t_wall - start.t_wall).total_seconds()


def _event_line(ev: Event) -> str:
    return json.dumps({**asdict(ev), "t_wall": ev.t_wall.isoformat()}, sort_keys=True, default=str)


def _event_from_line(line: str) -> Event:
    raw = json.loads(line)
    return Event(**{**raw, "t_wall": dt.datetime.fromisoformat(raw["t_wall"])})
