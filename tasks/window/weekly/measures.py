"""The measured rows of a week: recovery, work lost, checkpoint cost, overhead, cold start,
goodput and busy fraction, the way out, and the sampled metrics (the package docstring says
what each pools)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.measures import (
    BUSY_FRACTION,
    CHECKPOINT_DUMP_S,
    CHECKPOINT_FREEZE_S,
    COLD_START_SPEEDUP,
    EXIT_LEFTOVERS,
    GOODPUT,
    GOODPUT_GAIN,
    GOODPUT_JOB_SPAN,
    OVERHEAD_PCT,
    RECOVERY_S,
    WORK_LOST_GPU_H,
    Measure,
)
from tasks.data.page_cache import judged
from tasks.data.row_types import JudgedRow
from tasks.experiments.stats import compare_paired, compare_speedup
from tasks.window.weekly.model import WeekRows, ok_trials, runs_of, summarize
from tasks.window.weekly.segments import week_start


def recovery_rows(c: WeekRows) -> None:
    for measure in (RECOVERY_S, WORK_LOST_GPU_H):
        crit = measure.judged_by(c.plan.success)
        for arm in (MANAGED, UNMANAGED):
            rows = ok_trials(c.trials, "recovery", arm)
            n, value, lo, hi = summarize(rows[measure.column], crit.statistic, c.n_resamples)
            c.add(
                measure,
                arm,
                n,
                value,
                f"{crit.statistic} of ok recovery trials (all faults) in segment {c.segment} "
                f"to date; 95% CI percentile bootstrap, {c.n_resamples} resamples, seed 0",
                ci=(lo, hi),
                run_ids=runs_of(rows),
            )


def checkpoint_rows(c: WeekRows) -> None:
    rows = ok_trials(c.trials, "checkpoint", MANAGED)
    for measure in (CHECKPOINT_DUMP_S, CHECKPOINT_FREEZE_S):
        col, statistic = measure.column, measure.statistic or ""
        n, value, lo, hi = summarize(rows[col], statistic, c.n_resamples)
        c.add(
            measure,
            MANAGED,
            n,
            value,
            f"{statistic} {col} of ok CRIU dumps in segment {c.segment} to date; 95% CI "
            f"percentile bootstrap",
            ci=(lo, hi),
            run_ids=runs_of(rows),
        )


def overhead_row(c: WeekRows) -> None:
    rows = ok_trials(c.trials, "overhead")
    rows = rows[rows["variant"] == "steady"].dropna(subset=["pair", "run_s"])
    # Pair numbers restart in every overhead run: a pair is (run_id, pair).
    wide = rows.pivot_table(
        index=["run_id", "pair"], columns="arm", values="run_s", aggfunc="first", observed=True
    )
    wide = wide.dropna(subset=[a for a in (MANAGED, UNMANAGED) if a in wide.columns])
    threshold = c.plan.success.overhead_pct.threshold
    if not ({MANAGED, UNMANAGED} <= set(wide.columns)) or wide.empty:
        c.add(OVERHEAD_PCT, "both", 0, None, "no complete steady pair")
        return
    cmp = compare_paired(
        wide[MANAGED].to_numpy(float),
        wide[UNMANAGED].to_numpy(float),
        threshold_pct=threshold,
        n_resamples=c.n_resamples,
    )
    # The overhead stage's verdict (by CI): met, not met, or undecided (CI straddles it).
    c.add(
        OVERHEAD_PCT,
        "both",
        cmp.n,
        cmp.overhead_pct,
        f"tasks.experiments.stats.compare_paired over steady pairs in segment {c.segment} to date: "
        f"median (managed/unmanaged run_s − 1)·100, {cmp.ci_method}; verdict by CI",
        ci=(cmp.ci_low_pct, cmp.ci_high_pct),
        verdict=cmp.verdict if cmp.verdict in ("met", "undecided") else "not met",
        note=cmp.verdict_reason,
        run_ids=runs_of(rows),
    )


def cold_start_row(c: WeekRows) -> None:
    rows = judged(ok_trials(c.trials, "cold_start"))  # the page cache dropped, never warm
    rows = rows[rows["ready_s"].notna() & (rows["ready_s"] > 0)]
    native = rows[rows["arm"] == UNMANAGED]["ready_s"].to_numpy(float)
    restore = rows[rows["arm"] == MANAGED]["ready_s"].to_numpy(float)
    crit = c.plan.success.cold_start_speedup
    if not len(native) or not len(restore):
        c.add(COLD_START_SPEEDUP, "both", 0, None, "no native and restored start")
        return
    s = compare_speedup(
        native,
        restore,
        threshold=crit.threshold,
        statistic=crit.statistic if crit.statistic in ("median", "mean") else "median",
        n_resamples=c.n_resamples,
    )
    c.add(
        COLD_START_SPEEDUP,
        "both",
        min(len(native), len(restore)),
        s.speedup,
        f"tasks.experiments.stats.compare_speedup: {s.statistic} native ready_s / "
        f"{s.statistic} "
        f"restore ready_s (n {len(native)} / {len(restore)}), {s.ci_method}; verdict by CI",
        ci=(s.ci_low, s.ci_high),
        verdict=s.verdict if s.verdict in ("met", "undecided") else "not met",
        note=s.verdict_reason,
        run_ids=runs_of(rows),
    )


@dataclass(frozen=True)
class UtilizationWeek:
    """One arm's UTILIZATION rows of a week, summed: both goodput readings and busy."""

    rows: pd.DataFrame
    jobs: int
    samples: int
    allocated_gpu_h: float
    goodput: float
    goodput_job_span: float | None
    busy: float | None
    busy_metric: str
    provisional: str

    def reading(self, measure: Measure) -> float | None:
        """The goodput reading ``measure`` names (GOODPUT_READINGS)."""
        return self.goodput if measure.name == GOODPUT.name else self.goodput_job_span


def _utilization_week(util: pd.DataFrame, week: str, arm: str) -> UtilizationWeek | None:
    rows = util[(util["week"] == week) & (util["arm"] == arm)]
    alloc = float(rows["allocated_gpu_h"].sum())
    if rows.empty or alloc <= 0:
        return None
    busy = rows.dropna(subset=["busy_fraction"])
    busy_alloc = float(busy["allocated_gpu_h"].sum())
    span = alloc + float(rows["queued_gpu_h"].sum())  # null (rows before it): no queue seen
    return UtilizationWeek(
        rows=rows,
        jobs=int(rows["jobs"].sum()),
        samples=int(rows["samples"].sum()),
        allocated_gpu_h=alloc,
        goodput=float(rows["delivered_gpu_h"].sum()) / alloc,
        # Rows written before the job-span reading have none: no figure rather than a guess.
        goodput_job_span=(
            float(rows["delivered_gpu_h"].sum()) / span
            if rows["queued_gpu_h"].notna().all()
            else None
        ),
        busy=(
            float((busy["busy_fraction"] * busy["allocated_gpu_h"]).sum()) / busy_alloc
            if busy_alloc > 0
            else None
        ),
        busy_metric=",".join(sorted(busy["busy_metric"].dropna().astype(str).unique())),
        provisional=provisional_note(rows),
    )


def provisional_note(rows: pd.DataFrame) -> str:
    """Why utilization rows may still change: '' when every chain in them had ended."""
    open_chains = int(rows["chains_open"].fillna(0).sum())
    if open_chains == 0:
        return ""
    return (
        f"provisional: {open_chains} of {int(rows['chains'].fillna(0).sum())} chains had not "
        "ended when utilization was computed"
    )


# The two readings of goodput (tasks/window/chains.py), each with how it is computed.
GOODPUT_READINGS = (
    (
        GOODPUT,
        "the seed's split: Σ delivered / Σ allocated GPU-h over the week's UTILIZATION rows "
        "(latest per workload); n = attempts",
    ),
    (
        GOODPUT_JOB_SPAN,
        "ml-goodput-measurement's reading: Σ delivered / Σ (allocated + queued) GPU-h, each "
        "chain's first start to its last end, time in the queue included; n = attempts",
    ),
)


def utilization_rows(c: WeekRows, util: pd.DataFrame, seg_weeks: list[str]) -> None:
    for arm in (MANAGED, UNMANAGED):
        u = _utilization_week(util, c.week, arm)
        runs = runs_of(u.rows) if u else []
        provisional = u.provisional if u else ""
        for measure, method in GOODPUT_READINGS:
            c.add(
                measure,
                arm,
                u.jobs if u else 0,
                u.reading(measure) if u else None,
                method,
                run_ids=runs,
                note=provisional,
                provisional=provisional,
            )
        c.add(
            BUSY_FRACTION,
            arm,
            u.samples if u and u.busy is not None else 0,
            u.busy if u else None,
            "busy_fraction weighted by allocated GPU-h over the week's UTILIZATION rows"
            + (f" (metric {u.busy_metric})" if u and u.busy_metric else "")
            + "; n = samples",
            # procfs busy is CPU cores (tasks.window.utilization), never a GPU fraction
            unit="cores" if u and "cores" in (u.busy_metric or "") else None,
            run_ids=runs,
            provisional=provisional,
        )
    crit = c.plan.success.utilization_gain
    gains, runs, still_open = [], [], []
    for w in seg_weeks:
        m, un = _utilization_week(util, w, MANAGED), _utilization_week(util, w, UNMANAGED)
        if m and un:
            gains.append(m.goodput - un.goodput)
            runs += runs_of(m.rows) + runs_of(un.rows)
            still_open += [w] if m.provisional or un.provisional else []
    n, value, lo, hi = summarize(pd.Series(gains, dtype=float), crit.statistic, c.n_resamples)
    verdict, note = None, ""
    if 0 < n < crit.min_weeks:
        # Less evidence than the plan asks for decides nothing yet, either way.
        verdict = "undecided"
        note = (
            f"needs {crit.min_weeks}, has {n}: weeks with both arms "
            "(success.utilization_gain.min_weeks)"
        )
    c.add(
        GOODPUT_GAIN,
        "both",
        n,
        value,
        f"{crit.statistic} over the weeks of segment {c.segment} to date of managed − "
        "unmanaged goodput (of allocated GPU-h); n = weeks with both arms",
        ci=(lo, hi),
        verdict=verdict,
        note=note,
        run_ids=runs,
        provisional=(
            f"provisional: weeks {', '.join(still_open)} hold chains that had not ended"
            if still_open
            else ""
        ),
    )


def exit_row(c: WeekRows, verdicts: pd.DataFrame) -> None:
    """The way out as tried so far: each node's newest exit diff up to the end of the week
    (docs/design.md §1.8); met only when every node diffed clean."""
    end = week_start(c.week) + pd.Timedelta(days=7)
    done = verdicts[verdicts["diffed_at"] < end].sort_values("diffed_at")
    latest = done.groupby("node", as_index=False).last() if len(done) else done
    dirty = latest[latest["leftovers"] > 0] if len(latest) else latest
    c.add(
        EXIT_LEFTOVERS,
        "both",
        len(latest),
        float(latest["leftovers"].sum()) if len(latest) else None,
        "the newest exit diff of each node to the end of the week (before_install → "
        "after_uninstall snapshots); n = nodes diffed",
        verdict=None if not len(latest) else ("not met" if len(dirty) else "met"),
        note=", ".join(f"{r.node}: {r.leftovers} leftover(s)" for r in dirty.itertuples()),
        run_ids=list(latest["run_id"]) if len(latest) else [],
    )


# The sample metrics the report shows per arm (a duty cycle, SM activity, CPU: never mixed).
SAMPLED_METRICS = ("gpu_utilization", "sm_activity", "cpu_utilization")


def sampled_rows(summary: pd.DataFrame, week: str, segment: int) -> list[JudgedRow]:
    """One 'info' row per (sampled metric, arm) of the week from the samples summary
    (tasks.window.sample_summary): the time-weighted mean, with p50/p95 in the method."""
    rows: list[JudgedRow] = []
    week_rows = summary[(summary["week"] == week) & summary["arm"].notna()]
    for (metric, arm, device, unit), group in week_rows.groupby(
        ["metric", "arm", "device", "unit"], dropna=True
    ):
        if metric not in SAMPLED_METRICS:
            continue
        covered = float(group["covered_s"].sum())
        mean = float((group["mean"] * group["covered_s"]).sum() / covered) if covered > 0 else None
        rows.append(
            {
                "week": week,
                "week_start": week_start(week),
                "measure": f"sampled_{metric}",
                "arm": arm,
                "n": int(group["n"].sum()),
                "value": mean,
                "ci_low": None,
                "ci_high": None,
                "unit": str(unit),
                "method": (
                    f"time-weighted mean of {device} samples over {covered:.0f} s "
                    f"(p50 {float(group['p50'].median()):.3g}, p95 {float(group['p95'].max()):.3g})"
                ),
                "basis": "measured",
                "inputs": None,
                "threshold": None,
                "verdict": "info" if mean is not None else "no data",
                "note": f"{device} data" + ("" if device == "gpu" else ", not a GPU figure"),
                "segment": segment,
                "provisional": False,
                "criterion": None,
                "statistic": None,
                "at_most": None,
            }
        )
    return rows
