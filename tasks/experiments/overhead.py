"""Steady-state overhead and the cost of checkpointing: interleaved timed runs, both arms.

The same workload, on the same node, for the same run (the plan's command, a fixed number
of steps), one copy at a time (a process on a local slot, or a Slurm job with the node to
itself: tasks/experiments/backends/), in the order A B B A A B … so that
drift (thermal, other load) falls on both arms alike. A run's time is its progress span:
from the first progress line to the last, as the probe saw them (start-up and exit are not
steady state).

Two variants, reported apart:

- ``steady`` — the managed copy runs as the checkpointer manages it, with no checkpoint or
  restore in progress during the measured span (a gate checks the events). For CRIU,
  which keeps no agent in the workload between dumps, this measures that "managed" costs
  nothing when idle — or shows that it does.
- ``checkpointing`` — the managed copy is dumped every ``checkpointer.interval_s`` while it
  runs: the cost of checkpointing at that interval, not steady-state overhead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.events import Ev
from tasks.data.gates import CheckResult, plain_check
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext
from tasks.engine.checkpointers.base import ensure_runs_on
from tasks.engine.checkpointers.criu import clean_dead_roots
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.registry import cluster_for
from tasks.engine.paths import images_roots, run_folder
from tasks.experiments.backends.registry import STAGE_RUNNERS
from tasks.experiments.checkpoints import checkpoint_rows, summarise_checkpoints
from tasks.experiments.clocks import same_clock_check
from tasks.experiments.results import Failure, OverheadResult, VariantSummary
from tasks.experiments.stats import compare_paired
from tasks.experiments.trials import (
    arms_differ_only_in_managed,
    as_trials,
    failures_of,
    require_command_and_progress,
)

GATE = "overhead"
VARIANTS = ("steady", "checkpointing")


@dataclass
class OverheadRun:
    trials: pd.DataFrame  # overhead rows, then one checkpoint row per dump
    events: list[Event]
    run_dir: Path
    failures: list[dict[str, Any]]  # failed runs with the tail of the workload's log


def pair_order(pair: int) -> tuple[str, str]:
    """A B, then B A, then A B …: each arm goes first in half of the pairs."""
    return (UNMANAGED, MANAGED) if pair % 2 == 0 else (MANAGED, UNMANAGED)


def ensure_overhead_supports(plan: Plan) -> None:
    ensure_runs_on(plan, "overhead runs on", STAGE_RUNNERS)
    require_command_and_progress(plan, "overhead")


def run_overhead(
    plan: Plan,
    ctx: RunContext,
    *,
    pairs: int | None = None,
    variants: tuple[str, ...] = VARIANTS,
    timeout_s: float = 600,
) -> OverheadRun:
    """``pairs`` (default: the plan's repeats) interleaved A/B pairs per variant."""
    ensure_overhead_supports(plan)
    runs = STAGE_RUNNERS[plan.cluster.kind]
    cluster = cluster_for(plan, run_folder(ctx), Path.cwd())
    rec = EventRecorder(ctx)
    rows = []
    clean_dead_roots(*images_roots(plan, ctx))  # checkpoint folders killed runs left
    try:
        runs.preflight(plan, ctx, cluster)
        for variant in variants:
            for pair in range(pairs or plan.repeats):
                for arm in pair_order(pair):
                    rows.append(
                        runs.overhead(plan, ctx, cluster, rec, variant, pair, arm, timeout_s)
                    )
    finally:
        cluster.stop_all()
        cluster.close()  # its reaper: nothing left to end
        rec.flush()
    events = rec.events()
    dumps = checkpoint_rows(events, plan, plan.cluster.nodes[0])
    trials = as_trials([pd.DataFrame(rows), dumps], ctx)
    return OverheadRun(trials, events, run_folder(ctx), failures_of(rows))


def _pairs(rows: pd.DataFrame) -> pd.DataFrame:
    """Pairs in which both arms gave a number: run_s per arm, indexed by pair."""
    ok = rows[rows["status"] == "ok"]
    wide = ok.pivot_table(index="pair", columns="arm", values="run_s", aggfunc="first")
    return wide.dropna(subset=[c for c in (MANAGED, UNMANAGED) if c in wide.columns])


def summarise_overhead(trials: pd.DataFrame, plan: Plan) -> dict[str, VariantSummary]:
    """Per variant (the variants run, in VARIANTS' order): the paired comparison of run time,
    managed vs unmanaged (tasks.experiments.stats); the plan's overhead threshold judges the
    steady variant only."""
    out: dict[str, VariantSummary] = {}
    rows = trials[trials["measure"] == "overhead"]
    for variant in VARIANTS:
        mine = rows[rows["variant"] == variant]
        if mine.empty:
            continue
        wide = _pairs(mine)
        comparison = None
        if {MANAGED, UNMANAGED} <= set(wide.columns) and len(wide) >= 1:
            comparison = compare_paired(
                wide[MANAGED].to_numpy(),
                wide[UNMANAGED].to_numpy(),
                threshold_pct=plan.success.overhead_pct.threshold,
            )
        note = None
        if variant == "checkpointing":
            note = (
                f"the cost of checkpointing every {plan.checkpointer.interval_s} s, "
                "not steady-state overhead; the plan's threshold does not judge it"
            )
            if comparison is not None:
                comparison = replace(comparison, verdict="not judged")
        out[variant] = VariantSummary(
            runs=len(mine),
            failed=int((mine["status"] == "failed").sum()),
            steps_per_s_median={
                arm: _median(mine[(mine["arm"] == arm) & (mine["status"] == "ok")]["steps_per_s"])
                for arm in (MANAGED, UNMANAGED)
            },
            comparison=comparison,
            note=note,
        )
    return out


def _median(values: pd.Series) -> float | None:
    v = values.dropna()
    return float(v.median()) if not v.empty else None


def overhead_gate_checks(
    trials: pd.DataFrame, plan: Plan, events: list[Event]
) -> list[CheckResult]:
    """At least `repeats` per arm and variant; same nodes, fingerprint and workload on both
    arms; no checkpoint or restore event inside a steady run's measured span."""
    rows = trials[trials["measure"] == "overhead"]
    ok = rows[rows["status"] == "ok"]
    checks = []
    for variant in sorted(rows["variant"].dropna().unique()):
        for arm in (UNMANAGED, MANAGED):
            n = int(((ok["variant"] == variant) & (ok["arm"] == arm)).sum())
            checks.append(
                plain_check(
                    GATE,
                    "trials",
                    f"repeats[{variant},{arm}]",
                    n >= plan.repeats,
                    ok_runs=n,
                    required=plan.repeats,
                )
            )
    checks += arms_differ_only_in_managed(GATE, rows)
    checks.append(same_clock_check(GATE, "overhead", rows))
    spans: dict[tuple[str, str], tuple[int, int]] = {}
    for e in events:
        if e.event == Ev.PROGRESS:
            lo, hi = spans.get((e.trial_id, e.arm), (e.t_mono_ns, e.t_mono_ns))
            spans[(e.trial_id, e.arm)] = (min(lo, e.t_mono_ns), max(hi, e.t_mono_ns))
    busy = (Ev.CHECKPOINT_START, Ev.CHECKPOINT_END, Ev.RESTORE_START, Ev.RESTORED)
    contaminated = sorted(
        {
            f"{e.trial_id}/{e.arm}"
            for e in events
            if e.event in busy
            and e.trial_id.startswith("steady-")
            and (e.trial_id, e.arm) in spans
            and spans[(e.trial_id, e.arm)][0] <= e.t_mono_ns <= spans[(e.trial_id, e.arm)][1]
        }
    )
    checks.append(
        plain_check(
            GATE,
            "trials",
            "no_checkpoint_inside_a_steady_span",
            not contaminated,
            runs=contaminated,
        )
    )
    return checks


def overhead_result(
    run: OverheadRun, plan: Plan, ctx: RunContext, files: list[Path]
) -> OverheadResult:
    """The run as the stage hands it on: counted, summarised per variant, with its files."""
    rows = run.trials[run.trials["measure"] == "overhead"]
    return OverheadResult(
        poc=ctx.poc,
        run_id=ctx.run_id,
        runs=len(rows),
        failed=int((rows["status"] == "failed").sum()),
        failures=tuple(Failure.from_json(f) for f in run.failures),
        threshold_pct=plan.success.overhead_pct.threshold,
        variants=summarise_overhead(run.trials, plan),
        checkpoints=summarise_checkpoints(run.trials),
        trials_files=tuple(str(f) for f in files),
        run_dir=str(run.run_dir),
    )
