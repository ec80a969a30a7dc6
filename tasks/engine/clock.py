"""One clock for every event, and the recorder that writes them to the `events` dataset.

Each event takes the wall clock (UTC, for people and partitions) and CLOCK_MONOTONIC (for
durations: it never jumps) in the same call. A measured span is always a pair of event
names, the same pair on both arms.

Every event is also appended to the run's journal, `<run folder>/events.jsonl` (a JSON line
each, written straight to the OS), so a run killed before it writes the `events` dataset
still leaves its record (``read_journal``): every event at once, except `progress` (one per
workload step), which is written in batches at most ``JOURNAL_FLUSH_S`` later. A write per
step cost the probe's thread ~70 µs a step here (0.81 → 1.12 % of a core at 48 steps/s in
bench/harness_overhead.py); a batch costs one write, off that thread.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_str
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.data.events import Ev
from tasks.engine.paths import run_folder

if TYPE_CHECKING:  # pandas and the datasets load only where events are written: a Slurm
    import pandas as pd  # job's wrapper records events without them, and starts faster

    from tasks.data.row_types import EventLine
    from tasks.data.runctx import RunContext

JOURNAL = "events.jsonl"
JOURNAL_FLUSH_S = 0.5  # how far the journal may lag behind for a batched event
BATCHED_EVENTS = frozenset({Ev.PROGRESS})  # one per workload step: too many for a write each


@dataclass(frozen=True)
class Event:
    trial_id: str
    arm: str
    event: str
    t_wall: dt.datetime
    t_mono_ns: int
    host: str
    detail: dict[str, Any]


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# A wall reading counts as read with the monotonic one when both monotonic reads around it
# are this close; another thread can take the GIL between two reads, and a pair read
# milliseconds apart ordered its event against other threads' wrongly (seen: 397 of 80,000
# events out of order across 4 recording threads).
_PAIR_SLACK_NS = 20_000
_PAIR_TRIES = 8
# How long a recorder keeps one wall-minus-monotonic offset: within it, its events' wall order
# is their monotonic order; refreshed, it follows the wall clock's slewing (NTP: at most
# 0.5 ms a second, so at most 30 ms apart from a fresh read).
OFFSET_REFRESH_NS = 60 * 1_000_000_000


def clock_pair_ns() -> tuple[int, int]:
    """(wall ns, monotonic ns) read together: the wall clock between two monotonic reads,
    read again while something ran between them; the monotonic time is their middle."""
    for _ in range(_PAIR_TRIES):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        if after - before <= _PAIR_SLACK_NS:
            break
    return wall, (before + after) // 2


def wall_at(wall_ns: int) -> dt.datetime:
    """Wall ns as a UTC datetime, floored to its microsecond (every event the same way)."""
    return _EPOCH + dt.timedelta(microseconds=wall_ns // 1000)


def journal_path(ctx: RunContext) -> Path:
    return run_folder(ctx) / JOURNAL


def _write_lines(fd: int, events: list[Event]) -> None:
    if events:
        os.write(fd, "".join(_event_line(e) + "\n" for e in events).encode())


def _last_write(
    fd: int,
    pending: list[Event],
    lock: threading.Lock,
    wake: threading.Event,
    stop: threading.Event,
) -> None:
    """At the journal's end (collected, or the interpreter exiting): what is still pending,
    then the file; the writer thread ends. Holds no reference to the journal itself, so
    that it can be collected."""
    stop.set()
    wake.set()
    with lock:
        try:
            _write_lines(fd, pending)
            pending.clear()
        finally:
            os.close(fd)


def _write_behind(ref: weakref.ref[Journal], wake: threading.Event, stop: threading.Event) -> None:
    """The batch writer: asleep until a batched event waits, then writes what waits every
    ``JOURNAL_FLUSH_S`` (one wake-up a batch) until a round finds nothing."""
    while True:
        wake.wait()
        if stop.wait(JOURNAL_FLUSH_S):
            return
        journal = ref()  # held only while writing: the journal can still be collected
        if journal is None:
            return
        journal._write_round()
        del journal


class Journal:
    """Appends events as JSON lines to ``path`` (O_APPEND: whole lines at the end even if
    two writers share it; one ``os.write`` each, no Python buffer, so what was written is
    in the OS and survives a SIGKILL). Events named in ``batched`` wait for a batch, written
    by a thread at most ``JOURNAL_FLUSH_S`` later; any other event writes them first.

    ``reopen_each``: open and close the file for each write, for a reader on another host
    (an NFS client sends a file's writes to the server at its close); nothing is batched.
    """

    def __init__(
        self, path: Path, *, reopen_each: bool = False, batched: frozenset[str] = BATCHED_EVENTS
    ) -> None:
        self.path = path
        self._reopen_each = reopen_each
        self._batched = frozenset() if reopen_each else batched
        self._pending: list[Event] = []
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._wake = threading.Event()  # set: the writer has a round to do
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None
        self._idle = True  # the writer sleeps on _wake (else it writes again within the lag)

    def append(self, event: Event) -> None:
        with self._lock:
            if self._fd is None and not self._reopen_each:
                self._open()
            self._pending.append(event)
            if event.event not in self._batched:
                self._write_pending()
            elif self._idle:  # a busy writer comes back within the lag anyway
                self._idle = False
                self._start_writer()
                self._wake.set()

    def flush(self) -> None:
        """Write every pending event now."""
        with self._lock:
            self._write_pending()

    def _write_round(self) -> None:
        """The writer's round: what waits, or, if nothing does, the writer goes to sleep."""
        with self._lock:
            if self._pending:
                self._write_pending()
            else:
                self._idle = True
                self._wake.clear()

    def _write_pending(self) -> None:
        if not self._pending:
            return
        if self._reopen_each:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                _write_lines(fd, self._pending)
            finally:
                os.close(fd)
        else:
            assert self._fd is not None
            _write_lines(self._fd, self._pending)
        self._pending.clear()

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        self._fd = os.open(self.path, flags, 0o644)
        weakref.finalize(
            self, _last_write, self._fd, self._pending, self._lock, self._wake, self._stop
        )

    def _start_writer(self) -> None:
        if self._writer is None:
            self._writer = threading.Thread(
                target=_write_behind,
                args=(weakref.ref(self), self._wake, self._stop),
                name="events-journal",
                daemon=True,
            )
            self._writer.start()


class EventRecorder:
    """Thread-safe, in memory until ``flush`` writes one events file for the run, and
    journalled as it goes (``Journal``): with a run context, to the run's `events.jsonl`.

    Inside a Slurm job there is no run context: the journal (``jsonl``) is then the only
    record, the harness reads it while the job runs, maybe from another host, and takes its
    lines in with ``import_jsonl``; every event is written at once, opening and closing it.
    """

    def __init__(self, ctx: RunContext | None, jsonl: Path | None = None) -> None:
        self._ctx = ctx
        self._jsonl = jsonl if jsonl is not None or ctx is None else journal_path(ctx)
        self._journal = Journal(self._jsonl, reopen_each=jsonl is not None) if self._jsonl else None
        self._host = socket.gethostname()
        self._events: list[Event] = []
        self._imported: dict[Path, int] = {}  # bytes of each JSON-lines file taken in
        self._lock = threading.Lock()
        self._flushed = 0
        # (wall - monotonic ns, when read): one tuple, so a thread sees both of one read
        self._offset = (0, -OFFSET_REFRESH_NS)

    @property
    def journal(self) -> Path | None:
        return self._jsonl

    def _append(self, events: list[Event]) -> None:
        """Keep ``events`` and journal them (the caller holds the lock: journal order is
        record order)."""
        self._events.extend(events)
        if self._journal is not None:
            for ev in events:
                self._journal.append(ev)

    def flush_journal(self) -> None:
        """Write the journal's pending (batched) events now."""
        if self._journal is not None:
            self._journal.flush()

    def record(self, trial_id: str, arm: str, event: str, **detail: Any) -> Event:
        return self.record_at(trial_id, arm, event, time.monotonic_ns(), **detail)

    def record_at(
        self, trial_id: str, arm: str, event: str, t_mono_ns: int, **detail: Any
    ) -> Event:
        """Record an event that happened at ``t_mono_ns`` (now, or in the past: a log line
        timed by its write). Its wall time is the monotonic one plus one wall-minus-monotonic
        offset, read afresh at most every OFFSET_REFRESH_NS: every event of the recorder is
        then in the same order on both clocks. (Two independent reads of the pair differ by
        their jitter, and two copies' progress lines timed by the same coarse mtime fall
        ~100 ns apart: ordered by wall they came out of monotonic order.)"""
        offset = self._offset
        if t_mono_ns - offset[1] > OFFSET_REFRESH_NS:
            wall_ns, mono_ns = clock_pair_ns()
            offset = self._offset = (wall_ns - mono_ns, mono_ns)
        wall = wall_at(t_mono_ns + offset[0])
        return self._keep(Event(trial_id, arm, event, wall, t_mono_ns, self._host, detail))

    def _keep(self, ev: Event) -> Event:
        with self._lock:  # _append, unrolled for one event: a probe records every step
            self._events.append(ev)
            if self._journal is not None:
                self._journal.append(ev)
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
            self._append([ev])
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
            if path == self._jsonl:
                self._events.extend(new)  # our own journal: already there
            else:
                self._append(new)
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

        from tasks.data.datasets import EVENTS

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
        from tasks.data.datasets import EVENTS
        from tasks.data.store import write_dataset

        self.flush_journal()
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


def read_journal(path: Path) -> list[Event]:
    """The events of a journal, complete lines only (a killed writer may leave half a line)."""
    return EventRecorder(None).import_jsonl(path)


def span_s(start: Event, end: Event) -> float:
    """Seconds between two events: on the monotonic clock when one host recorded both,
    else on the wall clock (a Slurm job's events come from its node)."""
    if start.host == end.host:
        return (end.t_mono_ns - start.t_mono_ns) / 1e9
    return (end.t_wall - start.t_wall).total_seconds()


_ENCODER = json.JSONEncoder(sort_keys=True, default=str)  # json.dumps builds one a call


def _event_line(ev: Event) -> str:
    """``ev`` as one JSON object, keys sorted. The batch writer runs this once per workload
    step, so the usual event (str fields, a flat detail of str or int) is written by hand,
    the same bytes as ``json.dumps`` (tests/unit/test_events_journal.py); anything else goes
    through the encoder."""
    strs = (ev.arm, ev.event, ev.host, ev.trial_id)
    detail = _flat_detail(ev.detail)
    if detail is None or type(ev.t_mono_ns) is not int or any(type(v) is not str for v in strs):
        return _ENCODER.encode(_event_fields(ev))
    arm, event, host, trial = map(_json_str, strs)
    return (
        f'{{"arm": {arm}, "detail": {detail}, "event": {event}, "host": {host}, '
        f'"t_mono_ns": {ev.t_mono_ns}, "t_wall": {_json_str(ev.t_wall.isoformat())}, '
        f'"trial_id": {trial}}}'
    )


def _flat_detail(detail: Any) -> str | None:
    """A dict of str keys to str or int values as JSON, keys sorted; None for anything else."""
    if type(detail) is not dict or any(type(k) is not str for k in detail):
        return None
    items = []
    for key in sorted(detail):
        value = detail[key]
        if type(value) is int:
            items.append(f"{_json_str(key)}: {value}")
        elif type(value) is str:
            items.append(f"{_json_str(key)}: {_json_str(value)}")
        else:
            return None
    return "{" + ", ".join(items) + "}"


def _event_fields(ev: Event) -> EventLine:
    # Fields by hand, not asdict(): that deep-copies ``detail``.
    return {
        "trial_id": ev.trial_id,
        "arm": ev.arm,
        "event": ev.event,
        "t_wall": ev.t_wall.isoformat(),
        "t_mono_ns": ev.t_mono_ns,
        "host": ev.host,
        "detail": ev.detail,
    }


def _event_from_line(line: str) -> Event:
    raw = json.loads(line)
    return Event(**{**raw, "t_wall": dt.datetime.fromisoformat(raw["t_wall"])})
