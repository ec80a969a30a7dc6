"""What a copy's own log says it lost: the trials' `steps_lost` checked against the steps the
workload printed, not against chance. A kill can fall just after an application checkpoint
(the demo's every 50 steps: about 1 trial in 15 on CI), and the copy then loses nothing."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

from tasks.data.plan import Workload, load_plan
from tasks.engine.probes import compile_progress, steps_in
from tests.support.common import REPO


@functools.cache
def _demo_workload() -> Workload:
    """The workload the notice tests run: plans/demo.yaml's (its step count aside)."""
    return load_plan(REPO / "plans" / "demo.yaml").workload


def assert_steps_lost_as_logged(
    log: Path, steps_lost: int, from_app_checkpoint: bool = False
) -> None:
    """`steps_lost` is the steps the first attempt logged past the one the next attempt went
    on from, or none where the steps run on unbroken (it came back at the very step of the
    kill). From the application's own checkpoint, the step it went on from is the last
    multiple of its ``every_steps`` before the kill."""
    workload = _demo_workload()
    steps = steps_in(log.read_text(), compile_progress(workload.progress_probe.log_regex))
    assert len(steps) > 1, f"{log}: {len(steps)} steps logged"
    breaks = [(b, a - 1) for b, a in itertools.pairwise(steps) if a != b + 1]
    assert len(breaks) <= 1, f"{log}: the steps break {len(breaks)} times: {breaks}"
    if not breaks:
        assert steps_lost == 0, f"{log}: the steps run on unbroken, {steps_lost} said lost"
        return
    last, resumed = breaks[0]
    assert steps_lost == last - resumed > 0, (log, steps_lost, breaks)
    if from_app_checkpoint:
        assert workload.app_checkpoint is not None
        every = workload.app_checkpoint.every_steps
        assert resumed == last // every * every, (log, breaks)
