"""Reading a site's CSV export of samples: its header, then every row parsed or quarantined.

The file is read in blocks by pyarrow (never a Python object per row): good rows are kept as
four columns (time, value, entity code, line: 28 bytes a row), bad rows by their physical line
number with the reason (the first failing check names it). The rules the checks apply are
those of tasks/window/sampling/importer.py, which sorts, de-duplicates and writes the rows. A
value spanning lines (a quoted newline) is not supported: its pieces are bad rows.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from tasks.data.errors import CkptPocError

READ_BLOCK = 4 << 20  # bytes pyarrow parses at a time
RAW_MAX = 1000  # characters of a quarantined line kept in quarantine.raw
_SHOWN = 60  # characters of a bad value quoted in a reason
# Epoch seconds of 2000-01-01 and 2100-01-01 (tasks.baseline.accounting's plausible dates too): an
# export in epoch milliseconds lands far outside and is quarantined, not read as year 55000.
PLAUSIBLE_S = (946_684_800.0, 4_102_444_800.0)

_NUMBER = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"
_NON_FINITE = r"(?i)^[+-]?(nan|inf|infinity)$"
_ISO = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?)?\s*(Z|z|[+-]\d{2}(:?\d{2})?)?$"
_ZONE = r"(Z|z|[+-]\d{2}(:?\d{2})?)$"


class SampleImportError(CkptPocError):
    """An export that cannot be imported at all (single bad rows are quarantined)."""


@dataclass
class CsvHeader:
    names: list[str]  # unique names for pyarrow (a repeated unused column gets a suffix)
    delimiter: str


@dataclass
class ExportRead:
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

    def quarantine(self, lines: np.ndarray, reasons: list[str]) -> None:
        """Add rows found bad after the read (a repeat, a lone sample), with their reasons."""
        if len(lines):
            self.bad_lines.append(lines.astype(np.int64))
            self.bad_reasons.append(pa.array(reasons, pa.string()))

    def take_good_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(times, values, codes, lines) of the good rows, each one array; the blocks are let
        go, so only the concatenated copies stay in memory."""
        times = np.concatenate(self.times) if self.times else np.zeros(0, np.int64)
        values = np.concatenate(self.values) if self.values else np.zeros(0)
        codes = np.concatenate(self.codes) if self.codes else np.zeros(0, np.int32)
        lines = np.concatenate(self.lines) if self.lines else np.zeros(0, np.int64)
        self.times = self.values = self.codes = self.lines = []
        return times, values, codes, lines

    def bad_rows(self, path: Path) -> tuple[np.ndarray, pa.Array, list[str]]:
        """(lines, reasons, raw texts) of every bad row, in line order; the raw texts not kept
        while reading are read back from ``path`` in one pass."""
        lines = np.concatenate(self.bad_lines)
        reasons = pa.concat_arrays([r.cast(pa.string()) for r in self.bad_reasons])
        order = np.argsort(lines, kind="stable")
        lines, reasons = lines[order], reasons.take(pa.array(order))
        unknown = np.array(sorted(set(lines.tolist()) - set(self.bad_raw)), dtype=np.int64)
        raw = {**self.bad_raw, **_raw_lines(path, unknown)}
        return lines, reasons, [raw.get(int(line), "") for line in lines]


# --- the header --------------------------------------------------------------------------------


def read_header(path: Path) -> CsvHeader:
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
    return CsvHeader(names, delimiter)


def check_columns(path: Path, header: CsvHeader, wanted: dict[str, str]) -> None:
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


def _stream(
    path: Path, header: CsvHeader, columns: list[str], read: ExportRead
) -> Iterator[pa.Table]:
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


def _parse_block(table: pa.Table, cols: dict[str, str], read: ExportRead) -> None:
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


def read_export(path: Path, header: CsvHeader, cols: dict[str, str]) -> ExportRead:
    """One pass over the file: every row parsed, good rows kept as columns, bad ones by line.

    ``cols`` maps the roles time, value and entity to the header's column names.
    """
    read = ExportRead()
    for table in _stream(path, header, list(cols.values()), read):
        _parse_block(table, cols, read)
    return read


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
