"""Event names are declared once (tasks/data/events.py): the events schema allows exactly
them, and the code records and matches events by the constants, never by a string."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tasks.data.datasets import EVENTS
from tasks.data.events import ALL_EVENTS, Ev
from tasks.engine.clock import BATCHED_EVENTS
from tasks.experiments.clocks import MEASURE_CLOCKS
from tasks.window.chains import END_EVENTS, RESTART_EVENTS, WORKLOAD_EVENTS

REPO = Path(__file__).resolve().parents[2]
# Where an event's name is in a call: EventRecorder.record/record_at(trial, arm, NAME, ...),
# alias(source, NAME, ...), a checkpointer's record(NAME, ...), events(trial, arm, NAME).
# wait_job_event(rec, events, trial, arm, NAMES, ...), chains' _first(seg, NAMES).
NAME_AT = {"record": 2, "record_at": 2, "alias": 1, "events": 2}
NAMES_AT = {"wait_job_event": 4, "_first": 1}
SELF_RECORD = ("self", "self.checkpointer", "self.criu")


def test_each_name_is_declared_once_and_the_schema_allows_exactly_them() -> None:
    assert len(ALL_EVENTS) == len(set(ALL_EVENTS)) == 62
    assert all(re.fullmatch(r"[a-z][a-z_]*", name) for name in ALL_EVENTS)
    assert all(type(name) is str for name in ALL_EVENTS)  # the journal's fast path
    assert EVENTS.column("event").allowed == ALL_EVENTS
    assert EVENTS.version == 2 and len(EVENTS.history) == 2


def test_what_the_clocks_and_chains_match_on_is_declared() -> None:
    matched = {*BATCHED_EVENTS, *RESTART_EVENTS, *WORKLOAD_EVENTS, *END_EVENTS}
    for arms in MEASURE_CLOCKS.values():
        for clock in arms.values():
            # "first progress" / "last progress": the first and last `progress` event
            matched |= {
                name.removeprefix("first ").removeprefix("last ") for name in clock.name.split("→")
            }
    assert matched <= set(ALL_EVENTS), matched - set(ALL_EVENTS)
    assert Ev.PROGRESS in BATCHED_EVENTS


def _string_names(source: str) -> list[tuple[int, str]]:
    """(line, name) where ``source`` names an event by a string literal: in a recording or
    look-up call, or compared with an event's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        args: list[ast.expr] = []
        if isinstance(node, ast.Call):
            func = node.func
            at = None
            if isinstance(func, ast.Attribute):
                at = NAME_AT.get(func.attr)
                if func.attr == "record" and ast.unparse(func.value) in SELF_RECORD:
                    at = 0
            elif isinstance(func, ast.Name):
                at = NAMES_AT.get(func.id)
            if at is not None and len(node.args) > at:
                args.append(node.args[at])
            args += [k.value for k in node.keywords if k.arg == "event"]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(ast.unparse(s).endswith(("event", "['event']", '["event"]')) for s in sides):
                args += sides
        for arg in args:
            for s in ast.walk(arg):
                if isinstance(s, ast.Constant) and s.value in ALL_EVENTS:
                    found.append((s.lineno, s.value))
    return found


def test_events_are_recorded_and_matched_by_their_constant() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line} {name!r}"
        for path in sorted((REPO / "tasks").rglob("*.py"))
        for line, name in _string_names(path.read_text())
    ]
    assert not found, "\n".join(found)


def test_the_check_sees_a_name_written_as_a_string() -> None:
    source = """
rec.record(trial, arm, "launch", slot=1)
self.record("restored", index=1)
if e.event in ("checkpoint_end", Ev.CHECKPOINT_FAILED):
    pass
got = wait_job_event(rec, events, trial, arm, ("job_started",), None, 10)
fine = row["notice_checkpoint"] == "none"
"""
    assert _string_names(source) == [
        (2, "launch"),
        (3, "restored"),
        (4, "checkpoint_end"),
        (6, "job_started"),
    ]


def test_every_constant_used_is_declared() -> None:
    declared = {k for k in vars(Ev) if k.isupper()}
    unknown = []
    for path in sorted((REPO / "tasks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "Ev"
                and node.attr not in declared
            ):
                unknown.append(f"{path.relative_to(REPO)}:{node.lineno} Ev.{node.attr}")
    assert not unknown, "\n".join(unknown)
