"""Import the sample history a site already has (a CSV export) into `samples` and
`sample_gaps`, with every row it cannot take in the `quarantine`.

The export holds one sample a line: a time, a value and an entity (a GPU, a pod, a
container). The rules, so that imported rows mean what live rows mean (tasks.window.sampling):

- Times are epoch seconds (int or float) or ISO 8601. An ISO time without a zone is read as
  UTC (the import's notes say how many were).
- Each entity's interval is the median spacing of its own samples, and each sample row
  covers [t - interval, t] (a live row covers its read's interval the same way). An entity
  with a single sample takes the median of the other entities' intervals (said in the
  notes); with no other entity to take it from, its sample is quarantined.
- A spacing longer than gap_factor × the entity's interval is a `sample_gaps` row covering
  what no sample covers: [previous sample, next sample - interval].
- Quarantined, with the CSV line number, the reason and the raw line: a row with the
  wrong number of fields, an empty or unparseable time or value, a non-finite value, a
  time outside 2000–2100 (epoch milliseconds, say), an empty entity, and a second row for
  the same (entity, time) (the first line is kept). Rows out of order are fine: they are
  sorted.

The file is read in blocks by pyarrow (tasks/window/sampling/csv_export.py: never a Python
object per row): good rows are kept as four columns (time, value, entity code, line: 28 bytes
a row) for the per-entity sort here, and `samples` is written in parts of at most PART_ROWS
rows. A value spanning lines (a quoted newline) is not supported: its pieces are quarantined
as bad rows.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.data.datasets import QUARANTINE, SAMPLE_GAPS, SAMPLES, DatasetSpec
from tasks.data.jsonform import JsonForm
from tasks.data.plan import SAMPLE_UNITS, Plan
from tasks.data.runctx import RunContext
from tasks.data.store import write_dataset
from tasks.window.sampling.csv_export import (
    ExportRead,
    SampleImportError,
    check_columns,
    read_export,
    read_header,
)

SOURCE = "import"
PART_ROWS = 250_000  # samples rows per written part: bounds the output table's memory
DEVICES = ("gpu", "cpu", "unknown")  # SAMPLES.device's allowed values
_GPU_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_US = pa.timestamp("us", tz="UTC")


@dataclass
class _Rows:
    """The good rows, sorted by entity, time and line: one array per column."""

    times: np.ndarray  # int64 µs since the epoch, UTC
    values: np.ndarray
    codes: np.ndarray  # int32 index into the entity names
    lines: np.ndarray

    def keep(self, mask: np.ndarray) -> None:
        self.times, self.values = self.times[mask], self.values[mask]
        self.codes, self.lines = self.codes[mask], self.lines[mask]


@dataclass(frozen=True)
class _Gaps:
    """Spacings over gap_factor × the entity's interval: what no sample covers."""

    t_from: np.ndarray  # µs: the sample before the gap
    t_to: np.ndarray  # µs: the next sample less its interval
    codes: np.ndarray
    step_s: np.ndarray  # the spacing itself, seconds


@dataclass(frozen=True)
class _Target:
    """What every written row shares: the run, the node, the metric, its unit and device."""

    ctx: RunContext
    node: str
    metric: str
    unit: str
    device: str
    meta: dict[str, str]  # the files' metadata: the run's, and what was imported

    def write(self, table: pa.Table, spec: DatasetSpec, part: int | None = None) -> None:
        ctx = self.ctx
        write_dataset(
            table,
            spec,
            part=part,
            metadata=self.meta,
            data_dir=ctx.data_dir,
            poc=ctx.poc,
            run_id=ctx.run_id,
        )


# --- the import --------------------------------------------------------------------------------


def _check_options(
    plan: Plan, node: str | None, gap_factor: float, unit: str, device: str, metric: str | None
) -> str:
    nodes = list(plan.cluster.nodes)
    if node is None:
        node = nodes[0]
    elif node not in nodes:
        raise SampleImportError(
            f"node {node!r} is not one of the plan's cluster.nodes ({', '.join(nodes)})"
        )
    if not (math.isfinite(gap_factor) and gap_factor > 1):
        raise SampleImportError(f"gap factor must be a finite number above 1, got {gap_factor}")
    if unit not in SAMPLE_UNITS:
        raise SampleImportError(f"unit {unit!r} is not one of {', '.join(SAMPLE_UNITS)}")
    if device not in DEVICES:
        raise SampleImportError(f"device {device!r} is not one of {', '.join(DEVICES)}")
    if metric is not None and not metric.strip():
        raise SampleImportError("metric must not be empty")
    return node


def _const(value: Any, type_: pa.DataType, n: int) -> pa.Array:
    """One value for every row: a string as a one-entry dictionary (4 bytes a row)."""
    if value is None:
        return pa.nulls(n, type_)
    if pa.types.is_string(type_):
        return pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(n, dtype=np.int32)), pa.array([value], pa.string())
        )
    return pa.repeat(pa.scalar(value, type_), n)


def _stamped(columns: dict[str, pa.Array], spec: Any, ctx: RunContext, n: int) -> pa.Table:
    """The spec's columns in order: the given ones, the run's stamp, nulls for the rest."""
    stamp = ctx.stamp()
    out = {}
    for col in spec.columns:
        if col.name in columns:
            out[col.name] = columns[col.name]
        else:
            out[col.name] = _const(stamp.get(col.name), col.type, n)
    return pa.table(out)


def _us(values: np.ndarray) -> pa.Array:
    return pa.array(values.astype(np.int64), pa.int64()).cast(_US)


def import_samples(
    plan: Plan,
    ctx: RunContext,
    path: str | Path,
    *,
    time_column: str,
    value_column: str,
    entity_column: str,
    metric: str | None = None,
    gap_factor: float = 5.0,
    node: str | None = None,
    unit: str = "percent",
    device: str = "unknown",
    notes: list[str] | None = None,
) -> ImportSummary:
    """Read a CSV export into `samples`, `sample_gaps` and `quarantine`, then commit the run.

    Nothing is written when the file cannot be imported at all (a missing column, a node
    outside the plan). ``notes`` (optional) receives what the summary's numbers do not say:
    naive times read as UTC, entities that took another's interval. Returns the summary.
    """
    path = Path(path)
    node = _check_options(plan, node, gap_factor, unit, device, metric)
    header = read_header(path)
    cols = {"time": time_column, "value": value_column, "entity": entity_column}
    check_columns(path, header, cols)
    metric = metric or value_column
    notes = notes if notes is not None else []

    read = read_export(path, header, cols)
    names = list(read.entities)
    rows = _sorted_rows(read)
    _drop_repeats(rows, read)
    interval, median_all = _intervals(rows, names, read, notes)
    if read.naive_times:
        notes.append(f"{read.naive_times} ISO time(s) without a zone were read as UTC")
    row_iv_us, gaps = _find_gaps(rows, interval, gap_factor)

    meta = {
        **ctx.file_metadata,
        "ckpt_poc.import_file": str(path),
        "ckpt_poc.import_columns": f"time={time_column},value={value_column},"
        f"entity={entity_column}",
    }
    target = _Target(ctx, node, metric, unit, device, meta)
    entity_dict = pa.array(names, pa.string())
    _write_samples(rows, row_iv_us, entity_dict, target)
    _write_gaps(gaps, interval, gap_factor, entity_dict, target)
    quarantined = _write_quarantine(read, path, target)
    return _summary(read, rows, quarantined, median_all, gaps)


# --- sorting, repeats, intervals and gaps ------------------------------------------------------


def _sorted_rows(read: ExportRead) -> _Rows:
    times, values, codes, lines = read.take_good_rows()
    # Sorted by entity, time, line: a repeat of (entity, time) follows its first line.
    order = np.lexsort((lines, times, codes))
    return _Rows(times[order], values[order], codes[order], lines[order])


def _drop_repeats(rows: _Rows, read: ExportRead) -> None:
    """Quarantine each repeat of an (entity, time); the first line is kept."""
    same = np.zeros(len(rows.times), dtype=bool)
    same[1:] = (rows.codes[1:] == rows.codes[:-1]) & (rows.times[1:] == rows.times[:-1])
    if same.any():
        # Each repeat names the first line of its (entity, time), the one kept.
        firsts = np.flatnonzero(~same)
        first_line = rows.lines[firsts][np.searchsorted(firsts, np.flatnonzero(same), "right") - 1]
        read.quarantine(
            rows.lines[same],
            [f"duplicate of line {n}: same entity and time (line {n} kept)" for n in first_line],
        )
        rows.keep(~same)


def _intervals(
    rows: _Rows, names: list[str], read: ExportRead, notes: list[str]
) -> tuple[np.ndarray, float | None]:
    """(each entity's interval in seconds, the median of all of them): an entity's own is the
    median spacing of its samples; a lone sample takes the others' median, or is quarantined
    when no other entity has one."""
    codes = rows.codes
    # Entities are contiguous runs after the sort.
    bounds = np.flatnonzero(np.diff(codes)) + 1
    starts = np.concatenate([[0], bounds]) if len(codes) else np.zeros(0, np.int64)
    ends = np.concatenate([bounds, [len(codes)]]) if len(codes) else np.zeros(0, np.int64)
    spacing = np.diff(rows.times).astype(np.float64) / 1e6  # seconds; across entities is masked
    own: dict[int, float] = {}
    for s, e in zip(starts, ends, strict=True):
        if e - s > 1:
            own[int(codes[s])] = float(np.median(spacing[s : e - 1]))
    median_all = float(np.median(list(own.values()))) if own else None
    interval = np.zeros(len(names))
    for code, iv in own.items():
        interval[code] = iv
    lonely = [int(codes[s]) for s, e in zip(starts, ends, strict=True) if e - s == 1]
    if lonely and median_all is not None:
        interval[lonely] = median_all
        notes.append(
            f"{len(lonely)} entit{'y' if len(lonely) == 1 else 'ies'} with a single sample "
            f"({_few(names, lonely)}) took the median interval of the others, {median_all:g} s"
        )
    elif lonely:
        alone = np.isin(codes, lonely)
        read.quarantine(
            rows.lines[alone],
            [
                f"only sample of entity {names[c]!r}: no spacing to take an interval from, "
                "and no other entity has one"
                for c in codes[alone]
            ],
        )
        rows.keep(~alone)
    return interval, median_all


def _find_gaps(rows: _Rows, interval: np.ndarray, gap_factor: float) -> tuple[np.ndarray, _Gaps]:
    """(each row's interval in µs, the gaps): a spacing over gap_factor × the entity's
    interval, within one entity."""
    codes, times = rows.codes, rows.times
    row_iv_us = np.round(interval[codes] * 1e6).astype(np.int64)
    within = codes[1:] == codes[:-1] if len(codes) else np.zeros(0, bool)
    step = np.diff(times)
    is_gap = within & (step > gap_factor * row_iv_us[1:])
    gaps = _Gaps(
        t_from=times[:-1][is_gap],
        t_to=times[1:][is_gap] - row_iv_us[1:][is_gap],
        codes=codes[1:][is_gap],
        step_s=step[is_gap] / 1e6,
    )
    return row_iv_us, gaps


def _few(names: list[str], codes: list[int], shown: int = 5) -> str:
    listed = ", ".join(names[c] for c in codes[:shown])
    return listed + (f" and {len(codes) - shown} more" if len(codes) > shown else "")


# --- writing -----------------------------------------------------------------------------------


def _write_samples(
    rows: _Rows, row_iv_us: np.ndarray, entity_dict: pa.Array, target: _Target
) -> None:
    """`samples` in parts of at most PART_ROWS rows, each covering [t - interval, t]."""
    names = entity_dict.to_pylist()
    device = target.device
    uuids = pa.array(
        [e if device == "gpu" and _GPU_UUID.match(e) else None for e in names], pa.string()
    )
    for part, lo in enumerate(range(0, len(rows.times), PART_ROWS)):
        sl = slice(lo, lo + PART_ROWS)
        c = pa.array(rows.codes[sl], pa.int32())
        n = len(c)
        table = _stamped(
            {
                "node": _const(target.node, pa.string(), n),
                "source": _const(SOURCE, pa.string(), n),
                "entity": pa.DictionaryArray.from_arrays(c, entity_dict),
                "device": _const(device, pa.string(), n),
                "gpu_uuid": pc.take(uuids, c),
                "metric": _const(target.metric, pa.string(), n),
                "unit": _const(target.unit, pa.string(), n),
                "value": pa.array(rows.values[sl], pa.float64()),
                "t_from": _us(rows.times[sl] - row_iv_us[sl]),
                "t_to": _us(rows.times[sl]),
                "points": _const(1, pa.int64(), n),
                "attributed_by": _const("none", pa.string(), n),
            },
            SAMPLES,
            target.ctx,
            n,
        )
        target.write(table, SAMPLES, part=part)


def _write_gaps(
    gaps: _Gaps, interval: np.ndarray, gap_factor: float, entity_dict: pa.Array, target: _Target
) -> None:
    n = len(gaps.t_from)
    if not n:
        return
    factor = f"{gap_factor:g}"
    reasons = [
        f"spacing {s:g} s > {factor} × interval {interval[c]:g} s"
        for s, c in zip(gaps.step_s, gaps.codes, strict=True)
    ]
    table = _stamped(
        {
            "node": _const(target.node, pa.string(), n),
            "source": _const(SOURCE, pa.string(), n),
            "entity": pc.take(entity_dict, pa.array(gaps.codes, pa.int32())),
            "metric": _const(target.metric, pa.string(), n),
            "t_from": _us(gaps.t_from),
            "t_to": _us(gaps.t_to),
            "gap_s": pa.array((gaps.t_to - gaps.t_from) / 1e6, pa.float64()),
            "reason": pa.array(reasons, pa.string()),
            "detected_by": _const("import", pa.string(), n),
        },
        SAMPLE_GAPS,
        target.ctx,
        n,
    )
    target.write(table, SAMPLE_GAPS)


def _write_quarantine(read: ExportRead, path: Path, target: _Target) -> int:
    if not read.bad_lines:
        return 0
    lines, reasons, raw = read.bad_rows(path)
    n = len(lines)
    table = _stamped(
        {
            "source": _const(str(path), pa.string(), n),
            "source_line": pa.array(lines, pa.int64()),
            "reason": reasons,
            "raw": pa.array(raw, pa.string()),
            "read_at": _const(dt.datetime.now(dt.UTC), _US, n),
        },
        QUARANTINE,
        target.ctx,
        n,
    )
    target.write(table, QUARANTINE)
    return n


@dataclass(frozen=True, slots=True)
class ImportSummary(JsonForm):
    """What an import read and wrote (the samples_import flow's summary)."""

    rows_read: int
    rows_quarantined: int
    entities: int
    first: float | None  # epoch seconds of the first and last sample
    last: float | None
    interval_s: float | None  # the median interval over every entity
    gaps: int
    gap_seconds: float
    mean_value: float | None


def _summary(
    read: ExportRead, rows: _Rows, quarantined: int, median_all: float | None, gaps: _Gaps
) -> ImportSummary:
    times, values = rows.times, rows.values
    gap_us = (gaps.t_to - gaps.t_from).sum() if len(gaps.t_from) else 0
    return ImportSummary(
        rows_read=read.rows_read,
        rows_quarantined=quarantined,
        entities=len(np.unique(rows.codes)),
        first=float(times.min()) / 1e6 if len(times) else None,
        last=float(times.max()) / 1e6 if len(times) else None,
        interval_s=median_all,
        gaps=len(gaps.t_from),
        gap_seconds=float(gap_us) / 1e6,
        mean_value=float(values.mean()) if len(values) else None,
    )
