"""The weekly report as a stage: where its page lives, the week's samples summarised, and
``build_weekly_report``, which reads the datasets and writes the REPORTS rows and the page."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.data.dataset_versions import versions_lines
from tasks.data.datasets import EVENTS, REPORTS, SAMPLES
from tasks.data.plan import Plan
from tasks.data.render import records
from tasks.data.runctx import RunContext
from tasks.data.store import dataset_files, stored_versions, write_dataset
from tasks.data.weeks import current_week
from tasks.window.weekly.goodput import HEADS as GOODPUT_HEADS
from tasks.window.weekly.goodput import GoodputSection
from tasks.window.weekly.interruptions import InterruptionSection
from tasks.window.weekly.measures import sampled_rows
from tasks.window.weekly.model import ROW_COLUMNS
from tasks.window.weekly.render import weekly_html, weekly_markdown, weekly_table_rows
from tasks.window.weekly.restores import CompatSection, section_json
from tasks.window.weekly.rows import read_frames, week_report, weekly_series


def html_path(data_dir: str | Path, poc: str, week: str) -> Path:
    """Beside the datasets, not inside one: a dataset folder holds append-only parquet files,
    while this page is rewritten by every report run of the week (the latest wins)."""
    return Path(data_dir) / poc / "reports_html" / f"{week}.html"


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


def _versions_read(ctx: RunContext, frames: dict[str, pd.DataFrame]) -> list[str]:
    """Which version of each dataset the report read (a PoC outlives upgrades of the
    product); the events, read by the utilization stage, from their files' footers."""
    events = stored_versions(EVENTS, data_dir=ctx.data_dir, poc=ctx.poc)
    return [*versions_lines(frames), events.line()]


@dataclass(frozen=True, slots=True)
class WeeklyReport:
    """The week's report as the flow hands it on: its rows, the page and the sections."""

    week: str
    rows: list[dict[str, Any]]  # one per measure and arm, JSON-ready (inputs parsed)
    change_points: list[dict[str, Any]]
    gaps: list[dict[str, Any]]
    html: str
    markdown: str
    goodput: GoodputSection
    interruptions: InterruptionSection
    table: list[dict[str, Any]]  # the Prefect table artifact's rows
    compatibility: CompatSection

    # a dict: the sections shaped for the flow (goodput's table heads, compatibility's form)
    def to_json(self) -> dict[str, Any]:
        return {
            "week": self.week,
            "rows": self.rows,
            "change_points": self.change_points,
            "gaps": self.gaps,
            "html": self.html,
            "markdown": self.markdown,
            "goodput": {
                "status": self.goodput.status,
                "heads": GOODPUT_HEADS,
                "rows": self.goodput.rows,
                "exclusions": self.goodput.exclusions,
            },
            "interruptions": {
                "line": self.interruptions.line,
                "rows": self.interruptions.rows,
                "holds": self.interruptions.holds,
            },
            "table": self.table,
            "compatibility": section_json(self.compatibility),
        }


def build_weekly_report(
    plan: Plan, ctx: RunContext, week: str | None = None, dask_client: Any = None
) -> WeeklyReport:
    """Read the committed datasets, write the week's REPORTS rows and its HTML page; the
    caller commits the run. week None: the current ISO week (UTC). With ``dask_client``, the
    samples (the bulk of a long window) are aggregated on that Dask cluster."""
    week = week or current_week()
    frames = read_frames(ctx.data_dir, ctx.poc)
    report = week_report(plan, frames, week)
    rows, change_points, gaps = report.rows, report.change_points, report.gaps
    segment = int(rows["segment"].max()) if len(rows) else 0
    extra = sampled_rows(sample_summary(ctx.data_dir, ctx.poc, week, dask_client), week, segment)
    if extra:
        rows = pd.concat([rows, pd.DataFrame(extra, columns=rows.columns)], ignore_index=True)
    series = weekly_series(plan, frames, week, rows)
    versions = _versions_read(ctx, frames)
    page = weekly_html(
        rows,
        change_points,
        gaps,
        series,
        html_path(ctx.data_dir, ctx.poc, week),
        title=f"{plan.poc} / {plan.workload.name}",
        compatibility=report.compatibility,
        interruptions=report.interruptions,
        goodput=report.goodput,
        versions=versions,
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
    for r in records(rows):
        entry = {k: r[k] for k in keep}
        entry["inputs"] = json.loads(r["inputs"]) if r["inputs"] else None
        entry.update(
            threshold=r["threshold"], verdict=r["verdict"], unit=r["unit"], method=r["method"]
        )
        entry.update(note=r["note"], segment=r["segment"])
        result_rows.append(entry)
    return WeeklyReport(
        week=week,
        rows=result_rows,
        change_points=change_points,
        gaps=gaps,
        html=str(page),
        markdown=weekly_markdown(
            rows,
            change_points,
            gaps,
            page,
            report.compatibility,
            report.interruptions,
            report.goodput,
            versions,
        ),
        goodput=report.goodput,
        interruptions=report.interruptions,
        table=weekly_table_rows(rows),
        compatibility=report.compatibility,
    )
