"""What the record reads: the weeks with data, the rows and files behind each figure, the
per-arm cold-start clocks and the way out's latest state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.datasets import UTILIZATION
from tasks.data.measures import COLD_START_NATIVE_S, COLD_START_RESTORE_S, MEASURES
from tasks.data.page_cache import judged
from tasks.data.runs import committed_runs
from tasks.experiments.stats import bootstrap_ci
from tasks.window.weekly.model import ok_trials
from tasks.window.weekly.segments import week_label, weeks_between

# The cold-start clocks, computed here per arm (the weekly rows carry only their ratio).
COLD_START_CLOCKS = {UNMANAGED: COLD_START_NATIVE_S, MANAGED: COLD_START_RESTORE_S}
# The rows of the weekly report each figure comes from: (dataset, trials.measure or None).
FIGURE_SOURCES: dict[str, tuple[str, str | None]] = {
    m.name: (m.dataset, m.trials) for m in MEASURES.values()
}


def week_col(df: pd.DataFrame, col: str) -> pd.Series:
    """ISO week labels of a timestamp column, nulls dropped."""
    ts = df[col].dropna()
    # Built, not mapped: an empty timestamp column mapped stays timestamps, which isin()
    # against week labels refuses (a record whose trials lack a measure).
    labels = [week_label(pd.Timestamp(t).to_pydatetime()) for t in ts]
    return pd.Series(labels, index=ts.index, dtype="string")


def data_weeks(frames: Mapping[str, pd.DataFrame]) -> list[str]:
    """Every ISO week from the first to the last that has trials, utilization or
    compatibility rows."""
    labels: set[str] = set()
    if len(frames["trials"]):
        labels |= set(week_col(frames["trials"], "started_at"))
    compat = frames.get("compatibility")
    if compat is not None and len(compat):
        labels |= set(week_col(compat, "started_at"))
    if len(frames[UTILIZATION.name]):
        labels |= set(frames[UTILIZATION.name]["week"].dropna().astype(str))
    return weeks_between(min(labels), max(labels)) if labels else []


def cold_start_rows(
    trials: pd.DataFrame, week: str, segment: int, n_resamples: int
) -> list[dict[str, Any]]:
    """The two cold-start clocks per arm: median ready_s with a bootstrap CI (info rows: the
    plan judges their ratio, the speed-up)."""
    rows = []
    for arm, measure in COLD_START_CLOCKS.items():
        mine = judged(ok_trials(trials, measure.trials or "", arm))
        ready = mine[measure.column].dropna().to_numpy(float)
        ready = ready[ready > 0]
        lo, hi = bootstrap_ci(ready, np.median, n_resamples=n_resamples) if len(ready) else (0, 0)
        rows.append(
            {
                "week": week,
                "measure": measure.name,
                "arm": arm,
                "n": len(ready),
                "value": float(np.median(ready)) if len(ready) else None,
                "ci_low": float(lo) if len(ready) else None,
                "ci_high": float(hi) if len(ready) else None,
                "unit": measure.unit,
                "method": f"median {measure.column} of ok cold-start trials to date; 95% CI "
                f"percentile bootstrap, {n_resamples} resamples, seed 0",
                "basis": "measured",
                "inputs": None,
                "threshold": None,
                "verdict": "info" if len(ready) else "no data",
                "note": "",
                "segment": segment,
                "criterion": None,
            }
        )
    return rows


def source_rows(
    measure: str, arm: str, frames: Mapping[str, pd.DataFrame], weeks_to_date: Sequence[str]
) -> pd.DataFrame:
    """The rows a figure is computed from (for its weeks and lineage)."""
    dataset, trial_measure = FIGURE_SOURCES.get(measure, ("trials", None))
    df = frames[dataset]
    if dataset == "trials":
        df = df[df["status"] == "ok"]
        if trial_measure:
            df = df[df["measure"] == trial_measure]
        df = df[week_col(df, "started_at").reindex(df.index).isin(weeks_to_date)]
    elif dataset == UTILIZATION.name:
        df = df[df["week"].isin(weeks_to_date)]
    if arm in (MANAGED, UNMANAGED) and "arm" in df.columns:
        df = df[df["arm"] == arm]
    return df


def weeks_of(df: pd.DataFrame) -> int:
    if "started_at" in df.columns:
        return int(week_col(df, "started_at").nunique())
    if "week" in df.columns:
        return int(df["week"].nunique())
    if "diffed_at" in df.columns:
        return int(week_col(df, "diffed_at").nunique())
    return 0


def files_by_run(data_dir: str | Path, poc: str) -> dict[str, list[str]]:
    root = Path(data_dir) / poc
    return {
        run_id: [str(root / f) for f in rec.get("files", [])]
        for run_id, rec in committed_runs(data_dir, poc).items()
    }


def files_of(files: Mapping[str, list[str]], runs: Sequence[str], dataset: str) -> list[str]:
    return [f for r in runs for f in files.get(r, []) if Path(f).parts[-3] == dataset]


def week_trials(frames: Mapping[str, pd.DataFrame], seg_weeks: Sequence[str]) -> pd.DataFrame:
    """The trials started in ``seg_weeks``."""
    t = frames["trials"]
    return t[week_col(t, "started_at").reindex(t.index).isin(seg_weeks).to_numpy()]


def exit_state(verdicts: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    """'not tried', 'clean' or 'leftovers: N', and each node's newest exit verdict."""
    if verdicts.empty:
        return "not tried", verdicts
    latest = verdicts.sort_values("diffed_at").groupby("node", as_index=False).last()
    leftovers = int(latest["leftovers"].sum())
    return ("clean" if leftovers == 0 else f"leftovers: {leftovers}"), latest


def restore_weeks(frames: Mapping[str, pd.DataFrame], run_ids: Sequence[str]) -> int:
    """ISO weeks of the trials and compatibility rows of ``run_ids`` (the restores counted)."""
    labels: set[str] = set()
    for name in ("trials", "compatibility"):
        df = frames.get(name)
        if df is not None and len(df):
            labels |= set(week_col(df[df["run_id"].isin(list(run_ids))], "started_at"))
    return len(labels)
