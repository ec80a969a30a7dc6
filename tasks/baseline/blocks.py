"""A newline-aligned byte block of a dump → parsed job rows plus its quarantine.

pyarrow's multithreaded CSV reader reads the block (the delimiter as separator, no quoting),
typed where it can; then every field is parsed with vectorised Arrow compute (tasks.baseline.
fields), fields with few distinct values once per distinct value. A row that cannot be parsed
is never dropped: it goes to the quarantine with the first reason it fails for, so
``rows_read == parsed + quarantined`` holds for every block.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from tasks.baseline.dump_layout import GPU_SOURCES, DumpLayout
from tasks.baseline.fields import (
    ABSENT,
    EXIT_TYPE,
    GRES_TYPE,
    JOB_ID_RE,
    PLAUSIBLE_FROM,
    PLAUSIBLE_UNTIL,
    STATE_TYPE,
    TIMELIMIT_TYPE,
    TRES_TYPE,
    as_dictionary,
    as_utf8,
    implausible,
    map_distinct,
    parse_duration_s,
    parse_exit,
    parse_gres,
    parse_integers,
    parse_state,
    parse_timelimit,
    parse_tres,
    text_of,
)
from tasks.baseline.pseudonym import Pseudonymiser
from tasks.baseline.quarantine import Quarantined, misaligned_raw, quarantine_rows
from tasks.baseline.time_formats import STANDARD, TIME_FIELDS, TimeFormat, parse_times
from tasks.data.errors import AccountingError
from tasks.data.slurm_states import UNKNOWN_STATE

# The columns the parser produces; the jobs dataset adds the run stamp and fingerprint.
JOB_COLUMNS = (
    "cluster",
    "job_id",
    "job_id_raw",
    "array_job_id",
    "array_task_id",
    "het_job_id",
    "het_offset",
    "step",
    "is_allocation",
    "partition",
    "user",
    "account",
    "job_name",
    "state",
    "state_raw",
    "exit_code",
    "exit_signal",
    "submit",
    "start",
    "end",
    "elapsed_s",
    "timelimit_s",
    "timelimit_raw",
    "nnodes",
    "ncpus",
    "gpus",
    "mem_bytes",
    "node_list",
    "source_line",
)


@dataclass
class ParsedBlock:
    jobs: pa.Table  # canonical columns (see JOB_COLUMNS), no run stamp yet
    quarantine: list[Quarantined] = field(default_factory=list)
    rows_read: int = 0
    fields: tuple[str, ...] = ()  # the known fields the dump has (see not_computed)
    # Parsed allocation rows per source of their GPU count (GPU_SOURCES, or "none").
    gpu_sources: dict[str, int] = field(default_factory=dict)
    # Time field → the format its values were read in (TimeFormat.label).
    time_formats: dict[str, str] = field(default_factory=dict)
    short_rows: int = 0  # rows short of trailing fields, read with those fields empty


# --- reading a block ---------------------------------------------------------------------------


def _classify_lines(
    block: bytes, layout: DumpLayout, first_line: int, pseudonymiser: Pseudonymiser
) -> tuple[list[int], list[Quarantined], bytes | None, int]:
    """Slow path for a block with empty or malformed lines: exact line numbers for each row,
    the block with each row short of trailing fields padded with empty ones (None when none
    is short) and how many were. sacct never drops a field, but tools that rewrite dumps
    drop trailing empty ones; a row with more fields than the header is quarantined."""
    good: list[int] = []
    bad: list[Quarantined] = []
    delim = layout.delimiter
    lines = block.split(b"\n")
    short = 0
    for i, line in enumerate(lines):
        line = line.rstrip(b"\r")
        if not line:
            continue
        n = line.count(delim) + 1
        if n < layout.n_fields:
            lines[i] = line + delim * (layout.n_fields - n)
            short += 1
        if n <= layout.n_fields:
            good.append(first_line + i)
        else:
            bad.append(
                Quarantined(
                    first_line + i,
                    f"{n} fields, expected {layout.n_fields}",
                    misaligned_raw(line.decode("utf-8", "replace"), layout, pseudonymiser),
                )
            )
    return good, bad, (b"\n".join(lines) if short else None), short


# Each distinct value is parsed once per process, not once per block: the same TRES, exit
# codes, time limits and states recur in every block (at 5 M rows, 34 blocks of 1.6 k
# distinct AllocTRES each). What the parsers return is only read.
_once = functools.lru_cache(maxsize=1 << 14)
_parse_exit, _parse_gres, _parse_state = _once(parse_exit), _once(parse_gres), _once(parse_state)
_parse_timelimit, _parse_tres = _once(parse_timelimit), _once(parse_tres)

_DICT = pa.dictionary(pa.int32(), pa.string())
# The typed fast path: Arrow converts while it reads. Low-cardinality fields arrive
# dictionary-encoded, so each distinct value is parsed (or hashed) once.
_FAST_TYPES: dict[str, pa.DataType] = {
    **dict.fromkeys(("JobID", "JobIDRaw", "Elapsed"), pa.string()),
    **dict.fromkeys(("ElapsedRaw", "NNodes", "NCPUS"), pa.int64()),
}
# A time field's type on the fast path, by its format's kind (strftime and relative ones are
# parsed from text by tasks.baseline.time_formats).
_TIME_TYPES = {"standard": pa.timestamp("s"), "epoch": pa.int64()}
_READ_BLOCK = 4 << 20  # pyarrow parses blocks of this size in parallel
_LONE_CR = re.compile(rb"\r(?!\n|\Z)")


def _read_block(
    data: bytes | memoryview,
    names: list[str],
    sep: str,
    typed: bool,
    time_formats: dict[str, TimeFormat],
) -> tuple[pa.Table, int]:
    """Read one block with pyarrow; returns the table and the number of malformed rows."""
    invalid = [0]

    def on_invalid(row: Any) -> str:
        invalid[0] += 1
        return "skip"

    if typed:
        types = {n: _FAST_TYPES.get(n, _DICT) for n in names}
        for name, fmt in time_formats.items():
            types[name] = _TIME_TYPES.get(fmt.kind, pa.string())
        convert = pcsv.ConvertOptions(
            column_types=types,
            null_values=ABSENT,
            strings_can_be_null=False,
            timestamp_parsers=[pcsv.ISO8601],
        )
    else:
        convert = pcsv.ConvertOptions(column_types=dict.fromkeys(names, pa.binary()))
    table = pcsv.read_csv(
        pa.BufferReader(pa.py_buffer(data)),
        read_options=pcsv.ReadOptions(column_names=names, block_size=_READ_BLOCK),
        parse_options=pcsv.ParseOptions(
            delimiter=sep, quote_char=False, escape_char=False, invalid_row_handler=on_invalid
        ),
        convert_options=convert,
    )
    return table, invalid[0]


def parse_block(
    block: bytes | memoryview,
    layout: DumpLayout,
    first_line: int,
    pseudonymiser: Pseudonymiser,
    *,
    newlines: int | None = None,
    pseudonymise_job_names: bool = False,
    default_cluster: str = "unknown",
    time_formats: dict[str, TimeFormat] | None = None,
) -> ParsedBlock:
    """Parse one newline-aligned block whose first line is ``first_line`` (1-based).

    First the typed fast path; if any value in the block does not convert, the block is
    read again as raw bytes and every field is checked row by row (vectorised), so one bad
    value costs its block the slower path, never its neighbours a quarantine.
    ``time_formats``: each time field's format (tasks.baseline.time_formats); standard
    where not given.
    """
    formats = {n: (time_formats or {}).get(n, STANDARD) for n in TIME_FIELDS if n in layout.names}
    table, invalid = _read_either(block, layout, formats)
    if newlines is None:
        newlines = bytes(block).count(b"\n")
    n_lines = newlines + (0 if block[-1:] == b"\n" else 1)
    short_rows = 0
    if invalid or table.num_rows != n_lines:
        raw = bytes(block)
        # sacct prints a carriage return inside a field (a job name) as it is; pyarrow would
        # end the row there, so each one not ending a line reads as a space.
        text, crs = _LONE_CR.subn(b" ", raw) if b"\r" in raw else (raw, 0)
        good_lines, quarantine, padded, short_rows = _classify_lines(
            text, layout, first_line, pseudonymiser
        )
        if padded is not None or crs:
            table, _ = _read_either(padded or text, layout, formats)
        lines = pa.array(good_lines, pa.int64())
    else:
        quarantine = []
        lines = pa.array(np.arange(first_line, first_line + n_lines, dtype=np.int64))
    if len(lines) != table.num_rows:  # cannot happen unless the two readers disagree
        raise AccountingError(
            f"internal: line classification found {len(lines)} rows, reader {table.num_rows}"
        )
    rows_read = table.num_rows + len(quarantine)
    jobs, more, gpu_sources = _parse_fields(
        table.combine_chunks(),
        lines,
        _Reading(layout, pseudonymiser, pseudonymise_job_names, default_cluster, formats),
    )
    quarantine.extend(more)
    labels = {name: fmt.label for name, fmt in formats.items()}
    return ParsedBlock(jobs, quarantine, rows_read, layout.fields, gpu_sources, labels, short_rows)


def _read_either(
    block: bytes | memoryview, layout: DumpLayout, formats: dict[str, TimeFormat]
) -> tuple[pa.Table, int]:
    """The block typed where every value converts, else as raw bytes."""
    data: bytes | memoryview = block
    if len(layout.delimiter) > 1:  # pyarrow's reader takes one byte: swap in a unit separator
        data = bytes(block).replace(layout.delimiter, b"\x1f")
    sep = "\x1f" if len(layout.delimiter) > 1 else layout.delimiter.decode()
    names = layout.column_names
    try:
        return _read_block(data, names, sep, True, formats)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return _read_block(data, names, sep, False, formats)


@dataclass(frozen=True)
class _Reading:
    """How a block's fields are read: the dump's layout and time formats, and the
    pseudonymisation asked for."""

    layout: DumpLayout
    pseudonymiser: Pseudonymiser
    pseudonymise_job_names: bool
    default_cluster: str
    time_formats: dict[str, TimeFormat]


# --- a block's fields → job rows ---------------------------------------------------------------


class _Rows:
    """A block's raw columns, and the first reason each row is rejected for.

    Checks run in a fixed order and a row keeps the reason of the first that fails it, so the
    order of the ``flag`` calls in ``_parse_fields`` is part of what the quarantine says.
    """

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.n = table.num_rows
        self._empty = pa.nulls(self.n, pa.binary())
        self.reason = pa.nulls(self.n, pa.string())

    def raw(self, name: str) -> pa.Array:
        """The column as read (all null when the dump lacks the field)."""
        if name in self.table.column_names and self.n:
            return self.table.column(name).chunk(0)
        return self._empty

    def flag(self, bad: pa.Array, why: str) -> None:
        bad = pc.fill_null(bad, False)
        if pc.any(bad).as_py():
            self.reason = pc.if_else(pc.and_(pc.is_null(self.reason), bad), why, self.reason)

    def struct_of(
        self, name: str, fn: Callable[[Any], tuple[Any, ...]], t: pa.StructType, why: str
    ) -> pa.StructArray:
        """``fn`` over the field's distinct values; its ``bad`` rows flagged with ``why``."""
        parsed = map_distinct(self.raw(name), fn, t)
        self.flag(pc.struct_field(parsed, "bad"), why)
        return parsed

    def text(self, name: str) -> pa.Array:
        """The field as dictionary-encoded text, "" where absent."""
        return as_dictionary(pc.fill_null(as_utf8(self.raw(name))[0], ""))


def _blank_to_null(a: pa.Array) -> pa.Array:
    return pc.if_else(pc.equal(a, ""), pa.scalar(None, a.type), a)


def _where_given(part: pa.Array, value: pa.Array) -> pa.Array:
    """``value`` where the job id's ``part`` is given, else null. Most blocks have no het
    job and many no array task: their column is then all null without a copy of ``value``
    (if_else keeps the text of the rows it nulls: at 5 M rows 53 MB a column, against 19)."""
    given = pc.not_equal(part, "")
    if not pc.any(given).as_py():
        return pa.nulls(len(value), value.type)
    return pc.if_else(given, value, pa.scalar(None, value.type))


def _identity(rows: _Rows, id_field: str) -> dict[str, pa.Array]:
    """The job, array, het and step columns, by one JobID grammar for allocations, steps,
    array tasks and het components."""
    job_id, bad_utf8 = as_utf8(rows.raw(id_field))
    rows.flag(bad_utf8, f"{id_field} is not valid UTF-8")
    parts = pc.extract_regex(pc.fill_null(job_id, ""), JOB_ID_RE)
    rows.flag(pc.is_null(parts), f"{id_field} does not match 123, 123_4, 123+0 or 123.step")
    parts = pc.fill_null(
        parts, pa.scalar({"base": "", "task": "", "het": "", "step": ""}, parts.type)
    )
    base, task, het, step = (pc.struct_field(parts, f) for f in ("base", "task", "het", "step"))
    job_id_raw_col, _ = as_utf8(rows.raw("JobIDRaw"))
    raw_base = pc.fill_null(job_id_raw_col, "")
    if pc.any(pc.match_substring(raw_base, ".")).as_py():  # steps: their raw id less the step
        raw_base = pc.replace_substring_regex(raw_base, r"\..*$", "")
    return {
        "job_id": job_id,
        "job_id_raw": pc.if_else(pc.equal(raw_base, ""), base, raw_base),
        "array_job_id": _where_given(task, base),
        "array_task_id": _blank_to_null(task),
        "het_job_id": _where_given(het, base),
        "het_offset": pc.cast(_blank_to_null(het), pa.int64()),
        "step": map_distinct(_blank_to_null(step), _untruncated_step, pa.string()),
        "is_allocation": pc.equal(step, ""),
    }


# The named steps sacct prints; a narrow column truncates them with '+' (``ext+``).
_NAMED_STEPS = ("batch", "extern", "interactive")


def _untruncated_step(step: str | None) -> str | None:
    """A named step truncated by a narrow column (``bat+``) as its name; others as given."""
    if step and step.endswith("+"):
        named = [s for s in _NAMED_STEPS if s.startswith(step[:-1])]
        if len(named) == 1:
            return named[0]
    return step


def _times(rows: _Rows, formats: dict[str, TimeFormat]) -> dict[str, pa.Array]:
    """Submit, Start and End as UTC timestamps, each read in its detected format; unreadable
    or implausible ones flagged."""
    times = {}
    for name in TIME_FIELDS:
        fmt = formats.get(name, STANDARD)
        times[name], bad = parse_times(rows.raw(name), fmt)
        rows.flag(bad, f"{name} is not a timestamp in the dump's format ({fmt.label})")
        rows.flag(
            implausible(times[name]),
            f"{name} is outside any plausible accounting history "
            f"({PLAUSIBLE_FROM.year}-{PLAUSIBLE_UNTIL.year - 1})",
        )
    return times


def _counts(rows: _Rows) -> dict[str, pa.Array]:
    """ElapsedRaw, NNodes and NCPUS as integers; negative or non-integer ones flagged."""
    counts = {}
    for name in ("ElapsedRaw", "NNodes", "NCPUS"):
        counts[name], bad, negative = parse_integers(rows.raw(name))
        rows.flag(negative, f"{name} is negative")
        rows.flag(bad, f"{name} is not an integer")
    return counts


def _elapsed(rows: _Rows, elapsed_raw: pa.Array) -> pa.Array:
    """ElapsedRaw when given, else Elapsed ([D-]HH:MM:SS), parsed only where needed; 0 when
    neither is."""
    elapsed = elapsed_raw
    if pc.any(pc.is_null(elapsed)).as_py() and "Elapsed" in rows.table.column_names:
        el = map_distinct(
            rows.raw("Elapsed"), lambda v: parse_duration_s(text_of(v) or None), pa.int64()
        )
        el_text = pc.fill_null(as_utf8(rows.raw("Elapsed"))[0], "")
        rows.flag(pc.and_(pc.is_null(elapsed), pc.starts_with(el_text, "-")), "Elapsed is negative")
        rows.flag(
            pc.and_(pc.and_(pc.is_null(elapsed), pc.is_null(el)), pc.not_equal(el_text, "")),
            "Elapsed is not [D-]HH:MM:SS",
        )
        elapsed = pc.coalesce(elapsed, el)
    return pc.coalesce(elapsed, 0)


def _parse_fields(
    table: pa.Table, lines: pa.Array, reading: _Reading
) -> tuple[pa.Table, list[Quarantined], dict[str, int]]:
    """Every field of a block's rows → (job rows, quarantined rows, GPU sources counted)."""
    layout, pseudonymiser = reading.layout, reading.pseudonymiser
    pseudonymise_job_names = reading.pseudonymise_job_names
    rows = _Rows(table)
    # In the order of the reasons a row is quarantined for (see _Rows).
    identity = _identity(rows, layout.job_id_field)
    st = _states(rows, "State" in layout.names)
    ex = rows.struct_of("ExitCode", _parse_exit, EXIT_TYPE, "ExitCode is not N:M, 0 ≤ N, M ≤ 255")
    tl = rows.struct_of(
        "Timelimit",
        _parse_timelimit,
        TIMELIMIT_TYPE,
        "Timelimit is not [D-]HH:MM:SS, UNLIMITED or Partition_Limit",
    )
    tres = rows.struct_of(
        "AllocTRES", _parse_tres, TRES_TYPE, "AllocTRES is not name=value[,name=value…]"
    )
    gpus, gpu_given = _gpu_counts(layout, tres, rows)
    times = _times(rows, reading.time_formats)
    counts = _counts(rows)
    elapsed = _elapsed(rows, counts["ElapsedRaw"])
    job_name, bad_utf8 = as_utf8(rows.raw("JobName"))
    if not pseudonymise_job_names:
        rows.flag(bad_utf8, "JobName is not valid UTF-8")

    cluster = rows.text("Cluster").dictionary_decode()
    jobs = pa.table(
        {
            "cluster": as_dictionary(
                pc.if_else(pc.equal(cluster, ""), reading.default_cluster, cluster)
            ),
            **identity,
            "partition": rows.text("Partition"),
            "user": pseudonymiser.column("user", rows.raw("User")),
            "account": pseudonymiser.column("account", rows.raw("Account")),
            "job_name": (
                pseudonymiser.column("name", rows.raw("JobName"))
                if pseudonymise_job_names
                else as_dictionary(pc.fill_null(job_name, ""))
            ),
            "state": as_dictionary(pc.struct_field(st, "state")),
            "state_raw": rows.text("State"),
            "exit_code": pc.struct_field(ex, "code"),
            "exit_signal": pc.struct_field(ex, "signal"),
            "submit": times["Submit"],
            "start": times["Start"],
            "end": times["End"],
            "elapsed_s": elapsed,
            "timelimit_s": pc.struct_field(tl, "s"),
            "timelimit_raw": rows.text("Timelimit"),
            "nnodes": pc.coalesce(counts["NNodes"], pc.struct_field(tres, "nodes"), 0),
            "ncpus": pc.coalesce(counts["NCPUS"], pc.struct_field(tres, "cpus"), 0),
            "gpus": gpus,
            "mem_bytes": pc.struct_field(tres, "mem"),
            "node_list": rows.text("NodeList"),
            "source_line": lines,
        }
    )
    bad = pc.is_valid(rows.reason)
    parsed_allocations = pc.and_(jobs.column("is_allocation"), pc.invert(bad))
    gpu_sources = _count_gpu_sources(parsed_allocations, gpu_given)
    if not pc.any(bad).as_py():
        return jobs, [], gpu_sources
    quarantine = quarantine_rows(
        table, lines, rows.reason, bad, layout, pseudonymiser, pseudonymise_job_names
    )
    return jobs.filter(pc.invert(bad)), quarantine, gpu_sources


def _states(rows: _Rows, given: bool) -> pa.StructArray:
    """Each row's state; a dump without State reads UNKNOWN for every row, flagging none
    (its measures that need states are not computed: dump_layout.MEASURE_NEEDS)."""
    if not given:
        unknown = {"state": UNKNOWN_STATE, "bad": False}
        return pa.repeat(pa.scalar(unknown, STATE_TYPE), rows.n)
    return rows.struct_of(
        "State", _parse_state, STATE_TYPE, "State is empty or not a state name (A-Z, 0-9, _)"
    )


def _gpu_counts(
    layout: DumpLayout, alloc_tres: pa.StructArray, rows: _Rows
) -> tuple[pa.Array, list[tuple[str, pa.Array]]]:
    """Each row's GPUs from the first of GPU_SOURCES the dump has and the row gives, and
    (source, given mask) per source the dump has, in that order."""
    gpus: pa.Array | None = None
    given: list[tuple[str, pa.Array]] = []
    for source in GPU_SOURCES:
        if source not in layout.names:
            continue
        if source == "AllocTRES":
            parsed = alloc_tres
        elif source == "ReqTRES":
            parsed = rows.struct_of(
                source, _parse_tres, TRES_TYPE, f"{source} is not name=value[,…]"
            )
        else:
            parsed = rows.struct_of(
                source, _parse_gres, GRES_TYPE, f"{source} is not name[:type]:N[,…]"
            )
        mask = pc.fill_null(pc.struct_field(parsed, "given"), False)
        count = pc.if_else(mask, pc.struct_field(parsed, "gpus"), pa.scalar(None, pa.int64()))
        gpus = count if gpus is None else pc.coalesce(gpus, count)
        given.append((source, mask))
    n = len(alloc_tres)
    if gpus is None:
        return pa.array(np.zeros(n, dtype=np.int64)), given
    return pc.fill_null(gpus, 0), given


def _count_gpu_sources(rows: pa.Array, given: list[tuple[str, pa.Array]]) -> dict[str, int]:
    """How many of ``rows`` (a mask) took their GPU count from each source, "none" for rows
    that no source gave."""
    counts: dict[str, int] = {}
    remaining = rows
    for source, mask in given:
        counts[source] = pc.sum(pc.and_(remaining, mask)).as_py() or 0
        remaining = pc.and_(remaining, pc.invert(mask))
    counts["none"] = pc.sum(remaining).as_py() or 0
    return {k: v for k, v in counts.items() if v}
