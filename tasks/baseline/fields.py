"""Field parsing: one sacct value (or one column of them) → what it means.

Scalar parsers take one value as sacct wrote it (str, or bytes from the raw reader) and return
its meaning with a ``bad`` flag, as a named tuple whose fields are those of the Arrow struct
type beside it, in its order (Arrow builds the struct column from the tuples); the column
helpers parse a whole Arrow column at once and return a mask of the values that are damage,
not data.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from tasks.data.slurm_states import DOCUMENTED_STATES, UNKNOWN_STATE

# Accounting dates outside these bounds are damage, not history (Slurm dates from 2002).
# Fixed, not relative to today, so a dump parses the same whenever it is read.
PLAUSIBLE_FROM = dt.datetime(2000, 1, 1)
PLAUSIBLE_UNTIL = dt.datetime(2100, 1, 1)

# One JobID grammar for allocations, steps, array tasks (and pending ranges) and het jobs.
JOB_ID_RE = (
    r"^(?P<base>\d+)(?:_(?P<task>\d+|\[[^\]]*\]))?(?:\+(?P<het>\d+))?"
    r"(?:\.(?P<step>[A-Za-z0-9_-]+\+?))?$"  # a narrow column ends a step with '+': 123.ext+
)
_DURATION_RE = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?$")
_MEM_UNITS = {"": 1 << 20, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
ABSENT = ["", "Unknown", "None"]  # sacct's spellings of "no value"


# --- one value -------------------------------------------------------------------------------


def text_of(value: str | bytes | None) -> str:
    """A value as either reader gives it (str, bytes or None) as text; None is ""."""
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def parse_duration_s(text: str | None) -> int | None:
    """``[D-]HH:MM:SS``, ``MM:SS`` (with optional fraction) → seconds; None when not one."""
    if not text:
        return None
    m = _DURATION_RE.match(text)
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    if m.group(2) is None:  # MM:SS
        hours, minutes, seconds = 0, int(m.group(3)), int(m.group(4))
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


TIMELIMIT_TYPE = pa.struct([("s", pa.int64()), ("bad", pa.bool_())])


class TimeLimit(NamedTuple):
    s: int | None  # None: no limit
    bad: bool


def parse_timelimit(raw: str | bytes | None) -> TimeLimit:
    text = text_of(raw)
    if text in ("", "UNLIMITED", "Partition_Limit", "INVALID", "NONE"):
        return TimeLimit(None, False)
    if text.isdigit():  # minutes, as sacct --json and some dumps give it
        return TimeLimit(int(text) * 60, False)
    seconds = parse_duration_s(text)
    return TimeLimit(seconds, seconds is None)


TRES_TYPE = pa.struct(
    [
        ("gpus", pa.int64()),
        ("nodes", pa.int64()),
        ("cpus", pa.int64()),
        ("mem", pa.int64()),
        ("given", pa.bool_()),
        ("bad", pa.bool_()),
    ]
)
# sacct's spellings of "nothing here" in a TRES or GRES field.
_NO_RESOURCES = ("", "(null)", "N/A")


class Tres(NamedTuple):
    gpus: int
    nodes: int | None
    cpus: int | None
    mem: int | None  # bytes
    given: bool
    bad: bool


def parse_tres(raw: bytes | str | None) -> Tres:
    """AllocTRES (or ReqTRES) → gpus, nodes, cpus, mem bytes, and whether it was given.

    GPUs: the untyped ``gres/gpu=N`` when present, else the sum of typed ``gres/gpu:T=N``
    (Slurm lists both together; adding all of them double-counts).
    """
    text = text_of(raw)
    if text in _NO_RESOURCES:
        return Tres(0, None, None, None, False, False)
    nodes: int | None = None
    cpus: int | None = None
    mem: int | None = None
    bad = False
    untyped, typed = None, 0
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep:
            bad = True
            continue
        if name == "mem":
            m = re.match(r"^(\d+(?:\.\d+)?)([KMGTP]?)[nc]?$", value)
            if m:
                mem = int(float(m.group(1)) * _MEM_UNITS[m.group(2)])
            else:
                bad = True
            continue
        if not value.isdigit():
            bad = True
            continue
        count = int(value)
        if name == "gres/gpu":
            untyped = count
        elif name.startswith("gres/gpu:"):
            typed += count
        elif name == "node":
            nodes = count
        elif name == "cpu":
            cpus = count
    return Tres(untyped if untyped is not None else typed, nodes, cpus, mem, True, bad)


GRES_TYPE = pa.struct([("gpus", pa.int64()), ("given", pa.bool_()), ("bad", pa.bool_())])
_GRES_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


class Gres(NamedTuple):
    gpus: int
    given: bool
    bad: bool


def parse_gres(raw: bytes | str | None) -> Gres:
    """AllocGRES / ReqGRES of Slurm before 17.11 → the job's GPUs, and whether it was given.

    Entries are ``name[:type][:count]`` (``gpu:2``, ``gpu:tesla:2``, ``gpu`` for one), with an
    optional ``(IDX:0-1)`` suffix, comma-separated. AllocGRES holds the job's total (Slurm
    multiplied the per-node count by the node count when it wrote it). As with TRES, the
    untyped entry wins over typed ones when both are listed.
    """
    text = text_of(raw).strip()
    if text in _NO_RESOURCES:
        return Gres(0, False, False)
    bad = False
    untyped, typed = None, 0
    for item in re.sub(r"\([^)]*\)", "", text).split(","):  # IDX lists hold commas too
        parts = item.strip().split(":")
        if parts[0].startswith("gres/"):
            parts[0] = parts[0][len("gres/") :]
        elif parts[0] == "gres" and len(parts) > 1:
            parts = parts[1:]
        name, rest = parts[0], parts[1:]
        if not _GRES_NAME_RE.match(name) or len(rest) > 2:
            bad = True
            continue
        if name != "gpu":
            continue
        if not rest:
            untyped = 1
        elif len(rest) == 1 and rest[0].isdigit():
            untyped = int(rest[0])
        elif len(rest) == 1:
            typed += 1
        elif rest[1].isdigit():
            typed += int(rest[1])
        else:
            bad = True
    return Gres(untyped if untyped is not None else typed, True, bad)


STATE_TYPE = pa.struct([("state", pa.string()), ("bad", pa.bool_())])
KNOWN_STATES = frozenset(DOCUMENTED_STATES)
_STATE_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")


def normalise_state(raw: str | bytes | None) -> str:
    """The state's name: ``CANCELLED by 1234`` → CANCELLED, ``RUNNING+`` → RUNNING."""
    return text_of(raw).strip().split(" ", 1)[0].rstrip("+")


class ParsedState(NamedTuple):
    state: str
    bad: bool


def parse_state(raw: str | bytes | None) -> ParsedState:
    state = normalise_state(raw)
    if state in KNOWN_STATES:
        return ParsedState(state, False)
    # Not documented by sacct but shaped like a state: kept, as UNKNOWN (see UNKNOWN_STATE).
    return ParsedState(UNKNOWN_STATE, not _STATE_NAME_RE.match(state))


EXIT_TYPE = pa.struct([("code", pa.int64()), ("signal", pa.int64()), ("bad", pa.bool_())])


class ExitCode(NamedTuple):
    code: int | None
    signal: int | None
    bad: bool


def parse_exit(raw: str | bytes | None) -> ExitCode:
    text = text_of(raw)
    if not text:
        return ExitCode(None, None, False)
    code, sep, signal = text.partition(":")
    if code.isdigit() and (not sep or signal.isdigit()):
        c, s = int(code), int(signal or 0)
        return ExitCode(c, s, c > 255 or s > 255)
    return ExitCode(None, None, True)


# --- whole columns (vectorised) --------------------------------------------------------------


def map_distinct(values: pa.Array, fn: Callable[[Any], Any], out_type: pa.DataType) -> pa.Array:
    """Apply ``fn`` once per distinct value and spread the results back over the rows."""
    encoded = values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
    mapped = pa.array([fn(v) for v in encoded.dictionary.to_pylist()], type=out_type)
    return pc.take(mapped, encoded.indices)


def as_utf8(col: pa.Array) -> tuple[pa.Array, pa.Array]:
    """As strings (dictionary columns stay encoded); invalid UTF-8 becomes null and flagged."""
    if pa.types.is_string(col.type) or pa.types.is_dictionary(col.type):
        return col, pa.repeat(pa.scalar(False), len(col))
    try:
        return pc.cast(col, pa.string()), pa.repeat(pa.scalar(False), len(col))
    except pa.ArrowInvalid:
        flags, texts = [], []
        for value in col.to_pylist():
            try:
                texts.append(None if value is None else value.decode())
                flags.append(False)
            except UnicodeDecodeError:
                texts.append(None)
                flags.append(True)
        return pa.array(texts, pa.string()), pa.array(flags, pa.bool_())


def as_dictionary(col: pa.Array) -> pa.Array:
    """Low-cardinality output columns are dictionary-encoded strings in every block."""
    if pa.types.is_dictionary(col.type):
        return col
    return pc.dictionary_encode(pc.cast(col, pa.string()))


def parse_integers(col: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(int64 or null, not-an-integer mask, negative mask) for a count column given as
    integers or raw text."""
    if pa.types.is_integer(col.type):
        return col, pa.repeat(pa.scalar(False), len(col)), pc.less(col, 0)
    text = pc.fill_null(as_utf8(col)[0], "")
    ok = pc.match_substring_regex(text, r"^-?\d{1,15}$")
    values = pc.cast(pc.if_else(ok, text, pa.scalar(None, pa.string())), pa.int64())
    return values, pc.and_(pc.invert(ok), pc.not_equal(text, "")), pc.less(values, 0)


_PLAUSIBLE = (
    pa.scalar(PLAUSIBLE_FROM, pa.timestamp("us", tz="UTC")),
    pa.scalar(PLAUSIBLE_UNTIL, pa.timestamp("us", tz="UTC")),
)


def implausible(times: pa.Array) -> pa.Array:
    """Timestamps outside [PLAUSIBLE_FROM, PLAUSIBLE_UNTIL) (null where the time is absent)."""
    return pc.or_(pc.less(times, _PLAUSIBLE[0]), pc.greater_equal(times, _PLAUSIBLE[1]))
