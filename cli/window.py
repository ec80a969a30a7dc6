"""`ckpt-poc sample | utilization | report PLAN`: the window's samples, job-level utilization
and the weekly report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from cli.common import (
    JsonOpt,
    PlanArg,
    ReportJsonOpt,
    RowsJsonOpt,
    WeekOpt,
    command_body,
    out,
    write_json,
)

if TYPE_CHECKING:
    from tasks.window.weekly.stage import WeeklyReport

UTILIZATION_COLUMNS = (
    "week",
    "arm",
    "allocated",
    "delivered",
    "lost",
    "idle ckpt",
    "idle recovery",
    "idle other",
    "goodput",
    "busy",
)
REPORT_JSON_KEYS = ("week", "rows", "change_points", "gaps", "html")


def sample_cmd(
    plan: PlanArg,
    span_s: Annotated[
        float | None, typer.Option("--span-s", help="seconds to sample (default: the plan's)")
    ] = None,
    interval_s: Annotated[
        float | None,
        typer.Option("--interval-s", help="seconds between reads (default: the plan's)"),
    ] = None,
    node: Annotated[
        str | None, typer.Option(help="one of the plan's nodes (default: all it can read)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """One sampler span on each test node (the plan's window.sampler); gaps since the last
    span become rows of `sample_gaps`."""
    with command_body():
        from flows.sample_window import sample_window

        result = sample_window(str(plan), span_s, interval_s, node)
    if as_json:
        write_json(result.to_json())
        return
    out.print(
        f"[bold]sampled[/] {', '.join(result.nodes)}: {result.samples} rows, "
        f"{result.gaps} gap row(s), {result.reads} reads from {result.from_} to "
        f"{result.to}",
        highlight=False,
    )
    if result.salvaged_runs:
        out.print(f"kept what killed sampler runs flushed: {', '.join(result.salvaged_runs)}")


def utilization_cmd(plan: PlanArg, week: WeekOpt = None, as_json: RowsJsonOpt = False) -> None:
    """Job-level utilization per arm, week and workload: allocated GPU-hours split into
    delivered, lost and idle; goodput; the samples' busy fraction."""
    with command_body():
        from flows.utilization import GPU_HOUR_COLUMNS, utilization

        result = utilization(str(plan), week)
    if as_json:
        write_json(result.to_json(), default=str)
        return
    table = Table(title="Job-level utilization (GPU-hours)")
    for column in UTILIZATION_COLUMNS:
        table.add_column(column, justify="left" if column in ("week", "arm") else "right")
    for row in result.rows:
        table.add_row(
            row["week"],
            row["arm"],
            *(f"{row[c]:.4g}" for c in GPU_HOUR_COLUMNS),
            "—" if row.get("goodput") is None else f"{row['goodput']:.3f}",
            "—"
            if row.get("busy_fraction") is None
            else escape(f"{row['busy_fraction']:.3f} ({row['busy_metric']})"),
        )
    out.print(table if result.rows else "no allocations in the window yet")


def report_cmd(
    plan: PlanArg,
    week: WeekOpt = None,
    as_json: ReportJsonOpt = False,
    dask_scheduler: Annotated[
        str | None,
        typer.Option(help="aggregate the samples on this Dask scheduler (tcp://host:port)"),
    ] = None,
) -> None:
    """The weekly report (the weekly_report flow): one row per measure and arm, measured or
    extrapolated, against the plan's thresholds; change points, gaps and the HTML page."""
    with command_body():
        from flows.weekly_report import weekly_report

        result = weekly_report(str(plan), week, dask_scheduler)
    if as_json:
        shown = result.to_json()
        write_json({k: shown[k] for k in REPORT_JSON_KEYS}, default=str)
        return
    _print_weekly(result.report)


def _print_weekly(result: WeeklyReport) -> None:
    table = Table(title=f"Weekly report {result.week}")
    for column in ("measure", "arm", "n", "value", "95% CI", "basis", "threshold", "verdict"):
        table.add_column(column, justify="right" if column in ("n", "value") else "left")
    for row in result.rows:
        value = "—" if row["value"] is None else f"{row['value']:.4g}"
        ci = (
            "—"
            if row["ci_low"] is None or row["ci_high"] is None
            else f"{row['ci_low']:.4g} … {row['ci_high']:.4g}"
        )
        threshold = "—" if row["threshold"] is None else f"{row['threshold']:.4g}"
        table.add_row(
            row["measure"],
            row["arm"],
            str(row["n"]),
            value,
            ci,
            row["basis"],
            threshold,
            row["verdict"],
        )
    out.print(table)
    for point in result.change_points:
        out.print(f"[yellow]change point[/] {point}", highlight=False)
    _print_gaps(result.gaps)
    out.print(f"html: {result.html}", highlight=False)


def _print_gaps(gaps: list[dict[str, Any]], shown: int = 5) -> None:
    """The gaps in the samples: how many and how long, the first few by name."""
    if not gaps:
        return
    total = sum(float(g["seconds"]) for g in gaps)
    out.print(f"gaps in the samples: {len(gaps)}, {total:.0f} s in all", highlight=False)
    for gap in gaps[:shown]:
        what = "/".join(str(g) for g in (gap["entity"], gap["metric"]) if g) or "all"
        out.print(
            f"  {gap['node']} {what} {gap['from']} → {gap['to']} "
            f"({float(gap['seconds']):.0f} s): {gap['reason']}",
            highlight=False,
            markup=False,
        )
    if len(gaps) > shown:
        out.print(f"  … and {len(gaps) - shown} more (in the HTML page)", highlight=False)
