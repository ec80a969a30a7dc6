"""The timed runs of overhead and cold start, one entry per cluster kind that runs them.

A backend that runs them adds one entry here (its preflight, one overhead run, one cold-start
pair); overhead.py and cold_start.py run whichever the plan's cluster.kind names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.experiments import timed_runs_local as local
from tasks.experiments import timed_runs_slurm as slurm


def _no_preflight(*_args: Any) -> None:
    """On Slurm each run is its own job: one that fails is its row, with the log's tail."""


@dataclass(frozen=True)
class TimedRuns:
    preflight: Callable[..., None]  # (plan, ctx, cluster)
    # (plan, ctx, cluster, recorder, variant, pair, arm, timeout_s) -> the run's row
    overhead: Callable[..., dict[str, Any]]
    # (plan, ctx, cluster, recorder, repeat, timeout_s, drop_caches) -> its two rows
    cold_start: Callable[..., list[dict[str, Any]]]


TIMED_RUNS: dict[str, TimedRuns] = {
    "local": TimedRuns(local.preflight, local.overhead_run_local, local.cold_start_pair_local),
    "slurm": TimedRuns(_no_preflight, slurm.overhead_run_on_slurm, slurm.cold_start_pair_on_slurm),
}
