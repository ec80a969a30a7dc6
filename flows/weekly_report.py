"""The weekly report: parquet rows, an HTML page and Prefect artifacts; weekly on schedule."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.cache_policies import NO_CACHE

from flows.common import run_name
from flows.plan_check import ensure_plan_is_valid
from flows.results import WeeklyReportRun
from tasks.data.plan import Plan
from tasks.data.runctx import open_run
from tasks.window.weekly import build_weekly_report


@task(name="build_report", cache_policy=NO_CACHE)
def build_report(
    plan: Plan, plan_path: str, week: str | None, dask_scheduler: str | None
) -> WeeklyReportRun:
    with open_run(plan, plan_path, "weekly_report") as ctx:
        if dask_scheduler:  # a window too big for one machine: the samples go to a Dask cluster
            from distributed import Client

            with Client(dask_scheduler) as client:
                report = build_weekly_report(plan, ctx, week, dask_client=client)
        else:
            report = build_weekly_report(plan, ctx, week)
    return WeeklyReportRun(ctx.poc, ctx.run_id, report)


@flow(name="weekly_report", flow_run_name=run_name("weekly report"))
def weekly_report(
    plan_path: str, week: str | None = None, dask_scheduler: str | None = None
) -> WeeklyReportRun:
    """Every dataset of the window so far → the week's rows (measure, arm, week: measured
    or extrapolated with inputs, against the plan's thresholds), change points, gaps.
    ``dask_scheduler``: the address of a Dask scheduler (e.g. a dask-jobqueue SLURMCluster's)
    to aggregate the samples on."""
    plan = ensure_plan_is_valid(plan_path)
    result = build_report(plan, plan_path, week, dask_scheduler)
    report = result.report
    create_markdown_artifact(
        key="weekly-report",
        markdown=report.markdown,
        description=f"Weekly report {report.week}",
    )
    create_table_artifact(
        key="weekly-report-rows",
        table=report.table,
        description=f"Weekly report {report.week}: one row per measure and arm",
    )
    create_link_artifact(
        key="weekly-report-html",
        link=Path(report.html).resolve().as_uri(),
        link_text=f"weekly report {report.week} (HTML, on the worker's disk)",
        description="The HTML page with the plots",
    )
    return result
