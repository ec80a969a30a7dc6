"""A week's REPORTS rows from the committed datasets: the inputs read, the segment found, the
measured and extrapolated rows built in report order; and every week's rows for the plots."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.data.datasets import (
    COMPATIBILITY,
    EXIT_VERDICTS,
    EXPOSURE,
    GATES,
    JOBS,
    SAMPLE_GAPS,
    TRIALS,
    UTILIZATION,
    DatasetSpec,
)
from tasks.data.measures import GOODPUT_GAIN
from tasks.data.plan import Plan
from tasks.data.store import normalise_dtypes, read_dataset
from tasks.data.weeks import week_labels
from tasks.window.weekly.extrapolation import extrapolated_rows
from tasks.window.weekly.goodput import GoodputSection, goodput_section, latest_utilization
from tasks.window.weekly.interruptions import InterruptionSection, interruption_section
from tasks.window.weekly.measures import (
    checkpoint_rows,
    cold_start_row,
    exit_row,
    overhead_row,
    recovery_rows,
    utilization_rows,
)
from tasks.window.weekly.mistakes import GateResult, holds, six_mistakes
from tasks.window.weekly.model import EXTRA_COLUMNS, N_RESAMPLES, ROW_COLUMNS, WeekRows
from tasks.window.weekly.restores import (
    CompatSection,
    compatibility_section,
    restore_attempts,
    restore_row,
    restores_by_version,
)
from tasks.window.weekly.segments import segments, week_start

# The frames weekly_report_rows reads, by dataset name; 'samples' is optional (fingerprints).
INPUTS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (TRIALS, EXPOSURE, GATES, UTILIZATION, SAMPLE_GAPS, EXIT_VERDICTS, COMPATIBILITY)
}


def read_frames(data_dir: str | Path, poc: str) -> dict[str, pd.DataFrame]:
    """INPUTS, and the accounting's job names (the synthetic-workload check reads them)."""
    frames = {name: read_dataset(spec, data_dir=data_dir, poc=poc) for name, spec in INPUTS.items()}
    frames["jobs"] = read_dataset(JOBS, data_dir=data_dir, poc=poc, columns=["run_id", "job_name"])
    return frames


def _frame(frames: Mapping[str, pd.DataFrame], name: str) -> pd.DataFrame:
    spec = INPUTS[name]
    df = frames.get(name)
    if df is None:
        df = pd.DataFrame({c: [] for c in spec.column_names})
    return normalise_dtypes(df.copy(), spec)


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
    sources = {"trials": (trials, week_labels(trials["started_at"]))}
    sources[UTILIZATION.name] = (util, util["week"].astype("string"))
    samples = frames.get("samples")
    if samples is not None and not samples.empty:
        sources["samples"] = (samples, week_labels(samples["t_to"]))
    return sources


@dataclass
class WeekReport:
    """A week judged: its REPORTS rows, the change points to date, its sample gaps, the
    six-mistake checks its verdicts were judged with, and the range of applications with
    every restore counted per checkpointer version."""

    rows: pd.DataFrame
    change_points: list[dict[str, Any]]
    gaps: list[dict[str, Any]]
    gates: list[GateResult]
    compatibility: CompatSection
    interruptions: InterruptionSection
    goodput: GoodputSection


def weekly_report_rows(
    plan: Plan,
    frames: Mapping[str, pd.DataFrame],
    week: str,
    *,
    n_resamples: int = N_RESAMPLES,
) -> tuple[pd.DataFrame, list[dict[str, Any]], list[dict[str, Any]]]:
    """The REPORTS rows of ISO ``week`` (without stamp and computed_at), every change point up
    to and including it, and the week's sample gaps (week_report, without the checks)."""
    r = week_report(plan, frames, week, n_resamples=n_resamples)
    return r.rows, r.change_points, r.gaps


def week_report(
    plan: Plan,
    frames: Mapping[str, pd.DataFrame],
    week: str,
    *,
    n_resamples: int = N_RESAMPLES,
) -> WeekReport:
    """ISO ``week`` judged. ``frames``: dataset name → frame as read_dataset returns it
    (missing ones are empty; 'jobs' needs only job_name)."""
    week_start(week)  # refuse a malformed label early
    trials = _frame(frames, "trials")
    util = latest_utilization(_frame(frames, UTILIZATION.name))
    segs = segments(_sources(frames, trials, util), plan.checkpointer.kind, week)
    seg_weeks = segs.weeks_to_date(week)
    pooled = trials[week_labels(trials["started_at"]).isin(seg_weeks).fillna(False).to_numpy()]
    failed = _failed_gates(_frame(frames, "gates"))
    checked = {**frames, "gates": _frame(frames, "gates"), "exposure": _frame(frames, "exposure")}
    gate_results = six_mistakes(plan, pooled, checked)
    c = WeekRows(
        plan, week, segs.of_week[week], pooled, failed, n_resamples, held=holds(gate_results)
    )
    recovery_rows(c)
    checkpoint_rows(c)
    overhead_row(c)
    cold_start_row(c)
    # Restores are counted per checkpointer version to the end of the week (restores.py).
    compat = _frame(frames, "compatibility")
    versions = restores_by_version(restore_attempts(trials, compat, plan.checkpointer.kind, week))
    restore_row(c, versions)
    utilization_rows(c, util, seg_weeks)
    measured_gain = next(
        (r["value"] for r in c.rows if r["measure"] == GOODPUT_GAIN.name and r["n"]), None
    )
    extrapolated_rows(c, _frame(frames, "exposure"), measured_gain)
    exit_row(c, _frame(frames, "exit_verdicts"))
    rows = pd.DataFrame(c.rows, columns=[*ROW_COLUMNS, *EXTRA_COLUMNS])
    gaps = _gaps(_frame(frames, "sample_gaps"), week)
    section = compatibility_section(compat, week, versions)
    interruptions = interruption_section(plan, _frame(frames, "exposure"), pooled)
    goodput = goodput_section(plan, util, [week])
    return WeekReport(rows, segs.change_points, gaps, gate_results, section, interruptions, goodput)


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
    util = latest_utilization(_frame(frames, UTILIZATION.name))
    segs = segments(_sources(frames, trials, util), plan.checkpointer.kind, week)
    weeks = [
        rows
        if rows is not None and w == week
        else weekly_report_rows(plan, frames, w, n_resamples=n_resamples)[0]
        for w in segs.of_week
    ]
    seg_weeks = segs.weeks_to_date(week)
    pooled = trials[week_labels(trials["started_at"]).isin(seg_weeks).fillna(False).to_numpy()]
    return Series(
        pd.concat(weeks, ignore_index=True),
        pooled,
        sorted(util[util["week"] == week]["workload"].dropna().astype(str).unique()),
    )
