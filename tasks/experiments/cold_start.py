"""Cold start: a native launch against a restore of the same, fully initialised workload.

Two clocks, ended by the same probe (docs/design.md §4):

    native   launch → ready          (engine start of the plan's command)
    restore  restore_start → ready   (CRIU restore of a checkpoint of that copy once ready)

"Ready" is the plan's ready probe (an HTTP URL answering 200) for a server, else the first
progress line the copy logs (for a training job: the first step it can compute, after its
imports and data loading; after a restore: the first new step).

Per repeat, as the plan's cluster runs it (tasks/experiments/backends/):
launch natively and time it to ready; dump the ready copy, end it; restore that checkpoint
and time it to ready; end it. Before each timed start the page cache is dropped where the
host permits it (`/proc/sys/vm/drop_caches`, root), and each row records whether it was.
Restore throughput is checkpoint bytes over the `criu restore` seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.errors import CkptPocError
from tasks.data.gates import CheckResult, plain_check
from tasks.data.jsonform import JsonForm
from tasks.data.page_cache import judged
from tasks.data.plan import Plan, Workload
from tasks.data.row_types import ColdStartRow
from tasks.data.runctx import RunContext
from tasks.engine.checkpointers.base import ensure_runs_on
from tasks.engine.checkpointers.criu import clean_dead_roots
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.registry import cluster_for
from tasks.engine.paths import images_roots, run_folder
from tasks.experiments.backends.registry import STAGE_RUNNERS
from tasks.experiments.checkpoints import checkpoint_rows, summarise_checkpoints
from tasks.experiments.clocks import same_clock_check
from tasks.experiments.results import ColdStartResult, Failure, ImagesSummary, Restore
from tasks.experiments.stats import compare_speedup, fit_throughput
from tasks.experiments.stats_results import SpeedupComparison, ThroughputFit
from tasks.experiments.trials import (
    arms_differ_only_in_managed,
    as_trials,
    failures_of,
)

GATE = "cold_start"


@dataclass(frozen=True, slots=True)
class ColdStartSummary(JsonForm):
    """The judged speed-up, the warm one apart, the fitted restore GB/s, the page-cache
    conditions timed, where the images were; and the run's failed rows."""

    failed: int
    speedup: SpeedupComparison | None
    speedup_warm: SpeedupComparison | None
    restore_throughput: ThroughputFit | None
    page_cache: tuple[str, ...]
    images: ImagesSummary | None


@dataclass
class ColdStartRun:
    trials: pd.DataFrame  # cold-start rows, then one checkpoint row per dump
    events: list[Event]
    run_dir: Path
    summary: ColdStartSummary
    failures: list[dict[str, Any]]  # failed starts with the tail of the workload's log


def timed_plan(plan: Plan) -> Plan:
    """The plan as cold start runs it: its timed workload (``Plan.cold_start_workload``)
    first, so that its prepare, preflight, copies and rows are that workload's."""
    timed = plan.cold_start_workload
    if timed is plan.workload:
        return plan
    rest = [w for w in plan.workloads if w is not timed]
    return plan.model_copy(update={"workload": timed, "workloads": [timed, *rest]})


def ensure_cold_start_supports(plan: Plan) -> None:
    """A command to launch, and a ready signal to end both clocks: the ready probe (a
    server), else the first progress line (a training job)."""
    ensure_runs_on(plan, "cold start runs on", STAGE_RUNNERS)
    w = plan.cold_start_workload
    if w.command is None:
        raise CkptPocError(f"cold start needs {w.name}'s command (an argv list) for its copies")
    has_progress = w.progress_probe is not None and w.progress_probe.log_regex is not None
    if w.ready_probe is None and not has_progress:
        raise CkptPocError(f"cold start needs {w.name}'s ready_probe or progress_probe.log_regex")


def run_cold_start(
    plan: Plan,
    ctx: RunContext,
    *,
    repeats: int | None = None,
    timeout_s: float = 120,
) -> ColdStartRun:
    """Every pair of every page-cache condition on the plan's cluster, on the cold start
    workload (its rows carry its name and hash)."""
    ensure_cold_start_supports(plan)
    plan = timed_plan(plan)
    runs = STAGE_RUNNERS[plan.cluster.kind]
    cluster = cluster_for(plan, run_folder(ctx), Path.cwd())
    rec = EventRecorder(ctx)
    rows: list[ColdStartRow] = []
    clean_dead_roots(*images_roots(plan, ctx))  # checkpoint folders killed runs left
    try:
        runs.preflight(plan, ctx, cluster)
        n = repeats or plan.cold_start.repeats or plan.repeats
        for page_cache in plan.cold_start.page_cache:  # each condition its own pairs
            for repeat in range(n):
                rows += runs.cold_start(plan, ctx, cluster, rec, repeat, timeout_s, page_cache)
    finally:
        cluster.stop_all()
        cluster.close()  # its reaper: nothing left to end
        rec.flush()
    events = rec.events()
    trials = as_trials(
        [pd.DataFrame(rows), checkpoint_rows(events, plan, plan.cluster.nodes[0])], ctx
    )
    return ColdStartRun(
        trials, events, run_folder(ctx), summarise_cold_start(trials, plan), failures_of(rows)
    )


def _speedup(rows: pd.DataFrame, plan: Plan) -> SpeedupComparison | None:
    native = rows[rows["arm"] == UNMANAGED]["ready_s"].dropna().to_numpy()
    restore = rows[rows["arm"] == MANAGED]["ready_s"].dropna().to_numpy()
    if not len(native) or not len(restore):
        return None
    crit = plan.success.cold_start_speedup
    return compare_speedup(
        native,
        restore,
        threshold=crit.threshold,
        statistic=crit.statistic if crit.statistic in ("median", "mean") else "median",
    )


def summarise_cold_start(trials: pd.DataFrame, plan: Plan) -> ColdStartSummary:
    """The speed-up (native/restore ready seconds) with its CI and the plan's verdict, on
    the rows timed with the page cache dropped; the warm condition's apart, when the plan
    asks for it; restore seconds against checkpoint bytes as a fitted GB/s."""
    ok = trials[(trials["measure"] == "cold_start") & (trials["status"] == "ok")]
    rows = judged(ok)
    restore = rows[rows["arm"] == MANAGED]
    warm = ok[ok["page_cache"] == "warm"]
    fit_rows = restore.dropna(subset=["checkpoint_bytes", "restore_s"])
    return ColdStartSummary(
        failed=int((trials["status"] == "failed").sum()),
        speedup=_speedup(rows, plan),
        speedup_warm=_speedup(warm, plan) if len(warm) else None,
        restore_throughput=(
            fit_throughput(
                fit_rows["checkpoint_bytes"].to_numpy(), fit_rows["restore_s"].to_numpy()
            )
            if len(fit_rows)
            else None
        ),
        page_cache=tuple(sorted(ok["page_cache"].dropna().unique())),
        images=images_summary(restore),
    )


def images_summary(restores: pd.DataFrame) -> ImagesSummary | None:
    """Where the judged restores read their images, and their median restore GB/s beside
    the median plain read of the same bytes (efficiency: restore / read; 1.0 is the limit)."""
    rows = restores.dropna(subset=["restore_gbps"])
    if not len(rows):
        return None
    raw = rows["raw_read_gbps"].dropna() if "raw_read_gbps" in rows else pd.Series(dtype=float)
    restore_gbps = float(rows["restore_gbps"].median())
    raw_gbps = float(raw.median()) if len(raw) else None
    place = rows.iloc[0]
    return ImagesSummary(
        images_dir=place.get("images_dir") if isinstance(place.get("images_dir"), str) else None,
        images_fs=place.get("images_fs") if isinstance(place.get("images_fs"), str) else None,
        restore_gbps=restore_gbps,
        raw_read_gbps=raw_gbps,
        efficiency=restore_gbps / raw_gbps if raw_gbps else None,
    )


def plot_restore_throughput(trials: pd.DataFrame, summary: ColdStartSummary, path: Path) -> Path:
    """Restore seconds against checkpoint bytes, with the fitted line: a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = trials[(trials["measure"] == "cold_start") & (trials["arm"] == MANAGED)]
    rows = rows.dropna(subset=["checkpoint_bytes", "restore_s"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(rows["checkpoint_bytes"] / 1e6, rows["restore_s"], label="restores (measured)")
    fit = summary.restore_throughput
    if fit is not None and fit.gbps:
        xs = sorted(rows["checkpoint_bytes"])
        intercept = fit.intercept_s or 0.0
        ax.plot(
            [x / 1e6 for x in xs],
            [intercept + x / (fit.gbps * 1e9) for x in xs],
            label=f"fit: {fit.gbps:.2f} GB/s ({fit.method})",
        )
    ax.set_xlabel("checkpoint size (MB)")
    ax.set_ylabel("criu restore (s)")
    ax.set_title("Restore time against checkpoint size")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def cold_start_gate_checks(trials: pd.DataFrame, plan: Plan) -> list[CheckResult]:
    """At least `repeats` per arm; same nodes, fingerprint and workload on both arms; every
    restore row has its checkpoint bytes."""
    rows = trials[trials["measure"] == "cold_start"]
    ok = rows[rows["status"] == "ok"]
    checks = [
        plain_check(
            GATE,
            "trials",
            f"repeats[{arm}]",
            int((ok["arm"] == arm).sum()) >= plan.repeats,
            ok_starts=int((ok["arm"] == arm).sum()),
            required=plan.repeats,
        )
        for arm in (UNMANAGED, MANAGED)
    ]
    checks += arms_differ_only_in_managed(GATE, rows)
    checks.append(same_clock_check(GATE, "cold_start", rows))
    restores = rows[rows["arm"] == MANAGED]
    missing = restores[restores["checkpoint_bytes"].isna()]["trial_id"].tolist()
    checks.append(
        plain_check(
            GATE, "trials", "every_restore_has_checkpoint_bytes", not missing, trial_ids=missing
        )
    )
    return checks


def cold_start_result(
    run: ColdStartRun, plan: Plan, ctx: RunContext, files: list[Path], plot: Path
) -> ColdStartResult:
    """The run as the stage hands it on: the speed-up, the restores, the plot, its files."""
    timed = plan.cold_start_workload
    rows = run.trials[run.trials["measure"] == "cold_start"]
    restored = rows[(rows["arm"] == MANAGED) & (rows["status"] == "ok")]
    return ColdStartResult(
        poc=ctx.poc,
        run_id=ctx.run_id,
        starts=len(rows),
        failed=run.summary.failed,
        failures=tuple(Failure.from_json(f) for f in run.failures),
        threshold=plan.success.cold_start_speedup.threshold,
        speedup=run.summary.speedup,
        speedup_warm=run.summary.speedup_warm,
        restore_throughput=run.summary.restore_throughput,
        page_cache=run.summary.page_cache,
        restores=tuple(
            Restore(r.trial_id, r.ready_s, r.restore_s, r.checkpoint_bytes, r.restore_gbps)
            for r in restored.itertuples()
        ),
        checkpoints=summarise_checkpoints(run.trials),
        plot=str(plot),
        trials_files=tuple(str(f) for f in files),
        run_dir=str(run.run_dir),
        workload=timed.name,
        ready_signal=ready_signal(timed),
        images=run.summary.images,
    )


def ready_signal(workload: Workload) -> str:
    """What ends a cold start's clocks on ``workload``, in words."""
    probe = workload.ready_probe
    if probe is None:
        return "it logs its first progress line"
    return {
        "url": f"{probe.url} answers 200",
        "tcp": f"{probe.tcp} accepts a connection",
        "exec": f"`{' '.join(probe.exec or [])}` exits 0",
        "log": f"its log has a line matching {probe.log!r}",
    }[probe.kind]
