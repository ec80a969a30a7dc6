"""The weekly report: one REPORTS row per (measure, arm, ISO week), its change points and gaps.

Plain functions, no Prefect (the ``weekly_report`` flow wraps ``build_weekly_report``).

Definitions (DESIGN §4; the report says them too):

- **Pooling.** Trial-based rows (recovery, work lost, overhead, cold start, checkpoint cost and
  the extrapolations built on them) pool every trial from the start of the week's
  *comparability segment* up to and including the week: cumulative to date, restarted at a
  change point, never across one. Utilization and goodput are per week (that week's
  UTILIZATION rows only); the measured goodput gain is the plan's statistic over the
  segment's weekly gains so far.
- **Segments.** Per source dataset (trials, utilization, samples when given) a week's
  fingerprint is the sorted set of fp_driver, fp_cuda, fp_kernel, the checkpointer's version
  (``fp_versions[<checkpointer kind>]``) and fp_host over that week's rows of that source.
  A week whose fingerprint differs from the last one that source had is a change point and
  starts a new segment. Sources are compared with themselves only, so a week without trials
  is no change. The granularity is the week: a change in mid-week puts the whole week in
  the new segment.
- **λ** (interruptions per hour of job time) = exposed allocations / GPU-hours of the latest
  baseline's exposure rows (kind 'state', EXPOSED_STATES count as interruptions, TIMEOUT
  included) × the plan's workload GPUs. Without GPU-hours: exposed allocations / node-hours
  (a one-node job). M = 1/λ.
- **δ** (checkpoint cost, s) = median freeze_s of ok managed checkpoint trials (the time the
  workload is stopped); median dump_s when no freeze time was recorded.
- **R** = median recovery_s of ok recovery trials of the arm. The unmanaged arm also loses its
  median work_lost_s (compute since its recoverable point) per interruption.
- **Waste** (first order, Young/Daly): managed W = δ/τ + λ(τ/2 + R_managed) at the plan's
  checkpointer.interval_s; unmanaged W = λ(L_unmanaged + R_unmanaged). Expected goodput =
  1 − W; the expected gain is their difference, set beside the measured gain.
"""

from __future__ import annotations

import datetime as dt
import html
import io
import json
import math
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tasks.baseline.exposure import EXPOSED_STATES
from tasks.data import weeks
from tasks.data.datasets import (
    EXIT_VERDICTS,
    EXPOSURE,
    GATES,
    REPORTS,
    SAMPLE_GAPS,
    SAMPLES,
    TRIALS,
    UTILIZATION,
    DatasetSpec,
    dataset_files,
    normalise_dtypes,
    read_dataset,
    write_dataset,
)
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext
from tasks.data.weeks import current_week
from tasks.experiments.report import verdict_line
from tasks.experiments.stats import bootstrap_ci, compare_paired, compare_speedup

# The frames weekly_report_rows reads, by dataset name; 'samples' is optional (fingerprints).
INPUTS: dict[str, DatasetSpec] = {
    "trials": TRIALS,
    "exposure": EXPOSURE,
    "gates": GATES,
    "utilization": UTILIZATION,
    "sample_gaps": SAMPLE_GAPS,
    "exit_verdicts": EXIT_VERDICTS,
}
FINGERPRINT_FIELDS = ("driver", "cuda", "kernel", "checkpointer", "nodes")
# Report columns this module computes; build_weekly_report adds the stamp and computed_at.
ROW_COLUMNS = (
    "week",
    "week_start",
    "measure",
    "arm",
    "n",
    "value",
    "ci_low",
    "ci_high",
    "unit",
    "method",
    "basis",
    "inputs",
    "threshold",
    "verdict",
    "note",
    "segment",
)
# Extra, not persisted: the plan criterion a row answers.
EXTRA_COLUMNS = ("criterion", "statistic", "at_most")

# Measure → the plan criterion judging it and its direction (True: value ≤ threshold).
CRITERIA: dict[str, tuple[str, bool]] = {
    "recovery_s": ("recovery_time_s", True),
    "work_lost_gpu_h": ("work_lost_gpu_h", True),
    "goodput_gain": ("utilization_gain", False),
    "overhead_pct": ("overhead_pct", True),
    "cold_start_speedup": ("cold_start_speedup", False),
}
# Which gates' failures block a measure's row (gate names as the stages record them).
MEASURE_GATES: dict[str, tuple[str, ...]] = {
    "recovery_s": ("recovery",),
    "work_lost_gpu_h": ("recovery",),
    "overhead_pct": ("overhead",),
    "cold_start_speedup": ("cold_start",),
    "checkpoint_dump_s": ("overhead", "cold_start", "recovery"),
    "checkpoint_freeze_s": ("overhead", "cold_start", "recovery"),
    "goodput": ("utilization",),
    "utilization": ("utilization",),
    "goodput_gain": ("utilization",),
    "checkpoint_interval_s": ("recovery", "overhead", "cold_start", "baseline"),
    "waste_fraction": ("recovery", "overhead", "cold_start", "baseline"),
    "goodput_gain_expected": ("recovery", "overhead", "cold_start", "baseline"),
}
TITLES = {
    "recovery_s": "recovery time",
    "work_lost_gpu_h": "work lost per interruption",
    "goodput": "goodput",
    "utilization": "busy fraction",
    "goodput_gain": "goodput gain (managed − unmanaged)",
    "overhead_pct": "steady-state overhead",
    "cold_start_speedup": "cold-start speed-up (native / restore)",
    "checkpoint_dump_s": "checkpoint dump",
    "checkpoint_freeze_s": "checkpoint freeze",
    "checkpoint_interval_s": "optimal checkpoint interval (Daly)",
    "waste_fraction": "expected waste at the plan's interval",
    "exit_leftovers": "items left on the nodes after uninstall",
    "goodput_gain_expected": "expected goodput gain (waste model)",
}
N_RESAMPLES = 10_000


# --- Young / Daly ------------------------------------------------------------------------------


def young_interval(delta: float, mtbf: float) -> float:
    """Young 1974: τ = √(2δM). δ (checkpoint cost) and M (MTBF) in the same unit."""
    _positive_pair(delta, mtbf)
    return math.sqrt(2 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly 2006, eq. 37: τ = √(2δM)·[1 + ⅓√(δ/2M) + (1/9)(δ/2M)] − δ for δ < 2M, else M."""
    _positive_pair(delta, mtbf)
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def expected_waste(delta: float, tau: float, rate: float, restart: float) -> float:
    """First-order waste fraction δ/τ + λ(τ/2 + R) (DESIGN §4); λ per unit of τ's time."""
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    return delta / tau + rate * (tau / 2 + restart)


def _positive_pair(delta: float, mtbf: float) -> None:
    for name, v in (("delta", delta), ("mtbf", mtbf)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be finite and > 0, got {v}")


# --- ISO weeks ---------------------------------------------------------------------------------


def week_start(week: str) -> pd.Timestamp:
    return pd.Timestamp(weeks.week_start(week))


def week_label(ts: Any) -> str:
    return weeks.week_label(pd.Timestamp(ts))


def _weeks_between(first: str, last: str) -> list[str]:
    out, t, end = [], week_start(first), week_start(last)
    while t <= end:
        out.append(week_label(t))
        t += pd.Timedelta(weeks=1)
    return out


def _week_of(series: pd.Series) -> pd.Series:
    """ISO week labels of a timestamp column (null stays null)."""
    ts = pd.to_datetime(series.astype("datetime64[us, UTC]"), utc=True)
    iso = ts.dt.isocalendar()
    return iso["year"].astype("string") + "-W" + iso["week"].astype("string").str.zfill(2)


# --- inputs ------------------------------------------------------------------------------------


def _frame(frames: Mapping[str, pd.DataFrame], name: str) -> pd.DataFrame:
    spec = INPUTS[name]
    df = frames.get(name)
    if df is None:
        df = pd.DataFrame({c: [] for c in spec.column_names})
    return normalise_dtypes(df.copy(), spec)


def _latest_utilization(util: pd.DataFrame) -> pd.DataFrame:
    """The daily utilization flow recomputes the current week: keep the latest row per
    (week, arm, workload)."""
    if util.empty:
        return util
    util = util.sort_values("computed_at")
    return util.drop_duplicates(["week", "arm", "workload"], keep="last")


# --- comparability -----------------------------------------------------------------------------


def _fingerprint(rows: pd.DataFrame, checkpointer: str) -> dict[str, str]:
    def values(col: str) -> str:
        return ",".join(sorted({str(v) for v in rows[col].dropna()})) or "unknown"

    versions = set()
    for raw in rows["fp_versions"].dropna():
        try:
            versions.add(str(json.loads(raw).get(checkpointer, "none")))
        except (ValueError, AttributeError):
            versions.add("unreadable")
    return {
        "driver": values("fp_driver"),
        "cuda": values("fp_cuda"),
        "kernel": values("fp_kernel"),
        "checkpointer": ",".join(sorted(versions)) or "unknown",
        "nodes": values("fp_host"),
    }


@dataclass
class Segments:
    """Which segment each week is in, and the change points that split them."""

    of_week: dict[str, int]
    change_points: list[dict[str, Any]]

    def weeks_to_date(self, week: str) -> list[str]:
        """The weeks of ``week``'s segment up to and including it."""
        seg = self.of_week[week]
        return [w for w, s in self.of_week.items() if s == seg and w <= week]


def segments(
    sources: Mapping[str, tuple[pd.DataFrame, pd.Series]], checkpointer: str, week: str
) -> Segments:
    """Split the weeks up to ``week`` at every fingerprint change of any source.
    ``sources``: name → (rows, their ISO week labels)."""
    weeks_seen = sorted(
        {w for _, labels in sources.values() for w in labels.dropna().unique() if w <= week}
    )
    first = weeks_seen[0] if weeks_seen else week
    last: dict[str, dict[str, str]] = {}
    of_week: dict[str, int] = {}
    cps: list[dict[str, Any]] = []
    seg = 0
    for w in _weeks_between(first, week):
        changes = []
        for name, (rows, labels) in sources.items():
            mine = rows[(labels == w).fillna(False).to_numpy()]
            if mine.empty:
                continue
            fp = _fingerprint(mine, checkpointer)
            before = last.get(name)
            if before is not None and before != fp:
                changes += [
                    {"source": name, "field": f, "before": before[f], "after": fp[f]}
                    for f in FINGERPRINT_FIELDS
                    if before[f] != fp[f]
                ]
            last[name] = fp
        if changes:
            seg += 1
            cps.append({"week": w, "segment": seg, "changes": changes})
        of_week[w] = seg
    return Segments(of_week, cps)


# --- statistics ----------------------------------------------------------------------------------


def _p90(a: np.ndarray, axis: int | None = None) -> Any:
    return np.percentile(a, 90, axis=axis)


STATISTICS: dict[str, Callable[..., Any]] = {
    "median": np.median,
    "mean": np.mean,
    "min": np.min,
    "max": np.max,
    "p90": _p90,
}


def _summary(
    values: pd.Series, statistic: str, n_resamples: int = N_RESAMPLES
) -> tuple[int, float | None, float | None, float | None]:
    """n, statistic and its percentile-bootstrap 95% CI (CI only from 2 values up)."""
    arr = values.dropna().astype(float).to_numpy()
    if len(arr) == 0:
        return 0, None, None, None
    fn = STATISTICS[statistic]
    value = float(fn(arr))
    if len(arr) < 2:
        return len(arr), value, None, None
    lo, hi = bootstrap_ci(arr, fn, n_resamples=n_resamples)
    return len(arr), value, lo, hi


def _compare(value: float | None, threshold: float, at_most: bool) -> str:
    if value is None:
        return "no data"
    ok = value <= threshold if at_most else value >= threshold
    return "met" if ok else "not met"


# --- rows ----------------------------------------------------------------------------------------


@dataclass
class _Ctx:
    plan: Plan
    week: str
    segment: int
    trials: pd.DataFrame  # the segment's trials to date
    failed_gates: dict[str, list[dict[str, str]]]  # run_id → failed checks
    n_resamples: int = N_RESAMPLES
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(
        self,
        measure: str,
        arm: str,
        n: int,
        value: float | None,
        unit: str,
        method: str,
        *,
        ci: tuple[float | None, float | None] = (None, None),
        basis: str = "measured",
        inputs: dict[str, Any] | None = None,
        verdict: str | None = None,
        note: str = "",
        run_ids: Sequence[str] = (),
    ) -> dict[str, Any]:
        crit_name, at_most = CRITERIA.get(measure, (None, True))
        crit = getattr(self.plan.success, crit_name) if crit_name else None
        judged = crit is not None and (arm == "both" or arm == "managed")
        if n == 0 or value is None:
            verdict = "no data"
        elif verdict is None:
            verdict = _compare(value, crit.threshold, at_most) if judged else "info"
        blocked = [
            {"run_id": r, **c}
            for r in sorted(set(run_ids))
            for c in self.failed_gates.get(r, [])
            if c["gate"] in MEASURE_GATES.get(measure, ())
        ]
        if blocked and verdict != "no data":
            verdict = "blocked"
            note = "a gate failed on rows it pools: " + "; ".join(
                f"{b['gate']}/{b['expectation']} (run {b['run_id']})" for b in blocked
            )
            inputs = {**(inputs or {}), "blocked_by": blocked}
        row = {
            "week": self.week,
            "week_start": week_start(self.week),
            "measure": measure,
            "arm": arm,
            "n": int(n),
            "value": value,
            "ci_low": ci[0],
            "ci_high": ci[1],
            "unit": unit,
            "method": method,
            "basis": basis,
            "inputs": json.dumps(inputs, sort_keys=True, default=str) if inputs else None,
            "threshold": float(crit.threshold) if judged else None,
            "verdict": verdict,
            "segment": self.segment,
            "criterion": crit_name if judged else None,
            "statistic": crit.statistic if judged else None,
            "at_most": at_most,
            "note": note,
        }
        self.rows.append(row)
        return row


def _ok(trials: pd.DataFrame, measure: str, arm: str | None = None) -> pd.DataFrame:
    rows = trials[(trials["measure"] == measure) & (trials["status"] == "ok")]
    return rows if arm is None else rows[rows["arm"] == arm]


def _runs(rows: pd.DataFrame) -> list[str]:
    return sorted(rows["run_id"].dropna().astype(str).unique())


def _recovery_rows(c: _Ctx) -> None:
    success = c.plan.success
    for measure, crit, unit in (
        ("recovery_s", success.recovery_time_s, "s"),
        ("work_lost_gpu_h", success.work_lost_gpu_h, "GPU-h"),
    ):
        for arm in ("managed", "unmanaged"):
            rows = _ok(c.trials, "recovery", arm)
            n, value, lo, hi = _summary(rows[measure], crit.statistic, c.n_resamples)
            c.add(
                measure,
                arm,
                n,
                value,
                unit,
                f"{crit.statistic} of ok recovery trials (all faults) in segment {c.segment} "
                f"to date; 95% CI percentile bootstrap, {c.n_resamples} resamples, seed 0",
                ci=(lo, hi),
                run_ids=_runs(rows),
            )


def _checkpoint_rows(c: _Ctx) -> None:
    rows = _ok(c.trials, "checkpoint", "managed")
    for measure, col in (("checkpoint_dump_s", "dump_s"), ("checkpoint_freeze_s", "freeze_s")):
        n, value, lo, hi = _summary(rows[col], "median", c.n_resamples)
        c.add(
            measure,
            "managed",
            n,
            value,
            "s",
            f"median {col} of ok CRIU dumps in segment {c.segment} to date; 95% CI "
            f"percentile bootstrap",
            ci=(lo, hi),
            run_ids=_runs(rows),
        )


def _overhead_row(c: _Ctx) -> None:
    rows = _ok(c.trials, "overhead")
    rows = rows[rows["variant"] == "steady"].dropna(subset=["pair", "run_s"])
    # Pair numbers restart in every overhead run: a pair is (run_id, pair).
    wide = rows.pivot_table(
        index=["run_id", "pair"], columns="arm", values="run_s", aggfunc="first", observed=True
    )
    wide = wide.dropna(subset=[a for a in ("managed", "unmanaged") if a in wide.columns])
    threshold = c.plan.success.overhead_pct.threshold
    if not ({"managed", "unmanaged"} <= set(wide.columns)) or wide.empty:
        c.add("overhead_pct", "both", 0, None, "%", "no complete steady pair")
        return
    cmp = compare_paired(
        wide["managed"].to_numpy(float),
        wide["unmanaged"].to_numpy(float),
        threshold_pct=threshold,
        n_resamples=c.n_resamples,
    )
    # The overhead stage's verdict (by CI): met, not met, or undecided (CI straddles it).
    c.add(
        "overhead_pct",
        "both",
        cmp["n"],
        cmp["overhead_pct"],
        "%",
        f"tasks.experiments.stats.compare_paired over steady pairs in segment {c.segment} to date: "
        f"median (managed/unmanaged run_s − 1)·100, {cmp['ci_method']}; verdict by CI",
        ci=(cmp["ci_low_pct"], cmp["ci_high_pct"]),
        verdict=cmp["verdict"] if cmp["verdict"] in ("met", "undecided") else "not met",
        note=f"{cmp['verdict']}: {cmp['verdict_reason']}",
        run_ids=_runs(rows),
    )


def _cold_start_row(c: _Ctx) -> None:
    rows = _ok(c.trials, "cold_start")
    rows = rows[rows["ready_s"].notna() & (rows["ready_s"] > 0)]
    native = rows[rows["arm"] == "unmanaged"]["ready_s"].to_numpy(float)
    restore = rows[rows["arm"] == "managed"]["ready_s"].to_numpy(float)
    crit = c.plan.success.cold_start_speedup
    if not len(native) or not len(restore):
        c.add("cold_start_speedup", "both", 0, None, "×", "no native and restored start")
        return
    s = compare_speedup(
        native,
        restore,
        threshold=crit.threshold,
        statistic=crit.statistic if crit.statistic in ("median", "mean") else "median",
        n_resamples=c.n_resamples,
    )
    c.add(
        "cold_start_speedup",
        "both",
        min(len(native), len(restore)),
        s["speedup"],
        "×",
        f"tasks.experiments.stats.compare_speedup: {s['statistic']} native ready_s / "
        f"{s['statistic']} "
        f"restore ready_s (n {len(native)} / {len(restore)}), {s['ci_method']}; verdict by CI",
        ci=(s["ci_low"], s["ci_high"]),
        verdict=s["verdict"] if s["verdict"] in ("met", "undecided") else "not met",
        note=f"{s['verdict']}: {s['verdict_reason']}",
        run_ids=_runs(rows),
    )


def _utilization_week(util: pd.DataFrame, week: str, arm: str) -> dict[str, Any] | None:
    rows = util[(util["week"] == week) & (util["arm"] == arm)]
    alloc = float(rows["allocated_gpu_h"].sum())
    if rows.empty or alloc <= 0:
        return None
    busy = rows.dropna(subset=["busy_fraction"])
    busy_alloc = float(busy["allocated_gpu_h"].sum())
    return {
        "rows": rows,
        "jobs": int(rows["jobs"].sum()),
        "samples": int(rows["samples"].sum()),
        "allocated_gpu_h": alloc,
        "goodput": float(rows["delivered_gpu_h"].sum()) / alloc,
        "busy": (
            float((busy["busy_fraction"] * busy["allocated_gpu_h"]).sum()) / busy_alloc
            if busy_alloc > 0
            else None
        ),
        "busy_metric": ",".join(sorted(busy["busy_metric"].dropna().astype(str).unique())),
    }


def _utilization_rows(c: _Ctx, util: pd.DataFrame, seg_weeks: list[str]) -> None:
    for arm in ("managed", "unmanaged"):
        u = _utilization_week(util, c.week, arm)
        runs = _runs(u["rows"]) if u else []
        c.add(
            "goodput",
            arm,
            u["jobs"] if u else 0,
            u["goodput"] if u else None,
            "fraction",
            "Σ delivered / Σ allocated GPU-h over the week's UTILIZATION rows (latest per "
            "workload); n = attempts",
            run_ids=runs,
        )
        c.add(
            "utilization",
            arm,
            u["samples"] if u and u["busy"] is not None else 0,
            u["busy"] if u else None,
            # procfs busy is CPU cores (tasks.window.utilization), never a GPU fraction
            "cores" if u and "cores" in (u["busy_metric"] or "") else "fraction",
            "busy_fraction weighted by allocated GPU-h over the week's UTILIZATION rows"
            + (f" (metric {u['busy_metric']})" if u and u["busy_metric"] else "")
            + "; n = samples",
            run_ids=runs,
        )
    crit = c.plan.success.utilization_gain
    gains, runs = [], []
    for w in seg_weeks:
        m, un = _utilization_week(util, w, "managed"), _utilization_week(util, w, "unmanaged")
        if m and un:
            gains.append(m["goodput"] - un["goodput"])
            runs += _runs(m["rows"]) + _runs(un["rows"])
    n, value, lo, hi = _summary(pd.Series(gains, dtype=float), crit.statistic, c.n_resamples)
    verdict, note = None, ""
    if 0 < n < crit.min_weeks:
        verdict = "not met"
        note = f"{n} week(s) with both arms; the criterion needs {crit.min_weeks} (min_weeks)"
    c.add(
        "goodput_gain",
        "both",
        n,
        value,
        "fraction",
        f"{crit.statistic} over the weeks of segment {c.segment} to date of managed − "
        "unmanaged goodput; n = weeks with both arms",
        ci=(lo, hi),
        verdict=verdict,
        note=note,
        run_ids=runs,
    )


def _exit_row(c: _Ctx, verdicts: pd.DataFrame) -> None:
    """The way out as tried so far: each node's newest exit diff up to the end of the week
    (DESIGN §1.8); met only when every node diffed clean."""
    end = week_start(c.week) + pd.Timedelta(days=7)
    done = verdicts[verdicts["diffed_at"] < end].sort_values("diffed_at")
    latest = done.groupby("node", as_index=False).last() if len(done) else done
    dirty = latest[latest["leftovers"] > 0] if len(latest) else latest
    c.add(
        "exit_leftovers",
        "both",
        len(latest),
        float(latest["leftovers"].sum()) if len(latest) else None,
        "items",
        "the newest exit diff of each node to the end of the week (before_install → "
        "after_uninstall snapshots); n = nodes diffed",
        verdict=None if not len(latest) else ("not met" if len(dirty) else "met"),
        note=", ".join(f"{r.node}: {r.leftovers} leftover(s)" for r in dirty.itertuples()),
        run_ids=list(latest["run_id"]) if len(latest) else [],
    )


def interruption_rate(exposure: pd.DataFrame, gpus: int) -> dict[str, Any] | None:
    """λ per hour of job time from the latest baseline's exposure rows (module docstring)."""
    states = exposure[exposure["kind"] == "state"]
    if states.empty:
        return None
    latest = states.sort_values("computed_at")["run_id"].iloc[-1]
    states = states[states["run_id"] == latest]
    exposed = int(states[states["state"].isin(EXPOSED_STATES)]["allocations"].sum())
    gpu_h, node_h = float(states["gpu_hours"].sum()), float(states["node_hours"].sum())
    if gpu_h > 0 and gpus > 0:
        per_h, basis = exposed / gpu_h * gpus, f"interruptions per GPU-hour × {gpus} GPU(s)"
    elif node_h > 0:
        per_h, basis = exposed / node_h, "interruptions per node-hour (one-node job)"
    else:
        return None
    return {
        "run_id": str(latest),
        "states": sorted(states["state"].dropna().astype(str)),
        "interruptions": exposed,
        "interrupted_states": list(EXPOSED_STATES),
        "gpu_hours": gpu_h,
        "node_hours": node_h,
        "lambda_per_h": per_h,
        "lambda_basis": basis,
    }


def _median(values: pd.Series) -> float | None:
    v = values.dropna().astype(float)
    return float(v.median()) if not v.empty else None


def _extrapolated_rows(c: _Ctx, exposure: pd.DataFrame, measured_gain: float | None) -> None:
    plan = c.plan
    lam = interruption_rate(exposure, plan.workload.gpus)
    ckpt = _ok(c.trials, "checkpoint", "managed")
    freeze, dump = _median(ckpt["freeze_s"]), _median(ckpt["dump_s"])
    delta = freeze if freeze is not None else dump
    n_delta = int(ckpt["freeze_s" if freeze is not None else "dump_s"].notna().sum())
    rec_m, rec_u = _ok(c.trials, "recovery", "managed"), _ok(c.trials, "recovery", "unmanaged")
    r_m, r_u = _median(rec_m["recovery_s"]), _median(rec_u["recovery_s"])
    lost_u = _median(rec_u["work_lost_s"])
    lost_from = "median work_lost_s"
    if lost_u is None and plan.workload.gpus > 0 and _median(rec_u["work_lost_gpu_h"]) is not None:
        lost_u = _median(rec_u["work_lost_gpu_h"]) * 3600 / plan.workload.gpus
        lost_from = "median work_lost_gpu_h × 3600 / workload GPUs"
    tau_plan = float(plan.checkpointer.interval_s)
    inputs: dict[str, Any] = {
        "exposure": lam,
        "delta_s": delta,
        "delta_from": "median freeze_s" if freeze is not None else "median dump_s",
        "checkpoint_trials": {"n": n_delta, "run_ids": _runs(ckpt)},
        "R_managed_s": r_m,
        "R_unmanaged_s": r_u,
        "L_unmanaged_s": lost_u,
        "L_unmanaged_from": lost_from,
        "recovery_trials": {
            "managed": len(rec_m),
            "unmanaged": len(rec_u),
            "run_ids": _runs(pd.concat([rec_m, rec_u])),
        },
        "tau_plan_s": tau_plan,
        "segment": c.segment,
    }
    runs = [*_runs(ckpt), *_runs(rec_m), *_runs(rec_u), *([lam["run_id"]] if lam else [])]
    rate_s = lam["lambda_per_h"] / 3600 if lam else None
    missing = [k for k, v in (("λ", lam), ("δ", delta), ("R_managed", r_m)) if v is None]

    tau_opt = None
    if not missing and rate_s and delta and delta > 0:
        mtbf = 1 / rate_s
        tau_opt = daly_interval(delta, mtbf)
        inputs.update(
            mtbf_s=mtbf,
            young_s=young_interval(delta, mtbf),
            daly_s=tau_opt,
            waste_at_optimum=expected_waste(delta, tau_opt, rate_s, r_m),
            waste_at_plan=expected_waste(delta, tau_plan, rate_s, r_m),
        )
    why = "missing " + ", ".join(missing) if missing else "no interruption in the baseline"
    c.add(
        "checkpoint_interval_s",
        "managed",
        n_delta if tau_opt is not None else 0,
        tau_opt,
        "s",
        "Daly 2006 eq. 37 with δ and M = 1/λ (Young's √(2δM) in inputs)",
        basis="extrapolated",
        inputs=inputs,
        note="" if tau_opt is not None else why,
        run_ids=runs,
    )
    waste_m = None
    if not missing and delta is not None and r_m is not None and rate_s is not None:
        waste_m = expected_waste(delta, tau_plan, rate_s, r_m)
    c.add(
        "waste_fraction",
        "managed",
        n_delta if waste_m is not None else 0,
        waste_m,
        "fraction",
        "δ/τ + λ(τ/2 + R) at the plan's checkpointer.interval_s (first order)",
        basis="extrapolated",
        inputs=inputs,
        note="" if waste_m is not None else "missing " + ", ".join(missing),
        run_ids=runs,
    )
    gain, note = None, ""
    if waste_m is not None and rate_s is not None and r_u is not None and lost_u is not None:
        waste_u = rate_s * (lost_u + r_u)
        # Goodput cannot leave [0, 1]; first order breaks down when waste nears 1 (window.md).
        good_m, good_u = min(1.0, max(0.0, 1 - waste_m)), min(1.0, max(0.0, 1 - waste_u))
        gain = good_m - good_u
        inputs = {
            **inputs,
            "waste_unmanaged": waste_u,
            "goodput_managed_expected": good_m,
            "goodput_unmanaged_expected": good_u,
            "goodput_gain_measured": measured_gain,
        }
        if max(waste_m, waste_u) >= 0.5:
            note = "waste ≥ 0.5: the first-order model is unreliable here"
    else:
        note = "missing " + ", ".join(
            [
                *missing,
                *(["R_unmanaged"] if r_u is None else []),
                *(["L_unmanaged"] if lost_u is None else []),
            ]
        )
    c.add(
        "goodput_gain_expected",
        "both",
        (len(rec_m) + len(rec_u) + n_delta) if gain is not None else 0,
        gain,
        "fraction",
        "(1 − W_managed) − (1 − W_unmanaged); W_managed = δ/τ + λ(τ/2 + R_managed) at the "
        "plan's interval, W_unmanaged = λ(L_unmanaged + R_unmanaged)",
        basis="extrapolated",
        inputs=inputs,
        note=note,
        run_ids=runs,
    )


def _failed_gates(gates: pd.DataFrame) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    failed = gates[gates["success"] == False]  # noqa: E712 (nullable Arrow booleans)
    for _, g in failed.iterrows():
        out.setdefault(str(g["run_id"]), []).append(
            {"gate": str(g["gate"]), "expectation": str(g["expectation"])}
        )
    return out


def _gaps(sample_gaps: pd.DataFrame, week: str) -> list[dict[str, Any]]:
    start = week_start(week)
    end = start + pd.Timedelta(weeks=1)
    g = sample_gaps[(sample_gaps["t_from"] < end) & (sample_gaps["t_to"] > start)]
    g = g.drop_duplicates(["node", "source", "entity", "metric", "t_from"]).sort_values("t_from")
    return [
        {
            "node": str(r["node"]),
            "source": str(r["source"]),
            "entity": None if pd.isna(r["entity"]) else str(r["entity"]),
            "metric": None if pd.isna(r["metric"]) else str(r["metric"]),
            "from": pd.Timestamp(r["t_from"]).isoformat(),
            "to": pd.Timestamp(r["t_to"]).isoformat(),
            "seconds": float(r["gap_s"]),
            "reason": str(r["reason"]),
            "detected_by": str(r["detected_by"]),
        }
        for _, r in g.iterrows()
    ]


def _sources(
    frames: Mapping[str, pd.DataFrame], trials: pd.DataFrame, util: pd.DataFrame
) -> dict[str, tuple[pd.DataFrame, pd.Series]]:
    sources = {"trials": (trials, _week_of(trials["started_at"]))}
    sources["utilization"] = (util, util["week"].astype("string"))
    samples = frames.get("samples")
    if samples is not None and not samples.empty:
        sources["samples"] = (samples, _week_of(samples["t_to"]))
    return sources


def weekly_report_rows(
    plan: Plan,
    frames: Mapping[str, pd.DataFrame],
    week: str,
    *,
    n_resamples: int = N_RESAMPLES,
) -> tuple[pd.DataFrame, list[dict[str, Any]], list[dict[str, Any]]]:
    """The REPORTS rows of ISO ``week`` (without stamp and computed_at), every change point up
    to and including it, and the week's sample gaps. ``frames``: dataset name → frame as
    read_dataset returns it (missing ones are empty)."""
    week_start(week)  # refuse a malformed label early
    trials = _frame(frames, "trials")
    util = _latest_utilization(_frame(frames, "utilization"))
    segs = segments(_sources(frames, trials, util), plan.checkpointer.kind, week)
    seg_weeks = segs.weeks_to_date(week)
    pooled = trials[_week_of(trials["started_at"]).isin(seg_weeks).fillna(False).to_numpy()]
    failed = _failed_gates(_frame(frames, "gates"))
    c = _Ctx(plan, week, segs.of_week[week], pooled, failed, n_resamples)
    _recovery_rows(c)
    _checkpoint_rows(c)
    _overhead_row(c)
    _cold_start_row(c)
    _utilization_rows(c, util, seg_weeks)
    measured_gain = next(
        (r["value"] for r in c.rows if r["measure"] == "goodput_gain" and r["n"]), None
    )
    _extrapolated_rows(c, _frame(frames, "exposure"), measured_gain)
    _exit_row(c, _frame(frames, "exit_verdicts"))
    rows = pd.DataFrame(c.rows, columns=[*ROW_COLUMNS, *EXTRA_COLUMNS])
    return rows, segs.change_points, _gaps(_frame(frames, "sample_gaps"), week)


@dataclass
class Series:
    """What the plots need: every week's rows so far, and the week's pooled trials."""

    weeks: pd.DataFrame
    trials: pd.DataFrame
    workloads: list[str]


def weekly_series(
    plan: Plan,
    frames: Mapping[str, pd.DataFrame],
    week: str,
    rows: pd.DataFrame | None = None,
    *,
    n_resamples: int = 1_000,
) -> Series:
    """Every week's rows up to ``week`` for the plots. Past weeks' CIs use ``n_resamples``
    (fewer than the report's: months of weeks would otherwise take minutes); ``rows``, when
    given, stands for ``week`` itself so the plotted week equals its report rows."""
    trials = _frame(frames, "trials")
    util = _latest_utilization(_frame(frames, "utilization"))
    segs = segments(_sources(frames, trials, util), plan.checkpointer.kind, week)
    weeks = [
        rows
        if rows is not None and w == week
        else weekly_report_rows(plan, frames, w, n_resamples=n_resamples)[0]
        for w in segs.of_week
    ]
    seg_weeks = segs.weeks_to_date(week)
    pooled = trials[_week_of(trials["started_at"]).isin(seg_weeks).fillna(False).to_numpy()]
    return Series(
        pd.concat(weeks, ignore_index=True),
        pooled,
        sorted(util[util["week"] == week]["workload"].dropna().astype(str).unique()),
    )


# --- rendering -----------------------------------------------------------------------------------


def _records(rows: pd.DataFrame | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    recs = rows.to_dict("records") if isinstance(rows, pd.DataFrame) else [dict(r) for r in rows]
    for r in recs:  # NaN/NA from a frame read as "no value"
        for k, v in r.items():
            if not isinstance(v, (list, dict, str)) and v is not None and pd.isna(v):
                r[k] = None
    return recs


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if unit == "%":
        return f"{value:+.2f} %"
    if unit == "×":
        return f"{value:.2f}×"
    if unit == "fraction":
        return f"{value:.3f}"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))  # 3 significant digits
    return f"{value:.{decimals}f}" + (f" {unit}" if unit else "")


def _ci(r: Mapping[str, Any]) -> str:
    if r.get("ci_low") is None:
        return ""
    return f"{_fmt(r['ci_low'], r['unit'])} … {_fmt(r['ci_high'], r['unit'])}"


def weekly_verdicts(rows: pd.DataFrame | Sequence[Mapping[str, Any]]) -> list[str]:
    """One verdict_line per row that a plan criterion judges."""
    lines = []
    for r in _records(rows):
        if not r.get("criterion"):
            continue
        unit = r["unit"]
        detail = ", ".join(
            p
            for p in (
                r["arm"],
                f"n={r['n']}",
                f"95% CI {_ci(r)}" if _ci(r) else "",
                r.get("note") or "",
            )
            if p
        )
        lines.append(
            verdict_line(
                TITLES.get(r["measure"], r["measure"]),
                r.get("statistic") or "",
                _fmt(r["value"], unit),
                _fmt(r["threshold"], unit),
                r["verdict"],
                at_most=bool(r.get("at_most", True)),
                detail=detail,
                # A verdict that is not the plain comparison (by CI, min_weeks) reads "vs".
                by_ci=r["verdict"] != _compare(r["value"], r["threshold"], r["at_most"]),
            )
        )
    return lines


def weekly_table_rows(rows: pd.DataFrame | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows for a Prefect table artifact: strings people read, one per report row."""
    return [
        {
            "measure": r["measure"],
            "arm": r["arm"],
            "basis": r["basis"],
            "n": int(r["n"]),
            "value": _fmt(r["value"], r["unit"]),
            "95% CI": _ci(r),
            "threshold": _fmt(r["threshold"], r["unit"]),
            "verdict": r["verdict"],
            "segment": int(r["segment"]),
            "note": r.get("note") or "",
        }
        for r in _records(rows)
    ]


def _change_text(cp: Mapping[str, Any]) -> str:
    return "; ".join(
        f"{c['source']} {c['field']}: {c['before']} → {c['after']}" for c in cp["changes"]
    )


def weekly_markdown(
    rows: pd.DataFrame | Sequence[Mapping[str, Any]],
    change_points: Sequence[Mapping[str, Any]],
    gaps: Sequence[Mapping[str, Any]],
    html_path: str | Path | None,
) -> str:
    recs = _records(rows)
    week = recs[0]["week"] if recs else "?"
    seg = recs[0]["segment"] if recs else 0
    lines = [
        f"# Weekly report {week} (comparability segment {seg})",
        "",
        "## Verdicts (against the plan)",
        "",
        *[f"- {v}" for v in weekly_verdicts(recs)],
        "",
        "## All rows",
        "",
        "Trial-based rows pool the segment's trials to date; utilization and goodput are this "
        "week's. Extrapolated rows list their inputs in the `reports` dataset.",
        "",
    ]
    table = weekly_table_rows(recs)
    if table:
        heads = list(table[0])
        lines += ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
        lines += [
            "| " + " | ".join(str(t[h]).replace("|", "\\|") for h in heads) + " |" for t in table
        ]
    lines += ["", "## Change points", ""]
    lines += [
        f"- {cp['week']} (segment {cp['segment']}): {_change_text(cp)}" for cp in change_points
    ]
    if not change_points:
        lines.append("- none")
    lines += ["", "## Sample gaps this week", ""]
    lines += [
        f"- {g['node']} {g['source']} {g.get('metric') or 'all metrics'}: {g['from']} → "
        f"{g['to']} ({g['seconds']:.0f} s): {g['reason']}"
        for g in gaps
    ]
    if not gaps:
        lines.append("- none")
    if html_path:
        lines += ["", f"The full page (plots): `{html_path}`"]
    return "\n".join(lines)


def _png(fig: Any) -> str:
    import base64

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _plots(series: Series, rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weeks = series.weeks
    out = []

    def per_week(measure: str, title: str, ylabel: str, arms: Sequence[str]) -> None:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        drawn = False
        for arm in arms:
            s = weeks[(weeks["measure"] == measure) & (weeks["arm"] == arm)]
            s = s.dropna(subset=["value"])
            if s.empty:
                continue
            drawn = True
            lo = (s["value"] - s["ci_low"]).fillna(0).clip(lower=0)
            hi = (s["ci_high"] - s["value"]).fillna(0).clip(lower=0)
            ax.errorbar(s["week"], s["value"], yerr=[lo, hi], marker="o", capsize=3, label=arm)
        thr = [
            r["threshold"] for r in rows if r["measure"] == measure and r["threshold"] is not None
        ]
        if thr:
            ax.axhline(thr[0], linestyle="--", color="grey", label=f"threshold {thr[0]:g}")
        if drawn or thr:
            ax.legend(fontsize=8)
        if not drawn:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        out.append((title, _png(fig)))

    per_week("goodput", "Goodput per arm per week", "delivered / allocated", ARM_ORDER)
    per_week(
        "utilization",
        "Busy per arm per week (GPU: fraction of time; CPU-only: cores)",
        "busy (see the row's unit)",
        ARM_ORDER,
    )

    def distribution(col: str, title: str, ylabel: str) -> None:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        rec = _ok(series.trials, "recovery")
        data = [rec[rec["arm"] == a][col].dropna().astype(float).to_numpy() for a in ARM_ORDER]
        if any(len(d) for d in data):
            ax.boxplot([d if len(d) else [np.nan] for d in data], showfliers=False)
            for i, d in enumerate(data, start=1):
                ax.plot(np.full(len(d), i), d, "o", alpha=0.6)
            ax.set_xticks([1, 2], ARM_ORDER)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        out.append((title, _png(fig)))

    distribution("recovery_s", "Recovery time per arm (segment to date)", "seconds")
    distribution("work_lost_gpu_h", "Work lost per interruption per arm", "GPU-hours")
    per_week("overhead_pct", "Steady-state overhead with 95% CI", "%", ("both",))
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for measure, label in (("goodput_gain", "measured"), ("goodput_gain_expected", "extrapolated")):
        s = weeks[weeks["measure"] == measure].dropna(subset=["value"])
        if not s.empty:
            ax.plot(s["week"], s["value"], marker="o", label=label)
    ax.set_title("Goodput gain: measured against the waste model")
    ax.set_ylabel("managed − unmanaged")
    if ax.lines:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    out.append(("Goodput gain: measured against the waste model", _png(fig)))
    return out


ARM_ORDER = ("managed", "unmanaged")
_CSS = (
    "body{font-family:sans-serif;max-width:70em;margin:1em auto}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.2em .5em}"
    ".met{background:#dfd}.not-met{background:#fdd}.blocked{background:#fec}"
    "img{max-width:100%}"
)


def _table(heads: Sequence[str], body: Sequence[Sequence[Any]], classes: Sequence[str] = ()) -> str:
    e = html.escape
    out = ["<table><tr>" + "".join(f"<th>{e(str(h))}</th>" for h in heads) + "</tr>"]
    for i, cells in enumerate(body):
        cls = f' class="{e(classes[i])}"' if i < len(classes) and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{e(str(c))}</td>" for c in cells) + "</tr>")
    return "\n".join([*out, "</table>"])


def weekly_html(
    rows: pd.DataFrame | Sequence[Mapping[str, Any]],
    change_points: Sequence[Mapping[str, Any]],
    gaps: Sequence[Mapping[str, Any]],
    series: Series,
    out_path: str | Path,
    *,
    title: str = "",
) -> Path:
    """A self-contained page (PNG data URIs, every text escaped), written atomically."""
    e = html.escape
    recs = _records(rows)
    week = recs[0]["week"] if recs else ""
    table = weekly_table_rows(recs)
    heads = list(table[0]) if table else ["measure"]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{e(f'{title} weekly report {week}'.strip())}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{e(title)} — weekly report {e(week)}</h1>",
        "<h2>Verdicts</h2>",
        "<ul>" + "".join(f"<li>{e(v)}</li>" for v in weekly_verdicts(recs)) + "</ul>",
        _table(
            heads,
            [list(t.values()) for t in table],
            [t["verdict"].replace(" ", "-") for t in table],
        ),
        f"<p>Workloads this week: {e(', '.join(series.workloads) or 'none')}. Trial-based rows "
        "pool the segment's trials to date; extrapolated rows list their inputs below.</p>",
    ]
    for caption, uri in _plots(series, recs):
        parts.append(f"<h2>{e(caption)}</h2><img alt='{e(caption)}' src='{uri}'>")
    parts.append("<h2>Extrapolation inputs</h2>")
    for r in recs:
        if r["basis"] == "extrapolated" and r.get("inputs"):
            pretty = json.dumps(json.loads(r["inputs"]), indent=1, sort_keys=True)
            parts.append(f"<h3>{e(r['measure'])}</h3><pre>{e(pretty)}</pre>")
    parts.append("<h2>Change points</h2>")
    parts.append(
        _table(
            ["week", "segment", "source", "field", "before", "after"],
            [
                [cp["week"], cp["segment"], c["source"], c["field"], c["before"], c["after"]]
                for cp in change_points
                for c in cp["changes"]
            ],
        )
        if change_points
        else "<p>none</p>"
    )
    parts.append("<h2>Sample gaps this week</h2>")
    gap_heads = ["node", "source", "entity", "metric", "from", "to", "seconds", "reason"]
    parts.append(
        _table(
            gap_heads, [[g.get(h) if g.get(h) is not None else "" for h in gap_heads] for g in gaps]
        )
        if gaps
        else "<p>none</p>"
    )
    parts.append("</body></html>")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text("\n".join(parts), encoding="utf-8")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


# --- the stage -----------------------------------------------------------------------------------


def html_path(data_dir: str | Path, poc: str, week: str) -> Path:
    """Beside the datasets, not inside one: a dataset folder holds append-only parquet files,
    while this page is rewritten by every report run of the week (the latest wins)."""
    return Path(data_dir) / poc / "reports_html" / f"{week}.html"


def read_frames(data_dir: str | Path, poc: str) -> dict[str, pd.DataFrame]:
    return {name: read_dataset(spec, data_dir=data_dir, poc=poc) for name, spec in INPUTS.items()}


# The sample metrics the report shows per arm (a duty cycle, SM activity, CPU: never mixed).
SAMPLED_METRICS = ("gpu_utilization", "sm_activity", "cpu_utilization")


def sampled_rows(summary: pd.DataFrame, week: str, segment: int) -> list[dict[str, Any]]:
    """One 'info' row per (sampled metric, arm) of the week from the samples summary
    (tasks.window.sample_summary): the time-weighted mean, with p50/p95 in the method."""
    rows = []
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
                "criterion": None,
                "statistic": None,
                "at_most": None,
            }
        )
    return rows


def sample_summary(
    data_dir: str | Path, poc: str, week: str, dask_client: Any = None
) -> pd.DataFrame:
    """The week's samples aggregated, in this process or on a Dask cluster (same rows)."""
    from tasks.window.sample_summary import weekly_sample_summary, weekly_sample_summary_dask

    files = [f for f in dataset_files(data_dir, poc, SAMPLES) if f"week={week}" in f]
    if not files:
        return weekly_sample_summary([], weeks=[week])
    if dask_client is not None:
        return weekly_sample_summary_dask(files, weeks=[week], client=dask_client)
    return weekly_sample_summary(files, weeks=[week])


def build_weekly_report(
    plan: Plan, ctx: RunContext, week: str | None = None, dask_client: Any = None
) -> dict[str, Any]:
    """Read the committed datasets, write the week's REPORTS rows and its HTML page; the
    caller commits the run. week None: the current ISO week (UTC). With ``dask_client``, the
    samples (the bulk of a long window) are aggregated on that Dask cluster."""
    week = week or current_week()
    frames = read_frames(ctx.data_dir, ctx.poc)
    rows, change_points, gaps = weekly_report_rows(plan, frames, week)
    segment = int(rows["segment"].max()) if len(rows) else 0
    extra = sampled_rows(sample_summary(ctx.data_dir, ctx.poc, week, dask_client), week, segment)
    if extra:
        rows = pd.concat([rows, pd.DataFrame(extra, columns=rows.columns)], ignore_index=True)
    series = weekly_series(plan, frames, week, rows)
    page = weekly_html(
        rows,
        change_points,
        gaps,
        series,
        html_path(ctx.data_dir, ctx.poc, week),
        title=f"{plan.poc} / {plan.workload.name}",
    )
    out = rows[list(ROW_COLUMNS)].copy()
    for col, value in ctx.stamp().items():
        out[col] = value
    out["computed_at"] = pd.Timestamp(dt.datetime.now(dt.UTC))
    write_dataset(
        out[REPORTS.column_names],
        REPORTS,
        data_dir=ctx.data_dir,
        poc=ctx.poc,
        run_id=ctx.run_id,
        metadata=ctx.file_metadata,
    )
    keep = ("measure", "arm", "n", "value", "ci_low", "ci_high", "basis", "inputs")
    result_rows = []
    for r in _records(rows):
        entry = {k: r[k] for k in keep}
        entry["inputs"] = json.loads(r["inputs"]) if r["inputs"] else None
        entry.update(
            threshold=r["threshold"], verdict=r["verdict"], unit=r["unit"], method=r["method"]
        )
        entry.update(note=r["note"], segment=r["segment"])
        result_rows.append(entry)
    return {
        "week": week,
        "rows": result_rows,
        "change_points": change_points,
        "gaps": gaps,
        "html": str(page),
        "markdown": weekly_markdown(rows, change_points, gaps, page),
        "table": weekly_table_rows(rows),
    }
