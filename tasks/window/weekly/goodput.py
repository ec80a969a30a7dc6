"""Goodput read two ways side by side, whether the figures are final, and the exclusions.

The seed's split divides delivered GPU-hours by the allocated ones; Google's
ml-goodput-measurement divides them by each chain's first start to its last end, time in the
queue included, and counts the step in flight at a fault to the recovery, not to lost
progress (tasks/window/chains.py: Two readings). Delivered is the same in both. The rows come
from the `utilization` rows of the weeks asked for (latest per week, arm and workload).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.plan import Plan
from tasks.data.render import number

TITLE = "Goodput, read two ways"
HEADS = [
    "arm",
    "reading",
    "denominator",
    "denominator GPU-h",
    "delivered GPU-h",
    "lost GPU-h",
    "recovery GPU-h",
    "goodput",
]
SEED = "the seed's split"
JOB_SPAN = "ml-goodput-measurement"


@dataclass(frozen=True)
class GoodputSection:
    """What the weekly report and the record say of goodput's two readings."""

    rows: list[list[str]]
    status: str  # final, or provisional with the chains still open
    exclusions: list[str]  # each of the plan's windows, and what they removed per arm


def _sum(rows: pd.DataFrame, column: str) -> float | None:
    """Σ of a column; None when a row has none (written before it was measured)."""
    values = rows[column]
    return float(values.sum()) if values.notna().all() else None


def _share(part: float | None, whole: float | None) -> str:
    return number(part / whole) if part is not None and whole else "—"


def _cell(value: float | str | None) -> str:
    if isinstance(value, str):
        return value
    return number(value) if value is not None else "—"


def reading_rows(util: pd.DataFrame) -> list[list[str]]:
    """Per arm: the seed's split, then the job-span reading, over the rows given."""
    out: list[list[str]] = []
    for arm in (MANAGED, UNMANAGED):
        mine = util[util["arm"] == arm]
        if mine.empty:
            continue
        alloc, delivered, lost, recovery = (
            float(mine[c].sum())
            for c in ("allocated_gpu_h", "delivered_gpu_h", "lost_gpu_h", "idle_recovery_gpu_h")
        )
        queued, step = _sum(mine, "queued_gpu_h"), _sum(mine, "unfinished_step_gpu_h")
        seed = [alloc, delivered, lost, recovery, _share(delivered, alloc)]
        job_span: list[float | str | None] = [None, delivered, None, None, "—"]
        if queued is not None and step is not None:
            span = alloc + queued
            job_span = [span, delivered, lost - step, recovery + step + queued]
            job_span.append(_share(delivered, span))
        out.append([arm, SEED, "allocated GPU-h", *map(_cell, seed)])
        out.append([arm, JOB_SPAN, "first start → last end, queue included", *map(_cell, job_span)])
    return out


def status_line(util: pd.DataFrame) -> str:
    if util.empty:
        return "No utilization rows yet."
    chains = int(util["chains"].fillna(0).sum())
    still_open = int(util["chains_open"].fillna(0).sum())
    at = pd.to_datetime(util["computed_at"], utc=True).max()
    when = f"computed {at:%Y-%m-%d %H:%M} UTC"
    if still_open:
        return (
            f"Provisional: {still_open} of {chains} chains had not ended ({when}); a copy "
            "still running can yet lose what reads as delivered, so these figures may change."
        )
    return f"Final: every one of the {chains} chains in these figures had ended ({when})."


def exclusion_lines(plan: Plan, util: pd.DataFrame) -> list[str]:
    """Each exclusion of the plan, then the GPU-hours they removed per arm."""
    if not plan.exclusions:
        return []
    lines = [
        f"{x.start.astimezone(dt.UTC):%Y-%m-%d %H:%M} → "
        f"{x.end.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC: {x.reason}"
        for x in plan.exclusions
    ]
    removed = [
        f"{arm} {_cell(_sum(util[util['arm'] == arm], 'excluded_gpu_h'))} GPU-h"
        for arm in (MANAGED, UNMANAGED)
        if not util[util["arm"] == arm].empty
    ]
    if removed:
        lines.append("removed from both arms alike: " + ", ".join(removed))
    return lines


def latest_utilization(util: pd.DataFrame) -> pd.DataFrame:
    """The daily utilization flow recomputes the current week: keep the latest row per
    (week, arm, workload)."""
    if util.empty:
        return util
    util = util.sort_values("computed_at")
    return util.drop_duplicates(["week", "arm", "workload"], keep="last")


def goodput_section(
    plan: Plan, util: pd.DataFrame, weeks: Sequence[str] | None = None
) -> GoodputSection:
    """``util``: utilization rows (the latest per week, arm and workload are read);
    ``weeks``: those the section reads (None: every week)."""
    mine = latest_utilization(util)
    if weeks is not None and len(mine):
        mine = mine[mine["week"].isin(list(weeks)).fillna(False).to_numpy(bool)]
    return GoodputSection(reading_rows(mine), status_line(mine), exclusion_lines(plan, mine))
