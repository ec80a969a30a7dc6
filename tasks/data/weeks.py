"""ISO weeks, the window's unit: labels `YYYY-Www`, starting Monday 00:00 UTC."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tasks.data.errors import CkptPocError


class WeekError(CkptPocError, ValueError):
    pass


def parse_week(label: str) -> tuple[int, int]:
    """(ISO year, week) of ``label``; a clear error for anything else (`--week 2026-W99`)."""
    try:
        year, week = label.split("-W")
        dt.date.fromisocalendar(int(year), int(week), 1)
    except (ValueError, AttributeError):
        raise WeekError(f"{label!r} is not an ISO week (YYYY-Www, e.g. 2026-W49)") from None
    return int(year), int(week)


def week_start(label: str) -> dt.datetime:
    """Monday 00:00 UTC of ISO week ``label``."""
    year, week = parse_week(label)
    return dt.datetime.combine(dt.date.fromisocalendar(year, week, 1), dt.time(), tzinfo=dt.UTC)


# Every week label is made here, one value or a column at a time: "2026-W49".
def week_label(t: dt.datetime | dt.date) -> str:
    year, week, _ = t.isocalendar()
    return f"{year}-W{week:02d}"


def week_labels(series: pd.Series) -> pd.Series:
    """ISO week labels of a timestamp column (null stays null)."""
    ts = pd.to_datetime(series.astype("datetime64[us, UTC]"), utc=True)
    iso = ts.dt.isocalendar()
    return iso["year"].astype("string") + "-W" + iso["week"].astype("string").str.zfill(2)


def arrow_week_labels(timestamps: pa.ChunkedArray | pa.Array) -> pa.Array:
    """ISO week label per timestamp, worked out once per distinct UTC day and spread back
    (a write of millions of rows has a few distinct days); null is 'unknown'."""
    if isinstance(timestamps, pa.ChunkedArray):
        timestamps = timestamps.combine_chunks()
    days = pc.dictionary_encode(pc.floor_temporal(timestamps, unit="day"))
    distinct = days.dictionary
    labels = pc.binary_join_element_wise(
        pc.cast(pc.iso_year(distinct), pa.string()),
        pc.utf8_lpad(pc.cast(pc.iso_week(distinct), pa.string()), 2, "0"),
        "-W",
    )
    return pc.fill_null(pc.take(labels, days.indices), "unknown")


def current_week() -> str:
    return week_label(dt.datetime.now(dt.UTC))


# Datasets are hive-partitioned by ISO week: <dataset>/week=YYYY-Www/<run_id>.parquet
WEEK_PARTITION = "week"


def week_of_path(path: str | Path) -> str:
    """The ``week=YYYY-Www`` partition a dataset file sits in."""
    parent = Path(path).parent.name
    prefix = f"{WEEK_PARTITION}="
    if not parent.startswith(prefix):
        raise ValueError(f"{path}: not in a {prefix}YYYY-Www partition folder")
    return parent[len(prefix) :]
