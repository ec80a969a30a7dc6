"""The compatibility sweep wherever the plan's cluster is: one entry per cluster kind."""

from __future__ import annotations

from collections.abc import Callable

from tasks.data.plan import Plan
from tasks.data.runctx import RunContext
from tasks.experiments.compatibility import (
    SWEEP_CLUSTERS,
    CompatibilityRun,
    ensure_compatibility_runs,
    run_compatibility,
)
from tasks.experiments.compatibility_slurm import run_compatibility_on_slurm

SWEEPS: dict[str, Callable[..., CompatibilityRun]] = {
    "local": run_compatibility,
    "slurm": run_compatibility_on_slurm,
}
assert set(SWEEPS) == set(SWEEP_CLUSTERS), "a sweep cluster without its runner"


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
    return SWEEPS[plan.cluster.kind](plan, ctx, cycles=cycles, timeout_s=timeout_s, only=only)
