"""Overhead, cold start and the compatibility sweep, one entry per built cluster kind.

A backend adds its stage package (local/ and slurm/ here are the pattern) and one entry in
`STAGE_RUNNERS`; overhead.py, cold_start.py and the compatibility flow run whichever the
plan's cluster.kind names. tests/unit/test_backends.py checks it against the engine's registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.data.plan import Plan
from tasks.data.row_types import ColdStartRow, OverheadRow
from tasks.data.runctx import RunContext
from tasks.experiments.backends.local import timed_runs as local
from tasks.experiments.backends.slurm import timed_runs as slurm
from tasks.experiments.backends.slurm.sweep import run_compatibility_on_slurm
from tasks.experiments.compatibility import (
    CompatibilityRun,
    ensure_compatibility_runs,
    run_compatibility,
)


def _no_preflight(*_args: Any) -> None:
    """On Slurm each run is its own job: one that fails is its row, with the log's tail."""


@dataclass(frozen=True)
class StageRunners:
    preflight: Callable[..., None]  # (plan, ctx, cluster)
    # (plan, ctx, cluster, recorder, variant, pair, arm, timeout_s) -> the run's row
    overhead: Callable[..., OverheadRow]
    # (plan, ctx, cluster, recorder, repeat, timeout_s, page_cache) -> its two rows
    cold_start: Callable[..., list[ColdStartRow]]
    # (plan, ctx, *, cycles, timeout_s, only) -> every chosen workload's sweep
    sweep: Callable[..., CompatibilityRun]


STAGE_RUNNERS: dict[str, StageRunners] = {
    "local": StageRunners(
        local.preflight, local.overhead_run_local, local.cold_start_pair_local, run_compatibility
    ),
    "slurm": StageRunners(
        _no_preflight,
        slurm.overhead_run_on_slurm,
        slurm.cold_start_pair_on_slurm,
        run_compatibility_on_slurm,
    ),
}


def run_sweep(
    plan: Plan,
    ctx: RunContext,
    *,
    cycles: int | None = None,
    timeout_s: float | None = None,
    only: list[str] | None = None,
) -> CompatibilityRun:
    """The plan's sweep on its cluster (compatibility.run_compatibility's arguments)."""
    ensure_compatibility_runs(plan)
    runner = STAGE_RUNNERS[plan.cluster.kind].sweep
    return runner(plan, ctx, cycles=cycles, timeout_s=timeout_s, only=only)
