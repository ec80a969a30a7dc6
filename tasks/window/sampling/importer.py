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

The file is read in blocks by pyarrow (never a Python object per row): good rows are kept
as four columns (time, value, entity code, line: 28 bytes a row) for the per-entity
sort, and `samples` is written in parts of at most PART_ROWS rows. A value spanning lines
(a quoted newline) is not supported: its pieces are quarantined as bad rows.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from tasks.data.datasets import QUARANTINE, SAMPLE_GAPS, SAMPLES, write_dataset
from tasks.data.errors import CkptPocError
from tasks.data.plan import SAMPLE_UNITS, Plan
from tasks.data.runctx import RunContext

SOURCE = "import"
PART_ROWS = 250_000  # samples rows per written part: bounds the output table's memory
READ_BLOCK = 4 << 20  # bytes pyarrow parses at a time
RAW_MAX = 1000  # characters of a quarantined line kept in quarantine.raw
_SHOWN = 60  # characters of a bad value quoted in a reason
DEVICES = ("gpu", "cpu", "unknown")  # SAMPLES.device's allowed values
# Epoch seconds of 2000-01-01 and 2100-01-01 (tasks.baseline.accounting's plausible dates too): an
# export in epoch milliseconds lands far outside and is quarantined, not read as year 55000.
PLAUSIBLE_S = (946_684_800.0, 4_102_444_800.0)

_NUMBER = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"
_NON_FINITE = r"(?i)^[+-]?(nan|inf|infinity)$"
_ISO = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?)?\s*(Z|z|[+-]\d{2}(:?\d{2})?)?$"
_ZONE = r"(Z|z|[+-]\d{2}(:?\d{2})?)$"
_DATE_ONLY = r"^\d{4}-\d{2}-\d{2}$"
_GPU_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_US = pa.timestamp("us", tz="UTC")


class SampleImportError(CkptPocError):
    """An export that cannot be imported at all (single bad rows are quarantined)."""


@dataclass
class _Header:
    names: list[str]  # unique names for pyarrow (a repeated unused column gets a suffix)
    delimiter: str


@dataclass
class _Read:
    """What one pass over the file found: good rows as columns, bad rows by line."""

    times: list[np.ndarray] = field(default_factory=list)  # int64 µs since the epoch, UTC
    values: list[np.ndarray] = field(default_factory=list)
    codes: list[np.ndarray] = field(default_factory=list)  # int32 index into entities
    lines: list[np.ndarray] = field(default_factory=list)
    entities: dict[str, int] = field(default_factory=dict)
    bad_lines: list[np.ndarray] = field(default_factory=list)
    bad_reasons: list[pa.Array] = field(default_factory=list)
    bad_raw: dict[int, str] = field(default_factory=dict)  # lines whose raw text is known
    naive_times: int = 0
    rows_read: int = 0


# --- the header --------------------------------------------------------------------------------


def _read_header(path: Path) -> _Header:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(1 << 20)
    except OSError as exc:
        raise SampleImportError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    text = first.decode("utf-8-sig", errors="replace").rstrip("\r\n")
    if not text.strip():
        raise SampleImportError(f"{path}: no header line (the first line names the columns)")
    # The delimiter is the one of , ; tab that splits the header into the most columns.
    delimiter = max((",", ";", "\t"), key=lambda d: len(next(csv.reader([text], delimiter=d))))
    names = [n.strip() for n in next(csv.reader([text], delimiter=delimiter))]
    return _Header(names, delimiter)


def _check_columns(path: Path, header: _Header, wanted: dict[str, str]) -> None:
    for role, name in wanted.items():
        if name not in header.names:
            raise SampleImportError(
                f"{path}: no column {name!r} (the {role} column) in its header; it has: "
                + ", ".join(repr(n) for n in header.names)
            )
        if header.names.count(name) > 1:
            raise SampleImportError(f"{path}: column {name!r} appears twice in its header")
    if len(set(wanted.values())) < len(wanted):
        raise SampleImportError(
            "the time, value and entity columns must be three different columns, got "
            + ", ".join(f"{role}={name!r}" for role, name in wanted.items())
        )
    # pyarrow needs unique names; a repeated column the import does not use is renamed.
    seen: dict[str, int] = {}
    for i, name in enumerate(header.names):
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            header.names[i] = f"{name}#{i}"


# --- reading -----------------------------------------------------------------------------------


class _LineNumbers:
    """Physical line numbers of the rows pyarrow hands back: consecutive from line 2, less
    the lines its invalid-row handler skipped (reported with their numbers as it parses)."""

    def __init__(self) -> None:
        self.next = 2  # line 1 is the header
        self.skipped: list[int] = []
        self._seen = 0  # skipped lines already behind self.next

    def take(self, n: int) -> np.ndarray:
        end = self.next + n
        while True:  # widen the range by the skipped lines inside it, until it holds n rows
            inside = [s for s in self.skipped[self._seen :] if s < end]
            if self.next + n + len(inside) == end:
                break
            end = self.next + n + len(inside)
        lines = np.arange(self.next, end, dtype=np.int64)
        if inside:
            lines = lines[~np.isin(lines, np.array(inside, dtype=np.int64))]
        self._seen += len(inside)
        self.next = end
        return lines


def _stream(path: Path, header: _Header, columns: list[str], read: _Read) -> Iterator[pa.Table]:
    numbers = _LineNumbers()

    def on_invalid(row: Any) -> str:
        # use_threads=False: the handler gets physical line numbers, in order.
        number = int(row.number)
        numbers.skipped.append(number)
        read.bad_lines.append(np.array([number], dtype=np.int64))
        read.bad_reasons.append(
            pa.array([f"{row.actual_columns} fields, expected {row.expected_columns}"])
        )
        read.bad_raw[number] = row.text[:RAW_MAX]
        read.rows_read += 1
        return "skip"

    reader = pcsv.open_csv(
        path,
        read_options=pcsv.ReadOptions(
            column_names=header.names, skip_rows=1, use_threads=False, block_size=READ_BLOCK
        ),
        # Blank lines are kept as rows (quarantined): skipping them would shift line numbers.
        parse_options=pcsv.ParseOptions(
            delimiter=header.delimiter, invalid_row_handler=on_invalid, ignore_empty_lines=False
        ),
        convert_options=pcsv.ConvertOptions(
            include_columns=columns, column_types=dict.fromkeys(columns, pa.binary())
        ),
    )
    try:
        for batch in reader:
            if batch.num_rows:
                table = pa.Table.from_batches([batch]).combine_chunks()
                yield table.append_column("_line", pa.array(numbers.take(batch.num_rows)))
    except pa.ArrowInvalid as exc:
        raise SampleImportError(f"{path}: unreadable as CSV: {exc}") from exc


def _text(col: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """(trimmed strings, not-UTF-8 mask); only a block with invalid bytes pays a loop."""
    try:
        text = pc.cast(col, pa.string())
        bad = np.zeros(len(col), dtype=bool)
    except pa.ArrowInvalid:
        values, flags = [], []
        for raw in col.to_pylist():
            try:
                values.append(raw.decode())
                flags.append(False)
            except UnicodeDecodeError:
                values.append("")
                flags.append(True)
        text, bad = pa.array(values, pa.string()), np.array(flags, dtype=bool)
    return pc.utf8_trim_whitespace(text), bad


def _mask(array: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)


def _cast_each(text: pa.Array, to: pa.DataType) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values, ok mask): the bulk cast, or value by value when one value fails it
    (a 13th month passes the pattern but not the calendar)."""
    try:
        cast = pc.cast(text, to)
        return cast.cast(pa.int64()).to_numpy(zero_copy_only=False), np.ones(len(text), bool)
    except pa.ArrowInvalid:
        out, ok = np.zeros(len(text), dtype=np.int64), np.zeros(len(text), dtype=bool)
        for i, value in enumerate(text.to_pylist()):
            try:
                out[i] = pc.cast(pa.array([value]), to).cast(pa.int64())[0].as_py()
                ok[i] = True
            except pa.ArrowInvalid:
                pass
        return out, ok


def _times(text: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(µs since the epoch, parsed mask, plausible mask, parsed-as-naive-ISO mask)."""
    n = len(text)
    us = np.zeros(n, dtype=np.int64)
    parsed = np.zeros(n, dtype=bool)
    numeric = _mask(pc.match_substring_regex(text, _NUMBER))
    if numeric.any():
        seconds = pc.cast(pc.filter(text, pa.array(numeric)), pa.float64()).to_numpy()
        idx = np.flatnonzero(numeric)
        inside = (seconds >= PLAUSIBLE_S[0]) & (seconds < PLAUSIBLE_S[1])
        parsed[idx] = True
        # Out-of-range seconds keep 0 here; the plausible mask flags them below.
        us[idx[inside]] = np.round(seconds[inside] * 1e6).astype(np.int64)
    iso = _mask(pc.match_substring_regex(text, _ISO)) & ~numeric
    zoned = iso & _mask(pc.match_substring_regex(text, _ZONE))
    naive = iso & ~zoned
    # Nanoseconds first (a 9-digit fraction parses), then truncated to µs.
    for which, to in ((zoned, pa.timestamp("ns", tz="UTC")), (naive, pa.timestamp("ns"))):
        if which.any():
            idx = np.flatnonzero(which)
            ns, ok = _cast_each(pc.filter(text, pa.array(which)), to)
            us[idx[ok]] = ns[ok] // 1000
            parsed[idx[ok]] = True
    lo, hi = (int(s * 1_000_000) for s in PLAUSIBLE_S)
    plausible = parsed & (us >= lo) & (us < hi)
    return us, parsed, plausible, naive & parsed


def _values(text: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(float values, number mask, finite mask)."""
    number = _mask(pc.match_substring_regex(text, _NUMBER))
    non_finite = _mask(pc.match_substring_regex(text, _NON_FINITE))
    values = np.full(len(text), np.nan)
    if number.any():
        values[number] = pc.cast(pc.filter(text, pa.array(number)), pa.float64()).to_numpy()
    # "1e400" is a number that is not finite; so are "nan" and "inf".
    return values, number | non_finite, np.isfinite(values)


def _quoted(text: pa.Array, prefix: str, suffix: str) -> pa.Array:
    shown = pc.utf8_slice_codeunits(text, 0, _SHOWN)
    return pc.binary_join_element_wise(prefix + "'", shown, "'" + suffix, "")


def _parse_block(table: pa.Table, cols: dict[str, str], read: _Read) -> None:
    t_text, t_bad = _text(table.column(cols["time"]).combine_chunks())
    v_text, v_bad = _text(table.column(cols["value"]).combine_chunks())
    e_text, e_bad = _text(table.column(cols["entity"]).combine_chunks())
    lines = table.column("_line").to_numpy()
    us, t_parsed, t_plausible, naive = _times(t_text)
    values, v_number, v_finite = _values(v_text)
    t_empty = _mask(pc.equal(t_text, ""))
    v_empty = _mask(pc.equal(v_text, ""))
    e_empty = _mask(pc.equal(e_text, ""))
    tc, vc = cols["time"], cols["value"]
    # The first failing check names the row's reason.
    checks: list[tuple[np.ndarray, Any]] = [
        (t_bad | v_bad | e_bad, "not UTF-8"),
        (t_empty & v_empty & e_empty, "empty row: no time, value or entity"),
        (t_empty, f"{tc}: no time"),
        (~t_parsed, _quoted(t_text, f"{tc}: ", " is neither epoch seconds nor ISO 8601")),
        (~t_plausible, _quoted(t_text, f"{tc}: ", " is outside 2000–2100 (milliseconds?)")),
        (v_empty, f"{vc}: no value"),
        (~v_number, _quoted(v_text, f"{vc}: ", " is not a number")),
        (~v_finite, _quoted(v_text, f"{vc}: ", " is not finite")),
        (e_empty, f"{cols['entity']}: no entity"),
    ]
    n = table.num_rows
    reason = pa.nulls(n, pa.string())
    bad = np.zeros(n, dtype=bool)
    for failing, why in checks:
        new = failing & ~bad
        if new.any():
            reason = pc.if_else(pa.array(new), why, reason)
            bad |= new
    good = ~bad
    read.rows_read += n
    if bad.any():
        read.bad_lines.append(lines[bad])
        read.bad_reasons.append(pc.filter(reason, pa.array(bad)))
    if not good.any():
        return
    read.naive_times += int((good & naive).sum())
    # Entities to codes: one dictionary lookup per distinct entity of the block.
    encoded = pc.dictionary_encode(pc.filter(e_text, pa.array(good)))
    to_code = np.array(
        [read.entities.setdefault(e, len(read.entities)) for e in encoded.dictionary.to_pylist()],
        dtype=np.int32,
    )
    read.codes.append(to_code[encoded.indices.to_numpy()])
    read.times.append(us[good])
    read.values.append(values[good])
    read.lines.append(lines[good])


def _raw_lines(path: Path, wanted: np.ndarray) -> dict[int, str]:
    """The text of the given (sorted, distinct) physical lines, in one pass over the file."""
    out: dict[int, str] = {}
    if not len(wanted):
        return out
    i, line, carry = 0, 1, b""
    with open(path, "rb") as fh:
        while i < len(wanted):
            chunk = fh.read(8 << 20)
            if not chunk:  # the last line, without a final newline
                if carry and wanted[i] == line:
                    out[line] = _decode(carry)
                break
            data = carry + chunk
            newlines = data.count(b"\n")
            if wanted[i] < line + newlines:
                parts = data.split(b"\n")
                while i < len(wanted) and wanted[i] < line + newlines:
                    out[int(wanted[i])] = _decode(parts[int(wanted[i]) - line])
                    i += 1
                carry = parts[-1]
            else:
                carry = data[data.rfind(b"\n") + 1 :] if newlines else data
            line += newlines
    return out


def _decode(raw: bytes) -> str:
    return raw.rstrip(b"\r").decode("utf-8", errors="replace")[:RAW_MAX]


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
) -> dict[str, Any]:
    """Read a CSV export into `samples`, `sample_gaps` and `quarantine`, then commit the run.

    Nothing is written when the file cannot be imported at all (a missing column, a node
    outside the plan). ``notes`` (optional) receives what the summary's numbers do not say:
    naive times read as UTC, entities that took another's interval. Returns the summary.
    """
    path = Path(path)
    node = _check_options(plan, node, gap_factor, unit, device, metric)
    header = _read_header(path)
    cols = {"time": time_column, "value": value_column, "entity": entity_column}
    _check_columns(path, header, cols)
    metric = metric or value_column
    notes = notes if notes is not None else []

    read = _Read()
    for table in _stream(path, header, list(cols.values()), read):
        _parse_block(table, cols, read)
    names = list(read.entities)
    times = np.concatenate(read.times) if read.times else np.zeros(0, np.int64)
    values = np.concatenate(read.values) if read.values else np.zeros(0)
    codes = np.concatenate(read.codes) if read.codes else np.zeros(0, np.int32)
    lines = np.concatenate(read.lines) if read.lines else np.zeros(0, np.int64)
    read.times = read.values = read.codes = read.lines = []  # the concatenated copies only

    # Sorted by entity, time, line: a repeat of (entity, time) follows its first line.
    order = np.lexsort((lines, times, codes))
    times, values, codes, lines = times[order], values[order], codes[order], lines[order]
    same = np.zeros(len(times), dtype=bool)
    same[1:] = (codes[1:] == codes[:-1]) & (times[1:] == times[:-1])
    if same.any():
        # Each repeat names the first line of its (entity, time), the one kept.
        firsts = np.flatnonzero(~same)
        first_line = lines[firsts][np.searchsorted(firsts, np.flatnonzero(same), "right") - 1]
        _quarantine(
            read,
            lines[same],
            [f"duplicate of line {n}: same entity and time (line {n} kept)" for n in first_line],
        )
        keep = ~same
        times, values, codes, lines = times[keep], values[keep], codes[keep], lines[keep]

    # Per entity: its median spacing (entities are contiguous runs after the sort).
    bounds = np.flatnonzero(np.diff(codes)) + 1
    starts = np.concatenate([[0], bounds]) if len(codes) else np.zeros(0, np.int64)
    ends = np.concatenate([bounds, [len(codes)]]) if len(codes) else np.zeros(0, np.int64)
    spacing = np.diff(times).astype(np.float64) / 1e6  # seconds; across entities is masked
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
        _quarantine(
            read,
            lines[alone],
            [
                f"only sample of entity {names[c]!r}: no spacing to take an interval from, "
                "and no other entity has one"
                for c in codes[alone]
            ],
        )
        keep = ~alone
        times, values, codes, lines = times[keep], values[keep], codes[keep], lines[keep]
    if read.naive_times:
        notes.append(f"{read.naive_times} ISO time(s) without a zone were read as UTC")

    # Gaps: a spacing over gap_factor × the entity's interval, within one entity.
    row_iv_us = np.round(interval[codes] * 1e6).astype(np.int64)
    within = codes[1:] == codes[:-1] if len(codes) else np.zeros(0, bool)
    step = np.diff(times)
    is_gap = within & (step > gap_factor * row_iv_us[1:])
    g_from, g_to = times[:-1][is_gap], times[1:][is_gap] - row_iv_us[1:][is_gap]
    g_codes, g_step = codes[1:][is_gap], step[is_gap] / 1e6

    store = {"data_dir": ctx.data_dir, "poc": ctx.poc, "run_id": ctx.run_id}
    meta = {
        **ctx.file_metadata,
        "ckpt_poc.import_file": str(path),
        "ckpt_poc.import_columns": f"time={time_column},value={value_column},"
        f"entity={entity_column}",
    }
    entity_dict = pa.array(names, pa.string())
    uuids = pa.array(
        [e if device == "gpu" and _GPU_UUID.match(e) else None for e in names], pa.string()
    )
    for part, lo in enumerate(range(0, len(times), PART_ROWS)):
        sl = slice(lo, lo + PART_ROWS)
        c = pa.array(codes[sl], pa.int32())
        n = len(c)
        table = _stamped(
            {
                "node": _const(node, pa.string(), n),
                "source": _const(SOURCE, pa.string(), n),
                "entity": pa.DictionaryArray.from_arrays(c, entity_dict),
                "device": _const(device, pa.string(), n),
                "gpu_uuid": pc.take(uuids, c),
                "metric": _const(metric, pa.string(), n),
                "unit": _const(unit, pa.string(), n),
                "value": pa.array(values[sl], pa.float64()),
                "t_from": _us(times[sl] - row_iv_us[sl]),
                "t_to": _us(times[sl]),
                "points": _const(1, pa.int64(), n),
                "attributed_by": _const("none", pa.string(), n),
            },
            SAMPLES,
            ctx,
            n,
        )
        write_dataset(table, SAMPLES, part=part, metadata=meta, **store)
    if len(g_from):
        factor = f"{gap_factor:g}"
        reasons = [
            f"spacing {s:g} s > {factor} × interval {interval[c]:g} s"
            for s, c in zip(g_step, g_codes, strict=True)
        ]
        gaps = _stamped(
            {
                "node": _const(node, pa.string(), len(g_from)),
                "source": _const(SOURCE, pa.string(), len(g_from)),
                "entity": pc.take(entity_dict, pa.array(g_codes, pa.int32())),
                "metric": _const(metric, pa.string(), len(g_from)),
                "t_from": _us(g_from),
                "t_to": _us(g_to),
                "gap_s": pa.array((g_to - g_from) / 1e6, pa.float64()),
                "reason": pa.array(reasons, pa.string()),
                "detected_by": _const("import", pa.string(), len(g_from)),
            },
            SAMPLE_GAPS,
            ctx,
            len(g_from),
        )
        write_dataset(gaps, SAMPLE_GAPS, metadata=meta, **store)
    quarantined = _write_quarantine(read, path, ctx, store, meta)

    gap_us = (g_to - g_from).sum() if len(g_from) else 0
    return {
        "rows_read": read.rows_read,
        "rows_quarantined": quarantined,
        "entities": len(np.unique(codes)),
        "first": float(times.min()) / 1e6 if len(times) else None,
        "last": float(times.max()) / 1e6 if len(times) else None,
        "interval_s": median_all,
        "gaps": len(g_from),
        "gap_seconds": float(gap_us) / 1e6,
        "mean_value": float(values.mean()) if len(values) else None,
    }


def _few(names: list[str], codes: list[int], shown: int = 5) -> str:
    listed = ", ".join(names[c] for c in codes[:shown])
    return listed + (f" and {len(codes) - shown} more" if len(codes) > shown else "")


def _quarantine(read: _Read, lines: np.ndarray, reasons: list[str]) -> None:
    if len(lines):
        read.bad_lines.append(lines.astype(np.int64))
        read.bad_reasons.append(pa.array(reasons, pa.string()))


def _write_quarantine(
    read: _Read, path: Path, ctx: RunContext, store: dict[str, Any], meta: dict[str, str]
) -> int:
    if not read.bad_lines:
        return 0
    lines = np.concatenate(read.bad_lines)
    reasons = pa.concat_arrays([r.cast(pa.string()) for r in read.bad_reasons])
    order = np.argsort(lines, kind="stable")
    lines, reasons = lines[order], reasons.take(pa.array(order))
    unknown = np.array(sorted(set(lines.tolist()) - set(read.bad_raw)), dtype=np.int64)
    raw = {**read.bad_raw, **_raw_lines(path, unknown)}
    n = len(lines)
    table = _stamped(
        {
            "source": _const(str(path), pa.string(), n),
            "source_line": pa.array(lines, pa.int64()),
            "reason": reasons,
            "raw": pa.array([raw.get(int(line), "") for line in lines], pa.string()),
            "read_at": _const(dt.datetime.now(dt.UTC), _US, n),
        },
        QUARANTINE,
        ctx,
        n,
    )
    write_dataset(table, QUARANTINE, metadata=meta, **store)
    return n
