"""Each measure's clock, declared once: the pair of events that start and stop it, per arm.

Trials write the clock's name in their `clock` column from here, the stages' gates and the
record's "different clocks" line check the trials against it. Both arms of a comparison must
stop on the same event; cold start is the one measure whose arms start on different events
(native launch, restore start), by the method's definition: both end on the same `ready`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pandas as pd

from tasks.data.arms import ARMS, MANAGED, UNMANAGED
from tasks.data.events import Ev
from tasks.data.gates import CheckResult, plain_check


@dataclass(frozen=True)
class Clock:
    start: str  # the event that starts it
    stop: str  # the event that stops it

    @property
    def name(self) -> str:
        return f"{self.start}→{self.stop}"


def _both(clock: Clock) -> dict[str, Clock]:
    return dict.fromkeys(ARMS, clock)


# trials.measure → arm → the clock its rows are timed on.
MEASURE_CLOCKS: dict[str, dict[str, Clock]] = {
    "recovery": _both(Clock(Ev.FAULT_INJECTED, Ev.SERVING_AGAIN)),
    "overhead": _both(Clock("first progress", "last progress")),
    "cold_start": {
        UNMANAGED: Clock(Ev.LAUNCH, Ev.READY),
        MANAGED: Clock(Ev.RESTORE_START, Ev.READY),
    },
    "checkpoint": {MANAGED: Clock(Ev.CHECKPOINT_START, Ev.CHECKPOINT_END)},
}


def clock_of(measure: str, arm: str) -> str:
    """The name a trial of ``measure`` on ``arm`` writes in its `clock` column."""
    return MEASURE_CLOCKS[measure][arm].name


def clock_problems(measure: str, used: Mapping[str, Iterable[str]]) -> list[str]:
    """Why the clocks a measure's trials used (arm → clock names seen) break its declaration:
    an arm on another clock, or more than one clock on one arm. Empty when they hold."""
    declared = MEASURE_CLOCKS.get(measure)
    if declared is None:
        return [f"{measure}: no clock is declared for this measure"]
    problems = []
    for arm, names in sorted(used.items()):
        seen = sorted(set(names))
        want = declared.get(arm)
        if want is None:
            problems.append(f"{measure}/{arm}: this arm has no declared clock (saw {seen})")
        elif seen != [want.name]:
            problems.append(f"{measure}/{arm}: timed on {', '.join(seen)}; declared {want.name}")
    stops = {declared[a].stop for a in used if a in declared}
    if len(stops) > 1:  # a declaration error, checked in case one is ever added
        problems.append(f"{measure}: the arms' clocks stop on different events {sorted(stops)}")
    return problems


def same_clock_check(gate: str, measure: str, trials: pd.DataFrame) -> CheckResult:
    """The stage's gate check `same_clock_both_arms`: every trial on its arm's declared clock."""
    rows = trials[trials["measure"] == measure]
    used = {str(a): list(map(str, g["clock"])) for a, g in rows.groupby("arm", observed=True)}
    problems = clock_problems(measure, used)
    declared = {a: c.name for a, c in MEASURE_CLOCKS[measure].items()}
    return plain_check(
        gate, "trials", "same_clock_both_arms", not problems, declared=declared, problems=problems
    )
