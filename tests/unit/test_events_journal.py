"""The run's events journal (`<run folder>/events.jsonl`): what a killed process leaves.

A real recorder runs in a subprocess and is killed with SIGKILL: its lifecycle events are in
the journal as soon as they are recorded, its batched `progress` events within
JOURNAL_FLUSH_S, and a run that ends normally journals exactly what it records.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tasks.engine.clock import (
    JOURNAL,
    JOURNAL_FLUSH_S,
    Event,
    EventRecorder,
    _event_fields,
    _event_from_line,
    _event_line,
    read_journal,
)
from tasks.engine.paths import run_folder
from tests.support.common import REPO

RECORDER = """
import sys, time
from tasks.engine.clock import EventRecorder
from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context

plan = load_plan(sys.argv[1])
recorder = EventRecorder(make_run_context(plan, sys.argv[1], run_id="journalled"))
recorder.record("t", "managed", "launch", slot="local-a")
print("launched", flush=True)
for step in range(1, 51):
    recorder.record("t", "managed", "progress", step=step)
print("stepped", flush=True)
time.sleep(600)
"""


def test_a_killed_recorder_leaves_its_events_in_the_journal(write_plan) -> None:
    plan_path = write_plan()
    journal = run_folder(make_run_context(load_plan(plan_path), plan_path, "journalled")) / JOURNAL
    proc = subprocess.Popen(
        [sys.executable, "-c", RECORDER, str(plan_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "launched"
        # A lifecycle event is in the file before record() returns.
        assert [e.event for e in read_journal(journal)] == ["launch"]
        assert proc.stdout.readline().strip() == "stepped"
        time.sleep(JOURNAL_FLUSH_S + 0.5)  # the batch writer's lag, and some slack
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        events = read_journal(journal)
        assert [e.event for e in events] == ["launch"] + ["progress"] * 50
        assert [e.detail["step"] for e in events[1:]] == list(range(1, 51))
        assert events[0].detail == {"slot": "local-a"} and events[0].t_wall.tzinfo is not None
    finally:
        proc.kill()
        proc.wait()


def test_a_recorder_that_flushes_journals_exactly_what_it_recorded(write_plan) -> None:
    plan_path = write_plan()
    ctx = make_run_context(load_plan(plan_path), plan_path, "flushed")
    recorder = EventRecorder(ctx)
    recorder.record("t", "managed", "launch")
    for step in range(1, 201):
        recorder.record("t", "managed", "progress", step=step)
    recorder.record("t", "managed", "exited")
    recorder.flush()
    journalled = read_journal(run_folder(ctx) / JOURNAL)
    assert journalled == recorder.events()  # same events, same order, same clocks


def test_journal_lines_are_json_dumps_of_the_event() -> None:
    """The hand-written line of the usual event, and the encoder's of any other, are the
    bytes json.dumps(sort_keys=True, default=str) writes; and they read back the same."""
    wall = dt.datetime(2026, 12, 1, 23, 8, 11, 276115, tzinfo=dt.UTC)
    details: list[dict[Any, Any]] = [
        {"step": 5},
        {},
        {"b": 'x"y\n', "a": -3, "é": "ü\u2028"},  # escapes, non-ASCII, key order
        {"flag": True},  # a bool is no int to JSON
        {"f": 1.5, "n": None, "inf": float("inf")},
        {"nested": {"z": 1, "a": [1, 2]}},
        {"path": Path("/x")},  # default=str
        {2: "int key"},
    ]
    events = [Event("t-1", "managed", "progress", wall, 123_456_789, "node-1", d) for d in details]
    events += [
        Event('t"q', "ärm", "launch", wall, -1, "hé", {"slot": "local-a"}),
        Event("t", None, "p", wall, 1, "h", {"s": 1}),  # type: ignore[arg-type]
        Event("t", "a", "p", dt.datetime(2026, 1, 1), 1, "h", {"s": 1}),  # naive wall
    ]
    for ev in events:
        line = _event_line(ev)
        assert line == json.dumps(_event_fields(ev), sort_keys=True, default=str), ev
        assert "\n" not in line
    assert _event_from_line(_event_line(events[0])) == events[0]


def test_steady_progress_reaches_the_journal_within_the_lag(write_plan) -> None:
    """While progress keeps coming, each batch round writes what waits: no event is older
    than the lag (and some slack for a loaded machine) without being in the journal."""
    plan_path = write_plan()
    ctx = make_run_context(load_plan(plan_path), plan_path, "steady")
    recorder = EventRecorder(ctx)
    journal = run_folder(ctx) / JOURNAL
    recorded: list[float] = []
    late = []
    for step in range(1, 41):  # ~2 s: four rounds or more
        recorder.record("t", "managed", "progress", step=step)
        recorded.append(time.monotonic())
        time.sleep(0.05)
        read_at = time.monotonic()
        written = len(read_journal(journal))
        due = sum(t < read_at - JOURNAL_FLUSH_S - 0.3 for t in recorded)
        if written < due:
            late.append((step, written, due))
    assert not late, late
    recorder.flush_journal()
    assert [e.detail["step"] for e in read_journal(journal)] == list(range(1, 41))


def test_record_at_dates_an_event_back_on_both_clocks(tmp_path: Path) -> None:
    """An event observed after it happened (a log line read later, timed by its write):
    its monotonic time as given, its wall time moved back by as much, journalled as such."""
    plan = load_plan(REPO / "plans" / "demo.yaml").model_copy(update={"data_dir": str(tmp_path)})
    rec = EventRecorder(make_run_context(plan, REPO / "plans" / "demo.yaml"))
    before = dt.datetime.now(dt.UTC)
    at = time.monotonic_ns() - 2_500_000_000  # 2.5 s ago
    ev = rec.record_at("t-1", "managed", "progress", at, step=7)
    assert ev.t_mono_ns == at and ev.detail == {"step": 7}
    back = (before - ev.t_wall).total_seconds()
    assert 2.4 < back <= 2.501, back
    rec.flush_journal()
    assert rec.journal is not None
    (journalled,) = read_journal(rec.journal)
    assert (journalled.t_mono_ns, journalled.t_wall) == (at, ev.t_wall)


def test_wall_and_monotonic_orders_agree_across_recording_threads() -> None:
    # Another thread could take the GIL between the wall and the monotonic read of one
    # event: with switches forced often, 397 of 80,000 events sorted by wall time were out
    # of monotonic order (test_side_by_side failed so on a CI run). Dated-back events too.
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    rec = EventRecorder(None)

    def spin(arm: str) -> None:
        for i in range(5000):
            if i % 3:
                rec.record("t", arm, "e")
            else:
                rec.record_at("t", arm, "dated", time.monotonic_ns() - 1000)

    try:
        threads = [threading.Thread(target=spin, args=(f"a{k}",)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(previous)
    by_wall = sorted(rec.events(), key=lambda e: (e.t_wall, e.t_mono_ns))
    pairs = itertools.pairwise(by_wall)
    out_of_order = [(a, b) for a, b in pairs if b.t_mono_ns < a.t_mono_ns]
    assert not out_of_order, out_of_order[:3]
