"""The weekly report's heavy part: the window's samples aggregated per week, in memory and on Dask.

``weekly_sample_summary`` gives one row per (week, node, arm, workload, device, metric, unit):

- ``n``: sample rows; ``points``: sum of the readings they average;
- ``mean``: the value weighted by covered seconds, sum(value × (t_to − t_from)) / covered_s
  (null when the group covers no time);
- ``p50``, ``p95``: exact quantiles of ``value`` over the group's rows, linear interpolation
  between order statistics (numpy's default ``linear``, DuckDB's ``quantile_cont``);
- ``covered_s``: sum of t_to − t_from (summed in integer microseconds, so exact);
- ``first_t_from``, ``last_t_to``: min t_from and max t_to.

``week`` is the partition (the ISO week of ``t_to``, tasks.data.datasets); a null ``arm`` or
``workload`` (unattributed samples) is a group of its own, never dropped.

How it streams: the files are one pyarrow dataset (hive partition ``week``), scanned one
week at a time (a partition filter, so other weeks' files are not opened) in record batches
of the ten columns it needs, strings read dictionary-encoded. Each batch is reduced with
pyarrow's hash group-by to per-group partial sums, min/max and the group's values; partials
are added up per group. Exact quantiles need every value of a group, so a week's values
(8 bytes a row) are held until the week is done; nothing else grows with the rows.

``weekly_sample_summary_dask`` gives the same rows with dask.dataframe: one partition per
file; sums, counts and min/max by Dask's tree reduction (per-partition partials, then
combined); the quantiles by shuffling (keys, value) so that each group's values meet in one
partition, where the same numpy quantile runs on the same multiset of values, so p50/p95 are
bit-identical to the in-memory path. Sums differ only by summation order (~1e-15 relative).
Null keys are replaced by a sentinel (a NUL character, which no key holds) while grouping
and shuffling, and restored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from tasks.data.datasets import SAMPLE_GAPS, SAMPLES, DatasetSpec
from tasks.data.weeks import WEEK_PARTITION, week_of_path

GROUP_KEYS = ("week", "node", "arm", "workload", "device", "metric", "unit")
GAP_KEYS = ("week", "node", "source", "reason")
QUANTILES = (0.5, 0.95)
_SAMPLE_STRINGS = ("node", "arm", "workload", "device", "metric", "unit")
_SAMPLE_COLUMNS = (*_SAMPLE_STRINGS, "value", "t_from", "t_to", "points")
_GAP_STRINGS = ("node", "source", "reason")
_NULL = "\x00"  # stands for a null key in the Dask path; no key holds a NUL
_TS = pd.ArrowDtype(pa.timestamp("us", tz="UTC"))
_STR = pd.StringDtype("pyarrow")
BATCH_ROWS = 1 << 18  # big enough that per-batch Python work is noise, small enough for memory

SUMMARY_DTYPES: dict[str, Any] = {
    **{k: _STR for k in GROUP_KEYS},
    "n": "int64",
    "points": "int64",
    "mean": "float64",
    "p50": "float64",
    "p95": "float64",
    "covered_s": "float64",
    "first_t_from": _TS,
    "last_t_to": _TS,
}


class SummaryRow(TypedDict):
    """One row of the samples' summary: the columns of SUMMARY_DTYPES, in their order."""

    week: str
    node: str | None
    arm: str | None
    workload: str | None
    device: str | None
    metric: str | None
    unit: str | None
    n: int
    points: int
    mean: float
    p50: float
    p95: float
    covered_s: float
    first_t_from: pd.Timestamp
    last_t_to: pd.Timestamp


GAP_DTYPES: dict[str, Any] = {**{k: _STR for k in GAP_KEYS}, "gaps": "int64", "gap_s": "float64"}


def _dataset(files: Sequence[str], spec: DatasetSpec, strings: Iterable[str]) -> pads.Dataset:
    """The files as one dataset: the week from the path (hive), the key strings read straight
    from parquet as dictionaries (no string hashing per row), whatever each file stored."""
    strings = tuple(strings)
    fields = [
        pa.field(f.name, pa.dictionary(pa.int32(), pa.string()))
        if f.name in strings
        else pa.field(f.name, f.type)
        for f in spec.arrow_schema
    ]
    schema = pa.schema([*fields, pa.field(WEEK_PARTITION, pa.string())])
    fmt = pads.ParquetFileFormat(read_options=pads.ParquetReadOptions(dictionary_columns=strings))
    part = pads.partitioning(pa.schema([(WEEK_PARTITION, pa.string())]), flavor="hive")
    return pads.dataset(list(files), schema=schema, format=fmt, partitioning=part)


def _weeks(files: Sequence[str], weeks: Sequence[str] | None) -> list[str]:
    present = sorted({week_of_path(f) for f in files})
    return present if weeks is None else [w for w in present if w in set(weeks)]


# --- in memory (streaming) ---------------------------------------------------------------------


def weekly_sample_summary(files: list[str], *, weeks: list[str] | None = None) -> pd.DataFrame:
    """One row per (week, node, arm, workload, device, metric, unit) of the samples in
    ``files`` (committed runs' files: tasks.data.store.dataset_files), for ``weeks`` (all
    when None). Streams week by week; see the module doc."""
    rows: list[SummaryRow] = []
    if files:
        ds = _dataset(files, SAMPLES, _SAMPLE_STRINGS)
        for week in _weeks(files, weeks):
            rows += _summarise_week(ds, week)
    return _finish(pd.DataFrame(rows, columns=list(SUMMARY_DTYPES)), SUMMARY_DTYPES, GROUP_KEYS)


def _summarise_week(ds: pads.Dataset, week: str) -> list[SummaryRow]:
    scanner = ds.scanner(
        columns=list(_SAMPLE_COLUMNS),
        filter=pc.field(WEEK_PARTITION) == week,
        batch_size=BATCH_ROWS,
    )
    # key -> [n, points, covered_us, value×seconds, min t_from, max t_to, [value arrays]]
    acc: dict[tuple, list[Any]] = {}
    for batch in scanner.to_batches():
        if batch.num_rows:
            _reduce_batch(batch, acc)
    out = []
    for key, (n, points, cov, wsum, tmin, tmax, chunks) in acc.items():
        p50, p95 = _quantiles(np.concatenate(chunks))
        out.append(_row(week, key, n, points, cov, wsum, tmin, tmax, p50, p95))
    return out


def _numpy(array: pa.Array, as_type: pa.DataType | None = None) -> np.ndarray:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if as_type is not None:
        array = array.view(as_type)  # timestamp[us] -> int64 µs, zero copy
    return array.to_numpy(zero_copy_only=False)


def _reduce_batch(batch: pa.RecordBatch, acc: dict[tuple, list[Any]]) -> None:
    """Add one batch's partial aggregates to ``acc``. Grouping works on the dictionary
    indices (a batch's keys have few distinct values): a mixed-radix code per row, a stable
    sort by it (radix sort for codes < 2^16), then reduceat over each group's run. Pyarrow's
    hash group-by with a list aggregate cost ~3x as much here."""
    codes = np.zeros(batch.num_rows, np.int64)
    radix = 1
    columns = []  # per key: (row -> index, index -> value with None for null)
    for k in _SAMPLE_STRINGS:
        col = batch.column(k)
        if not pa.types.is_dictionary(col.type):  # a plain string column (not read as dict)
            col = pc.dictionary_encode(col)
        size = len(col.dictionary)
        values = [*col.dictionary.to_pylist(), None]
        if col.null_count == 0 and size == 1:  # constant in this batch (node, unit, …)
            columns.append((None, values))
            continue
        indices = col.indices if col.null_count == 0 else pc.fill_null(col.indices, size)
        idx = _numpy(indices)  # a null has its own code: ``size``
        codes += idx * radix
        radix *= size + 1
        columns.append((idx, values))
    if radix > 1 << 62:  # too many combinations for one int64: renumber densely first
        _, codes = np.unique(codes, return_inverse=True)
    elif radix <= 1 << 16:
        codes = codes.astype(np.uint16)  # numpy's stable sort is a radix sort for these
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.concatenate([[0], np.flatnonzero(sorted_codes[1:] != sorted_codes[:-1]) + 1])
    ends = np.append(starts[1:], len(order))
    value = _numpy(batch.column("value"))[order]
    t_from = _numpy(batch.column("t_from"), pa.int64())[order]
    t_to = _numpy(batch.column("t_to"), pa.int64())[order]
    covered = t_to - t_from
    weighted = value * (covered.astype(np.float64) / 1e6)
    points = np.add.reduceat(_numpy(batch.column("points"))[order], starts)
    cov = np.add.reduceat(covered, starts)
    wsum = np.add.reduceat(weighted, starts)
    tmin = np.minimum.reduceat(t_from, starts)
    tmax = np.maximum.reduceat(t_to, starts)
    for g, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        row = int(order[s])  # any row of the group names its key
        key = tuple(values[0 if idx is None else idx[row]] for idx, values in columns)
        stats = (e - s, int(points[g]), int(cov[g]), float(wsum[g]), int(tmin[g]), int(tmax[g]))
        a = acc.get(key)
        if a is None:
            acc[key] = [*stats, [value[s:e]]]
        else:
            a[0] += stats[0]
            a[1] += stats[1]
            a[2] += stats[2]
            a[3] += stats[3]
            a[4] = min(a[4], stats[4])
            a[5] = max(a[5], stats[5])
            a[6].append(value[s:e])


def _quantiles(values: np.ndarray) -> tuple[float, float]:
    """Exact p50, p95 (numpy ``linear`` = DuckDB ``quantile_cont``); both paths use this."""
    p50, p95 = np.quantile(values, QUANTILES)
    return float(p50), float(p95)


def _row(
    week: str,
    key: tuple,
    n: int,
    points: int,
    covered_us: int,
    weighted: float,
    t_from_us: int,
    t_to_us: int,
    p50: float,
    p95: float,
) -> SummaryRow:
    covered_s = covered_us / 1e6
    node, arm, workload, device, metric, unit = key  # in _SAMPLE_STRINGS' order
    return {
        "week": week,
        "node": node,
        "arm": arm,
        "workload": workload,
        "device": device,
        "metric": metric,
        "unit": unit,
        "n": int(n),
        "points": int(points),
        "mean": weighted / covered_s if covered_s > 0 else np.nan,
        "p50": p50,
        "p95": p95,
        "covered_s": covered_s,
        "first_t_from": pd.Timestamp(int(t_from_us), unit="us", tz="UTC"),
        "last_t_to": pd.Timestamp(int(t_to_us), unit="us", tz="UTC"),
    }


def _finish(df: pd.DataFrame, dtypes: dict[str, Any], keys: Sequence[str]) -> pd.DataFrame:
    """The one normal form both paths return: declared dtypes, sorted by the keys (nulls
    last), a fresh index."""
    df = df[list(dtypes)].astype(dtypes)
    return df.sort_values(list(keys), na_position="last", kind="stable").reset_index(drop=True)


def weekly_gap_summary(files: list[str], *, weeks: list[str] | None = None) -> pd.DataFrame:
    """One row per (week, node, source, reason) of the ``sample_gaps`` files: gaps (rows)
    and gap_s (their summed seconds). Streams like weekly_sample_summary."""
    acc: dict[tuple, list[float]] = {}
    if files:
        ds = _dataset(files, SAMPLE_GAPS, _GAP_STRINGS)
        selected = _weeks(files, weeks)
        scanner = ds.scanner(
            columns=[WEEK_PARTITION, *_GAP_STRINGS, "gap_s"],
            filter=pc.field(WEEK_PARTITION).isin(selected),
            batch_size=BATCH_ROWS,
        )
        for batch in scanner.to_batches():
            if batch.num_rows == 0:
                continue
            part = (
                pa.Table.from_batches([batch])
                .group_by(list(GAP_KEYS), use_threads=False)
                .aggregate([("gap_s", "count", pc.CountOptions(mode="all")), ("gap_s", "sum")])
            )
            for row in part.to_pylist():
                key = tuple(row[k] for k in GAP_KEYS)
                a = acc.setdefault(key, [0, 0.0])
                a[0] += row["gap_s_count"]
                a[1] += row["gap_s_sum"]
    rows = [
        {**dict(zip(GAP_KEYS, k, strict=True)), "gaps": int(v[0]), "gap_s": float(v[1])}
        for k, v in acc.items()
    ]
    return _finish(pd.DataFrame(rows, columns=list(GAP_DTYPES)), GAP_DTYPES, GAP_KEYS)


# --- Dask --------------------------------------------------------------------------------------


def _dask_meta() -> pd.DataFrame:
    return pd.DataFrame(
        {
            **{k: pd.Series(dtype=object) for k in GROUP_KEYS},
            "value": pd.Series(dtype="float64"),
            "points": pd.Series(dtype="int64"),
            "covered_us": pd.Series(dtype="int64"),
            "weighted": pd.Series(dtype="float64"),
            "t_from": pd.Series(dtype="int64"),
            "t_to": pd.Series(dtype="int64"),
        }
    )


def _read_partition(path: str) -> pd.DataFrame:
    """One file as a Dask partition: the columns the summary needs, timestamps as int64 µs,
    null keys as the sentinel (plain object strings group and hash the same everywhere)."""
    table = pq.read_table(path, columns=list(_SAMPLE_COLUMNS))
    t_from = pc.cast(table.column("t_from"), pa.int64()).to_numpy()
    t_to = pc.cast(table.column("t_to"), pa.int64()).to_numpy()
    covered = t_to - t_from
    value = table.column("value").to_numpy()
    frame = {"week": np.full(table.num_rows, week_of_path(path), dtype=object)}
    for k in _SAMPLE_STRINGS:
        col = pc.fill_null(pc.cast(table.column(k), pa.string()), _NULL)
        frame[k] = col.to_numpy(zero_copy_only=False).astype(object)
    frame.update(
        value=value,
        points=table.column("points").to_numpy(),
        covered_us=covered,
        # the same float operations as the in-memory path, row by row
        weighted=value * (covered.astype(np.float64) / 1e6),
        t_from=t_from,
        t_to=t_to,
    )
    return pd.DataFrame(frame)


def _group_quantiles(group: pd.DataFrame) -> pd.Series:
    p50, p95 = _quantiles(group["value"].to_numpy())
    return pd.Series({"p50": p50, "p95": p95})


def weekly_sample_summary_dask(
    files: list[str], *, weeks: list[str] | None = None, client: Any = None
) -> pd.DataFrame:
    """weekly_sample_summary with dask.dataframe, one partition per file (the week filter
    picks files by their partition folder). ``client``: a distributed Client to compute on;
    None uses the current Dask scheduler (threads unless configured)."""
    import dask
    import dask.dataframe as dd

    selected = set(_weeks(files, weeks))
    paths = [f for f in files if week_of_path(f) in selected]
    if not paths:
        return weekly_sample_summary([], weeks=weeks)
    ddf = dd.from_map(_read_partition, paths, meta=_dask_meta(), enforce_metadata=False)
    keys = list(GROUP_KEYS)
    sums = ddf.groupby(keys).agg(
        {
            "value": "count",
            "points": "sum",
            "covered_us": "sum",
            "weighted": "sum",
            "t_from": "min",
            "t_to": "max",
        }
    )
    quants = (
        ddf[[*keys, "value"]]
        .groupby(keys)
        .apply(_group_quantiles, meta={"p50": "float64", "p95": "float64"})
    )
    if client is not None:
        sums_pd, quants_pd = client.gather(client.compute([sums, quants]))
    else:
        sums_pd, quants_pd = dask.compute(sums, quants)
    joined = sums_pd.join(quants_pd, how="inner").reset_index()
    if len(joined) != len(sums_pd):
        raise RuntimeError("dask summary: quantile groups do not match the sum groups")
    covered_s = joined["covered_us"].astype("int64") / 1e6
    out = pd.DataFrame(
        {
            **{k: joined[k].where(joined[k] != _NULL, None) for k in GROUP_KEYS},
            "n": joined["value"],
            "points": joined["points"],
            "mean": (joined["weighted"] / covered_s).where(covered_s > 0, np.nan),
            "p50": joined["p50"],
            "p95": joined["p95"],
            "covered_s": covered_s,
            "first_t_from": pd.to_datetime(joined["t_from"], unit="us", utc=True),
            "last_t_to": pd.to_datetime(joined["t_to"], unit="us", utc=True),
        }
    )
    return _finish(out, SUMMARY_DTYPES, GROUP_KEYS)
