"""What a copy's own log says it lost: the trials' `steps_lost` checked against the steps the
workload printed, not against chance. A kill can fall just after an application checkpoint
(the demo's every 50 steps: about 1 trial in 15 on CI), and the copy then loses nothing."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

STEP = re.compile(r"^step=(\d+) ", re.MULTILINE)  # plans/demo.yaml's progress_probe


def assert_steps_lost_as_logged(log: Path, steps_lost: int, every_steps: int | None = None) -> None:
    """`steps_lost` is the steps the first attempt logged past the one the next attempt went
    on from, or none where the steps run on unbroken (it came back at the very step of the
    kill). With the application's cadence, the step it went on from is the last multiple
    of ``every_steps`` before the kill."""
    steps = [int(s) for s in STEP.findall(log.read_text())]
    assert len(steps) > 1, f"{log}: {len(steps)} steps logged"
    breaks = [(b, a - 1) for b, a in itertools.pairwise(steps) if a != b + 1]
    assert len(breaks) <= 1, f"{log}: the steps break {len(breaks)} times: {breaks}"
    if not breaks:
        assert steps_lost == 0, f"{log}: the steps run on unbroken, {steps_lost} said lost"
        return
    last, resumed = breaks[0]
    assert steps_lost == last - resumed > 0, (log, steps_lost, breaks)
    if every_steps:
        assert resumed == last // every_steps * every_steps, (log, breaks)
