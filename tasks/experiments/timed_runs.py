"""What overhead and cold start share on every cluster: their rows, the failures that give a
failed row instead of a number, and the readings of a copy's progress that end their clocks.

The local runs (overhead.py, cold_start.py) and the Slurm runs (timed_runs_slurm.py) build
their rows here, so a row means the same whichever backend ran it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan
from tasks.engine.probes import LogProgressProbe
from tasks.experiments.clocks import clock_of
from tasks.experiments.trials import workload_hash


class RunFailed(CkptPocError):
    """A timed run that cannot give a number; its row says why."""


class StartFailed(CkptPocError):
    """A start that cannot give a number; its row says why."""


def overhead_row(
    plan: Plan, variant: str, pair: int, arm: str, node: str, includes: str
) -> dict[str, Any]:
    return {
        "measure": "overhead",
        "trial_id": f"{variant}-{pair}",
        "arm": arm,
        "variant": variant,
        "pair": pair,
        "repeat": pair,
        "started_at": dt.datetime.now(dt.UTC),
        "clock": clock_of("overhead", arm),
        "includes": includes
        + (" with CRIU dumps every interval" if variant == "checkpointing" else ""),
        "gpus": plan.workload.gpus,
        "gpus_from": "plan",
        "nodes": node,
        "workload_hash": workload_hash(plan),
    }


def fill_progress_span(row: dict[str, Any], probe: LogProgressProbe) -> None:
    """The run's time: from its first progress line to its last, as the probe saw them."""
    if len(probe.seen) < 2:
        raise RunFailed("fewer than two progress steps seen: nothing to time")
    first, last = probe.seen[0], probe.seen[-1]
    run_s = (last.t_mono_ns - first.t_mono_ns) / 1e9
    steps = last.step - first.step
    row.update(status="ok", run_s=run_s, steps=steps, steps_per_s=steps / run_s if run_s else None)


def cold_start_row(
    plan: Plan, trial: str, arm: str, repeat: int, node: str, includes: str
) -> dict[str, Any]:
    return {
        "measure": "cold_start",
        "trial_id": trial,
        "arm": arm,
        "repeat": repeat,
        "started_at": dt.datetime.now(dt.UTC),
        "clock": clock_of("cold_start", arm),
        "includes": includes,
        "gpus": plan.workload.gpus,
        "gpus_from": "plan",
        "nodes": node,
        "workload_hash": workload_hash(plan),
    }
