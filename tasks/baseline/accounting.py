"""Slurm accounting (sacct) → parsed, pseudonymised job rows plus a quarantine.

Inputs: live ``sacct`` (UTC, ``-a -D -P --noheader --format=SACCT_FIELDS``, day-sized chunks),
a ``sacct -P``/``--parsable`` dump with or without a header, or ``sacct --json``.

The parser works on newline-aligned byte blocks with pyarrow's multithreaded CSV reader (the
delimiter as separator, no quoting), then parses every field with vectorised Arrow compute;
fields with few distinct values (state, AllocTRES, time limit, identities) are parsed once per
distinct value. A row that cannot be parsed is never dropped: it goes to the quarantine with a
reason and its line number, so ``rows_read == parsed + quarantined`` always holds.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import io
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from tasks.data.errors import AccountingError, SecretError
from tasks.data.slurm_states import DOCUMENTED_STATES, UNKNOWN_STATE

# The --format ckpt-poc asks sacct for, and the column order of a header-less dump.
SACCT_FIELDS = (
    "JobID",
    "JobIDRaw",
    "Cluster",
    "Partition",
    "User",
    "Account",
    "JobName",
    "State",
    "ExitCode",
    "Submit",
    "Start",
    "End",
    "Elapsed",
    "ElapsedRaw",
    "Timelimit",
    "NNodes",
    "NCPUS",
    "AllocTRES",
    "NodeList",
)
# Older and requested forms of the GPU count, read when a dump has them (see GPU_SOURCES).
OLDER_GPU_FIELDS = ("AllocGRES", "ReqTRES", "ReqGRES")
# The fields ckpt-poc reads from a dump; any other field a site dumps is carried, not read.
KNOWN_FIELDS = (*SACCT_FIELDS, *OLDER_GPU_FIELDS)
# What a dump must have at all: state counts need only the job id and the state.
JOB_ID_FIELDS = ("JobID", "JobIDRaw")
# What each measure needs besides that, as alternatives per need; a measure whose needs a
# dump lacks is reported as not computed (``not_computed``), never as zero.
_ELAPSED = ("ElapsedRaw", "Elapsed")
_GPUS_ALLOCATED = ("AllocTRES", "AllocGRES")
MEASURE_NEEDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "node_hours_by_state": (_ELAPSED, ("NNodes", "AllocTRES")),
    "gpu_hours_by_state": (_ELAPSED, _GPUS_ALLOCATED),
    "exposed_gpu_hours": (_ELAPSED, _GPUS_ALLOCATED),
    "timeout_gpu_hours": (_ELAPSED, _GPUS_ALLOCATED),
    "chains": (("User",), ("Account",), ("JobName",), ("Submit",), ("End",)),
    "candidates": (("Account",), ("JobName",)),
}
# Where a row's GPU count comes from, in this order: what was allocated (AllocTRES, or the
# AllocGRES of Slurm before 17.11), else, for a row where nothing was allocated yet, what
# was requested. Reports say which sources the counts came from.
GPU_SOURCES = ("AllocTRES", "AllocGRES", "ReqTRES", "ReqGRES")
GPU_SOURCE_LABELS = {
    "AllocTRES": "allocated (AllocTRES)",
    "AllocGRES": "allocated (AllocGRES, older Slurm)",
    "ReqTRES": "requested (ReqTRES: nothing allocated yet)",
    "ReqGRES": "requested (ReqGRES, older Slurm: nothing allocated yet)",
    "none": "no GPU field given",
}
# Accounting dates outside these bounds are damage, not history (Slurm dates from 2002).
# Fixed, not relative to today, so a dump parses the same whenever it is read.
PLAUSIBLE_FROM = dt.datetime(2000, 1, 1)
PLAUSIBLE_UNTIL = dt.datetime(2100, 1, 1)

BLOCK_BYTES = 32 << 20
KEY_ENV = "CKPT_POC_PSEUDONYM_KEY"

# One JobID grammar for allocations, steps, array tasks (and pending ranges) and het jobs.
JOB_ID_RE = (
    r"^(?P<base>\d+)(?:_(?P<task>\d+|\[[^\]]*\]))?(?:\+(?P<het>\d+))?"
    r"(?:\.(?P<step>[A-Za-z0-9_-]+))?$"
)
_DURATION_RE = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?$")
_MEM_UNITS = {"": 1 << 20, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


@dataclass
class Quarantined:
    source_line: int
    reason: str
    raw: str


@dataclass
class ParsedBlock:
    jobs: pa.Table  # canonical columns (see JOB_COLUMNS), no run stamp yet
    quarantine: list[Quarantined] = field(default_factory=list)
    rows_read: int = 0
    fields: tuple[str, ...] = ()  # the known fields the dump has (see not_computed)
    # Parsed allocation rows per source of their GPU count (GPU_SOURCES, or "none").
    gpu_sources: dict[str, int] = field(default_factory=dict)


def not_computed(fields: Sequence[str]) -> dict[str, str]:
    """Measure → "the dump lacks X, Y" for each measure the dump's fields cannot give."""
    have = set(fields)
    out = {}
    for measure, needs in MEASURE_NEEDS.items():
        lacking = [" or ".join(alts) for alts in needs if not have.intersection(alts)]
        if lacking:
            out[measure] = f"the dump lacks {', '.join(lacking)}"
    return out


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


# --- pseudonymisation ------------------------------------------------------------------------


class Pseudonymiser:
    """Keyed HMAC-SHA256 of identities; the key never leaves this object (no repr, no log)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise SecretError("the pseudonymisation key must be at least 16 bytes")
        self._key = key

    def __repr__(self) -> str:
        return "Pseudonymiser(<key hidden>)"

    def token(self, prefix: str, value: str | bytes) -> str:
        data = value.encode() if isinstance(value, str) else value
        digest = hmac.new(self._key, prefix.encode() + b"\0" + data, hashlib.sha256)
        return f"{prefix}-{digest.hexdigest()[:16]}"

    def column(self, prefix: str, values: pa.Array) -> pa.Array:
        """Pseudonymise a column, hashing each distinct value once (dictionary-encoded out)."""
        encoded = values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
        distinct = encoded.dictionary.to_pylist()
        tokens = [self.token(prefix, v or b"") for v in distinct]
        indices = encoded.indices
        if indices.null_count:  # a missing identity is pseudonymised as the empty one
            tokens.append(self.token(prefix, b""))
            indices = pc.fill_null(indices, len(tokens) - 1)
        return pa.DictionaryArray.from_arrays(indices, pa.array(tokens, pa.string()))


def load_pseudonym_key(secret_block: str | None = None) -> tuple[bytes, str]:
    """The HMAC key from the environment, else from a Prefect Secret; (key, where it came from)."""
    value = os.environ.get(KEY_ENV)
    if value:
        return value.encode(), f"environment variable {KEY_ENV}"
    if secret_block:
        try:
            from prefect.blocks.system import Secret

            secret = Secret.load(secret_block).get()
        except Exception as exc:  # the block is absent or the API is unreachable
            raise SecretError(
                f"cannot load Prefect Secret block {secret_block!r} for the pseudonymisation "
                f"key ({type(exc).__name__}); set {KEY_ENV} instead"
            ) from None
        return str(secret).encode(), f"Prefect Secret {secret_block!r}"
    raise SecretError(
        f"no pseudonymisation key: set {KEY_ENV} or name a Prefect Secret block in "
        "baseline.pseudonym_key_secret"
    )


# --- vectorised helpers ----------------------------------------------------------------------


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _map_distinct(values: pa.Array, fn: Callable[[Any], Any], out_type: pa.DataType) -> pa.Array:
    """Apply ``fn`` once per distinct value and spread the results back over the rows."""
    encoded = values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
    mapped = pa.array([fn(v) for v in encoded.dictionary.to_pylist()], type=out_type)
    return pc.take(mapped, encoded.indices)


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


_TIMELIMIT_TYPE = pa.struct([("s", pa.int64()), ("bad", pa.bool_())])


def _parse_timelimit(raw: str | bytes | None) -> dict[str, Any]:
    text = _text(raw)
    if text in ("", "UNLIMITED", "Partition_Limit", "INVALID", "NONE"):
        return {"s": None, "bad": False}
    if text.isdigit():  # minutes, as sacct --json and some dumps give it
        return {"s": int(text) * 60, "bad": False}
    seconds = parse_duration_s(text)
    return {"s": seconds, "bad": seconds is None}


_TRES_TYPE = pa.struct(
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


def parse_tres(raw: bytes | str | None) -> dict[str, Any]:
    """AllocTRES (or ReqTRES) → gpus, nodes, cpus, mem bytes, and whether it was given.

    GPUs: the untyped ``gres/gpu=N`` when present, else the sum of typed ``gres/gpu:T=N``
    (Slurm lists both together; adding all of them double-counts).
    """
    text = _text(raw)
    out: dict[str, Any] = {
        "gpus": 0,
        "nodes": None,
        "cpus": None,
        "mem": None,
        "given": text not in _NO_RESOURCES,
        "bad": False,
    }
    if not out["given"]:
        return out
    untyped, typed = None, 0
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep:
            out["bad"] = True
            continue
        if name == "mem":
            m = re.match(r"^(\d+(?:\.\d+)?)([KMGTP]?)[nc]?$", value)
            if m:
                out["mem"] = int(float(m.group(1)) * _MEM_UNITS[m.group(2)])
            else:
                out["bad"] = True
            continue
        if not value.isdigit():
            out["bad"] = True
            continue
        count = int(value)
        if name == "gres/gpu":
            untyped = count
        elif name.startswith("gres/gpu:"):
            typed += count
        elif name == "node":
            out["nodes"] = count
        elif name == "cpu":
            out["cpus"] = count
    out["gpus"] = untyped if untyped is not None else typed
    return out


_GRES_TYPE = pa.struct([("gpus", pa.int64()), ("given", pa.bool_()), ("bad", pa.bool_())])
_GRES_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


def parse_gres(raw: bytes | str | None) -> dict[str, Any]:
    """AllocGRES / ReqGRES of Slurm before 17.11 → the job's GPUs, and whether it was given.

    Entries are ``name[:type][:count]`` (``gpu:2``, ``gpu:tesla:2``, ``gpu`` for one), with an
    optional ``(IDX:0-1)`` suffix, comma-separated. AllocGRES holds the job's total (Slurm
    multiplied the per-node count by the node count when it wrote it). As with TRES, the
    untyped entry wins over typed ones when both are listed.
    """
    text = _text(raw).strip()
    out: dict[str, Any] = {"gpus": 0, "given": text not in _NO_RESOURCES, "bad": False}
    if not out["given"]:
        return out
    untyped, typed = None, 0
    for item in re.sub(r"\([^)]*\)", "", text).split(","):  # IDX lists hold commas too
        parts = item.strip().split(":")
        if parts[0].startswith("gres/"):
            parts[0] = parts[0][len("gres/") :]
        elif parts[0] == "gres" and len(parts) > 1:
            parts = parts[1:]
        name, rest = parts[0], parts[1:]
        if not _GRES_NAME_RE.match(name) or len(rest) > 2:
            out["bad"] = True
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
            out["bad"] = True
    out["gpus"] = untyped if untyped is not None else typed
    return out


_STATE_TYPE = pa.struct([("state", pa.string()), ("bad", pa.bool_())])
_KNOWN_STATES = frozenset(DOCUMENTED_STATES)
_STATE_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")


def normalise_state(raw: str | bytes | None) -> str:
    """The state's name: ``CANCELLED by 1234`` → CANCELLED, ``RUNNING+`` → RUNNING."""
    return _text(raw).strip().split(" ", 1)[0].rstrip("+")


def _parse_state(raw: str | bytes | None) -> dict[str, Any]:
    state = normalise_state(raw)
    if state in _KNOWN_STATES:
        return {"state": state, "bad": False}
    # Not documented by sacct but shaped like a state: kept, as UNKNOWN (see UNKNOWN_STATE).
    return {"state": UNKNOWN_STATE, "bad": not _STATE_NAME_RE.match(state)}


_EXIT_TYPE = pa.struct([("code", pa.int64()), ("signal", pa.int64()), ("bad", pa.bool_())])


def _parse_exit(raw: str | bytes | None) -> dict[str, Any]:
    text = _text(raw)
    if not text:
        return {"code": None, "signal": None, "bad": False}
    code, sep, signal = text.partition(":")
    if code.isdigit() and (not sep or signal.isdigit()):
        c, s = int(code), int(signal or 0)
        return {"code": c, "signal": s, "bad": c > 255 or s > 255}
    return {"code": None, "signal": None, "bad": True}


_INT_TYPE = pa.struct([("v", pa.int64()), ("bad", pa.bool_())])


def _parse_int(raw: str | bytes | None) -> dict[str, Any]:
    text = _text(raw)
    if not text:
        return {"v": None, "bad": False}
    return {"v": int(text), "bad": False} if text.isdigit() else {"v": None, "bad": True}


# --- block parsing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DumpLayout:
    """How a dump's fields map onto ours: its header's column order, or --format's."""

    names: tuple[str, ...]  # canonical field name per input column ("" for unknown ones)
    delimiter: bytes
    trailing_delimiter: bool
    has_header: bool

    @property
    def n_fields(self) -> int:
        return len(self.names) + (1 if self.trailing_delimiter else 0)

    @property
    def fields(self) -> tuple[str, ...]:
        """The known fields this dump has."""
        return tuple(n for n in self.names if n)

    @property
    def job_id_field(self) -> str:
        """JobID, or JobIDRaw in a dump without JobID."""
        return "JobID" if "JobID" in self.names else "JobIDRaw"


_CANONICAL = {f.lower(): f for f in KNOWN_FIELDS}
_FIELD_NAME_RE = re.compile(r"^[A-Za-z]+$")  # every sacct field name is letters only
# sacct's --format item: a field name, optionally with a column width (JobID%20).
_FORMAT_ITEM_RE = re.compile(r"^([A-Za-z]+)(?:%-?\d+)?$")
# The run of non-letters after a header's first field name is the header's delimiter.
_HEADER_DELIMITER_RE = re.compile(r"^[A-Za-z]+([^A-Za-z]+)[A-Za-z]")


def parse_format(text: str) -> tuple[str, ...]:
    """sacct's ``--format`` syntax (``JobID,State%20,…``, any case) → the field names as given."""
    names = []
    for i, item in enumerate(text.split(","), 1):
        m = _FORMAT_ITEM_RE.match(item.strip())
        if not m:
            raise AccountingError(
                f"--format {text!r}: field {i} ({item.strip()!r}) is not a sacct field name "
                "(--format takes comma-separated names such as JobID,State,AllocTRES)"
            )
        names.append(m.group(1))
    return tuple(names)


def _canonical(names: Sequence[str]) -> tuple[str, ...]:
    """Our spelling of each known field, "" for the rest (a repeat counts once)."""
    out: list[str] = []
    for name in names:
        known = _CANONICAL.get(name.lower(), "")
        out.append(known if known not in out else "")
    return tuple(out)


def _require_id_and_state(names: Sequence[str], where: str, what: str) -> None:
    missing = []
    if not set(names).intersection(JOB_ID_FIELDS):
        missing.append("JobID (or JobIDRaw)")
    if "State" not in names:
        missing.append("State")
    if missing:
        raise AccountingError(
            f"{where}: {what} lacks {' and '.join(missing)}: even state counts need the job "
            f"id and the state (ckpt-poc's full set: --format={','.join(SACCT_FIELDS)})"
        )


def _looks_like_header(text: str) -> bool:
    """Field names, whatever the delimiter: no digits (every data row has a job id), and
    at least one of the names ckpt-poc reads."""
    if not text[:1].isalpha() or any(c.isdigit() for c in text):
        return False
    return any(w.lower() in _CANONICAL for w in re.findall(r"[A-Za-z]+", text))


def detect_layout(
    first_line: bytes,
    source: str,
    delimiter: bytes | None = None,
    sacct_format: str | None = None,
    line_number: int = 1,
) -> DumpLayout:
    """Header, delimiter and trailing delimiter from the first non-empty line.

    A header gives the column order and, unless ``delimiter`` is given, the delimiter (any
    string sacct's --delimiter took). A header-less dump is in SACCT_FIELDS order unless
    ``sacct_format`` (sacct's --format syntax) names its columns.
    """
    line = first_line.rstrip(b"\r\n")
    where = f"{source}:{line_number}"
    try:
        text = line.decode().lstrip("\ufeff \t")  # a byte-order mark is no field name
    except UnicodeDecodeError:
        text = ""
    if _looks_like_header(text):
        return _header_layout(text, where, delimiter, sacct_format)
    delim = delimiter or (b"^|^" if b"^|^" in line else b"|")
    fields = line.split(delim)
    given = parse_format(sacct_format) if sacct_format else SACCT_FIELDS
    # sacct -p ends every line with the delimiter too.
    trailing = len(fields) == len(given) + 1 and fields[-1] == b""
    if len(fields) - trailing != len(given):
        shown = delim.decode(errors="replace")
        if sacct_format:
            raise AccountingError(
                f"{where}: the first row has {len(fields)} fields split on {shown!r}, but "
                f"--format names {len(given)}; give the fields the dump was taken with, in "
                "its order (and its delimiter with --delimiter)"
            )
        raise AccountingError(
            f"{where}: no header line, and the first row has {len(fields)} fields split on "
            f"{shown!r}; a header-less dump is read in ckpt-poc's order "
            f"(--format={','.join(SACCT_FIELDS)}, {len(SACCT_FIELDS)} fields) unless "
            "--format FIELDS names the fields it was taken with (sacct's --format syntax: "
            "comma-separated field names), and its delimiter is '|' unless --delimiter says"
        )
    names = _canonical(given)
    _require_id_and_state(names, where, f"--format {sacct_format!r}")
    return DumpLayout(names, delim, trailing, False)


def _header_layout(
    text: str, where: str, delimiter: bytes | None, sacct_format: str | None
) -> DumpLayout:
    if delimiter:
        delim: str | None = delimiter.decode(errors="replace")
    else:
        m = _HEADER_DELIMITER_RE.match(text)
        delim = m.group(1) if m else None
    fields = [f.strip() for f in text.split(delim)] if delim else [text.strip()]
    trailing = len(fields) > 1 and fields[-1] == ""
    if trailing:
        fields = fields[:-1]
    split_on = repr(delim) if delim else "any delimiter"
    if len(fields) == 1:
        raise AccountingError(
            f"{where}: the first line looks like a header but splits into one field on "
            f"{split_on} ({text[:80]!r}); give the dump's delimiter with --delimiter"
        )
    odd = [f for f in fields if not _FIELD_NAME_RE.match(f)]
    if odd:
        raise AccountingError(
            f"{where}: the first line looks like a header but splitting it on {split_on} "
            f"gives {odd[0]!r}, which is not a sacct field name; give the dump's delimiter "
            "with --delimiter"
        )
    names = _canonical(fields)
    _require_id_and_state(names, where, "the header")
    if sacct_format and [f.lower() for f in parse_format(sacct_format)] != [
        f.lower() for f in fields
    ]:
        raise AccountingError(
            f"{where}: the header names {','.join(fields)} but --format names "
            f"{sacct_format}; the header says what the columns are: drop --format"
        )
    return DumpLayout(names, (delim or "|").encode(), trailing, True)


def _column_names(layout: DumpLayout) -> list[str]:
    names = [n or f"_unknown{i}" for i, n in enumerate(layout.names)]
    return [*names, "_trailing"] if layout.trailing_delimiter else names


# Fields that name people or their work: never written in clear from a quarantined row.
_IDENTITY_PREFIX = {"User": "user", "Account": "account", "JobName": "name"}
# Values that cannot name anyone: ids, counts, times, durations, exit codes, sacct's words.
_PLAIN_VALUE_RE = re.compile(r"^[\d\s:_.+\-\[\]%,T]*$")
_PLAIN_WORDS = frozenset(("Unknown", "None", "None assigned", "UNLIMITED", "Partition_Limit"))


def _is_plain(value: str) -> bool:
    return (
        bool(_PLAIN_VALUE_RE.match(value))
        or value in _PLAIN_WORDS
        or normalise_state(value) in _KNOWN_STATES
    )


def _misaligned_raw(line: str, layout: DumpLayout, pseudonymiser: Pseudonymiser) -> str:
    """A line with the wrong field count, fit for the quarantine: its positions cannot be
    trusted to say which field is the user or the account, so besides the fields at those
    positions, every field that is not plainly an id, count, time or state becomes a keyed
    token."""
    delim = layout.delimiter.decode(errors="replace")
    out = []
    for i, value in enumerate(line.split(delim)):
        name = layout.names[i] if i < len(layout.names) else ""
        if value and (name in ("User", "Account") or not _is_plain(value)):
            value = pseudonymiser.token(_IDENTITY_PREFIX.get(name, "field"), value)
        out.append(value)
    return delim.join(out)


def _classify_lines(
    block: bytes, layout: DumpLayout, first_line: int, pseudonymiser: Pseudonymiser
) -> tuple[list[int], list[Quarantined]]:
    """Slow path for a block with empty or malformed lines: exact line numbers for each row."""
    good: list[int] = []
    bad: list[Quarantined] = []
    delim = layout.delimiter
    for i, line in enumerate(block.split(b"\n")):
        line = line.rstrip(b"\r")
        if not line:
            continue
        n = line.count(delim) + 1
        if n == layout.n_fields:
            good.append(first_line + i)
        else:
            bad.append(
                Quarantined(
                    first_line + i,
                    f"{n} fields, expected {layout.n_fields}",
                    _misaligned_raw(line.decode("utf-8", "replace"), layout, pseudonymiser),
                )
            )
    return good, bad


_DICT = pa.dictionary(pa.int32(), pa.string())
# The typed fast path: Arrow converts while it reads. Low-cardinality fields arrive
# dictionary-encoded, so each distinct value is parsed (or hashed) once.
_FAST_TYPES: dict[str, pa.DataType] = {
    **dict.fromkeys(("JobID", "JobIDRaw", "Elapsed"), pa.string()),
    **dict.fromkeys(("ElapsedRaw", "NNodes", "NCPUS"), pa.int64()),
    **dict.fromkeys(("Submit", "Start", "End"), pa.timestamp("s")),
}
_ABSENT = ["", "Unknown", "None"]  # sacct's spellings of "no value"
_READ_BLOCK = 4 << 20  # pyarrow parses blocks of this size in parallel


def _read_block(
    data: bytes | memoryview, names: list[str], sep: str, typed: bool
) -> tuple[pa.Table, int]:
    """Read one block with pyarrow; returns the table and the number of malformed rows."""
    invalid = [0]

    def on_invalid(row: Any) -> str:
        invalid[0] += 1
        return "skip"

    if typed:
        convert = pcsv.ConvertOptions(
            column_types={n: _FAST_TYPES.get(n, _DICT) for n in names},
            null_values=_ABSENT,
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
) -> ParsedBlock:
    """Parse one newline-aligned block whose first line is ``first_line`` (1-based).

    First the typed fast path; if any value in the block does not convert, the block is
    read again as raw bytes and every field is checked row by row (vectorised), so one bad
    value costs its block the slower path, never its neighbours a quarantine.
    """
    data: bytes | memoryview = block
    if len(layout.delimiter) > 1:  # pyarrow's reader takes one byte: swap in a unit separator
        data = bytes(block).replace(layout.delimiter, b"\x1f")
    sep = "\x1f" if len(layout.delimiter) > 1 else layout.delimiter.decode()
    names = _column_names(layout)
    try:
        table, invalid = _read_block(data, names, sep, typed=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        table, invalid = _read_block(data, names, sep, typed=False)
    if newlines is None:
        newlines = bytes(block).count(b"\n")
    n_lines = newlines + (0 if block[-1:] == b"\n" else 1)
    if invalid or table.num_rows != n_lines:
        good_lines, quarantine = _classify_lines(bytes(block), layout, first_line, pseudonymiser)
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
        layout,
        pseudonymiser,
        pseudonymise_job_names,
        default_cluster,
    )
    quarantine.extend(more)
    return ParsedBlock(jobs, quarantine, rows_read, layout.fields, gpu_sources)


def _utf8(col: pa.Array) -> tuple[pa.Array, pa.Array]:
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


def _as_dict(col: pa.Array) -> pa.Array:
    """Low-cardinality output columns are dictionary-encoded strings in every block."""
    if pa.types.is_dictionary(col.type):
        return col
    return pc.dictionary_encode(pc.cast(col, pa.string()))


def _timestamps(col: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(UTC timestamps, bad mask): typed columns are already converted; raw ones parse here."""
    utc = pa.timestamp("us", tz="UTC")
    if pa.types.is_timestamp(col.type):
        return pc.cast(pc.cast(col, pa.timestamp("us")), utc), pa.repeat(pa.scalar(False), len(col))
    text, bad_utf8 = _utf8(col)
    parsed = pc.strptime(text, "%Y-%m-%dT%H:%M:%S", "us", error_is_null=True)
    absent = pc.is_in(pc.fill_null(text, ""), pa.array(_ABSENT))
    return pc.cast(parsed, utc), pc.or_(pc.and_(pc.is_null(parsed), pc.invert(absent)), bad_utf8)


def _integers(col: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(int64 or null, not-an-integer mask, negative mask) for a count column given as
    integers or raw text."""
    if pa.types.is_integer(col.type):
        return col, pa.repeat(pa.scalar(False), len(col)), pc.less(col, 0)
    text = pc.fill_null(_utf8(col)[0], "")
    ok = pc.match_substring_regex(text, r"^-?\d{1,15}$")
    values = pc.cast(pc.if_else(ok, text, pa.scalar(None, pa.string())), pa.int64())
    return values, pc.and_(pc.invert(ok), pc.not_equal(text, "")), pc.less(values, 0)


_PLAUSIBLE = (
    pa.scalar(PLAUSIBLE_FROM, pa.timestamp("us", tz="UTC")),
    pa.scalar(PLAUSIBLE_UNTIL, pa.timestamp("us", tz="UTC")),
)


def _implausible(times: pa.Array) -> pa.Array:
    """Timestamps outside [PLAUSIBLE_FROM, PLAUSIBLE_UNTIL) (null where the time is absent)."""
    return pc.or_(pc.less(times, _PLAUSIBLE[0]), pc.greater_equal(times, _PLAUSIBLE[1]))


def _parse_fields(
    table: pa.Table,
    lines: pa.Array,
    layout: DumpLayout,
    pseudonymiser: Pseudonymiser,
    pseudonymise_job_names: bool,
    default_cluster: str,
) -> tuple[pa.Table, list[Quarantined], dict[str, int]]:
    """Every field of a block's rows → (job rows, quarantined rows, GPU sources counted)."""
    n = table.num_rows
    empty = pa.nulls(n, pa.binary())

    def raw(name: str) -> pa.Array:
        return table.column(name).chunk(0) if name in table.column_names and n else empty

    reason = pa.nulls(n, pa.string())

    def flag(bad: pa.Array, why: str) -> None:
        nonlocal reason
        bad = pc.fill_null(bad, False)
        if pc.any(bad).as_py():
            reason = pc.if_else(pc.and_(pc.is_null(reason), bad), why, reason)

    def blank_to_null(a: pa.Array) -> pa.Array:
        return pc.if_else(pc.equal(a, ""), pa.scalar(None, a.type), a)

    def struct_of(
        name: str, fn: Callable[[Any], dict[str, Any]], t: pa.StructType, why: str
    ) -> pa.StructArray:
        parsed = _map_distinct(raw(name), fn, t)
        flag(pc.struct_field(parsed, "bad"), why)
        return parsed

    # Identity: one JobID grammar for allocations, steps, array tasks and het components.
    id_field = layout.job_id_field
    job_id, bad_utf8 = _utf8(raw(id_field))
    flag(bad_utf8, f"{id_field} is not valid UTF-8")
    parts = pc.extract_regex(pc.fill_null(job_id, ""), JOB_ID_RE)
    flag(pc.is_null(parts), f"{id_field} does not match 123, 123_4, 123+0 or 123.step")
    parts = pc.fill_null(
        parts, pa.scalar({"base": "", "task": "", "het": "", "step": ""}, parts.type)
    )
    base, task, het, step = (pc.struct_field(parts, f) for f in ("base", "task", "het", "step"))
    job_id_raw_col, _ = _utf8(raw("JobIDRaw"))
    raw_base = pc.replace_substring_regex(pc.fill_null(job_id_raw_col, ""), r"\..*$", "")
    job_id_raw = pc.if_else(pc.equal(raw_base, ""), base, raw_base)

    st = struct_of(
        "State", _parse_state, _STATE_TYPE, "State is empty or not a state name (A-Z, 0-9, _)"
    )
    ex = struct_of("ExitCode", _parse_exit, _EXIT_TYPE, "ExitCode is not N:M, 0 ≤ N, M ≤ 255")
    tl = struct_of(
        "Timelimit",
        _parse_timelimit,
        _TIMELIMIT_TYPE,
        "Timelimit is not [D-]HH:MM:SS, UNLIMITED or Partition_Limit",
    )
    tres = struct_of(
        "AllocTRES", parse_tres, _TRES_TYPE, "AllocTRES is not name=value[,name=value…]"
    )
    gpus, gpu_given = _gpu_counts(layout, tres, struct_of)
    times = {}
    for name in ("Submit", "Start", "End"):
        times[name], bad = _timestamps(raw(name))
        flag(bad, f"{name} is not a timestamp")
        flag(
            _implausible(times[name]),
            f"{name} is outside any plausible accounting history "
            f"({PLAUSIBLE_FROM.year}-{PLAUSIBLE_UNTIL.year - 1})",
        )
    counts = {}
    for name in ("ElapsedRaw", "NNodes", "NCPUS"):
        counts[name], bad, negative = _integers(raw(name))
        flag(negative, f"{name} is negative")
        flag(bad, f"{name} is not an integer")

    # Elapsed: ElapsedRaw when given, else Elapsed ([D-]HH:MM:SS), parsed only where needed.
    elapsed = counts["ElapsedRaw"]
    if pc.any(pc.is_null(elapsed)).as_py() and "Elapsed" in table.column_names:
        el = _map_distinct(raw("Elapsed"), lambda v: parse_duration_s(_text(v) or None), pa.int64())
        el_text = pc.fill_null(_utf8(raw("Elapsed"))[0], "")
        flag(pc.and_(pc.is_null(elapsed), pc.starts_with(el_text, "-")), "Elapsed is negative")
        flag(
            pc.and_(pc.and_(pc.is_null(elapsed), pc.is_null(el)), pc.not_equal(el_text, "")),
            "Elapsed is not [D-]HH:MM:SS",
        )
        elapsed = pc.coalesce(elapsed, el)
    elapsed = pc.coalesce(elapsed, 0)

    job_name, bad_utf8 = _utf8(raw("JobName"))
    if not pseudonymise_job_names:
        flag(bad_utf8, "JobName is not valid UTF-8")

    def text_column(name: str) -> pa.Array:
        return _as_dict(pc.fill_null(_utf8(raw(name))[0], ""))

    null_str = pa.scalar(None, pa.string())
    cluster = text_column("Cluster")
    jobs = pa.table(
        {
            "cluster": _as_dict(
                pc.if_else(
                    pc.equal(cluster.dictionary_decode(), ""),
                    default_cluster,
                    cluster.dictionary_decode(),
                )
            ),
            "job_id": job_id,
            "job_id_raw": job_id_raw,
            "array_job_id": pc.if_else(pc.equal(task, ""), null_str, base),
            "array_task_id": blank_to_null(task),
            "het_job_id": pc.if_else(pc.equal(het, ""), null_str, base),
            "het_offset": pc.cast(blank_to_null(het), pa.int64()),
            "step": blank_to_null(step),
            "is_allocation": pc.equal(step, ""),
            "partition": text_column("Partition"),
            "user": pseudonymiser.column("user", raw("User")),
            "account": pseudonymiser.column("account", raw("Account")),
            "job_name": (
                pseudonymiser.column("name", raw("JobName"))
                if pseudonymise_job_names
                else _as_dict(pc.fill_null(job_name, ""))
            ),
            "state": _as_dict(pc.struct_field(st, "state")),
            "state_raw": text_column("State"),
            "exit_code": pc.struct_field(ex, "code"),
            "exit_signal": pc.struct_field(ex, "signal"),
            "submit": times["Submit"],
            "start": times["Start"],
            "end": times["End"],
            "elapsed_s": elapsed,
            "timelimit_s": pc.struct_field(tl, "s"),
            "timelimit_raw": text_column("Timelimit"),
            "nnodes": pc.coalesce(counts["NNodes"], pc.struct_field(tres, "nodes"), 0),
            "ncpus": pc.coalesce(counts["NCPUS"], pc.struct_field(tres, "cpus"), 0),
            "gpus": gpus,
            "mem_bytes": pc.struct_field(tres, "mem"),
            "node_list": text_column("NodeList"),
            "source_line": lines,
        }
    )
    bad = pc.is_valid(reason)
    parsed_allocations = pc.and_(jobs.column("is_allocation"), pc.invert(bad))
    gpu_sources = _count_gpu_sources(parsed_allocations, gpu_given)
    if not pc.any(bad).as_py():
        return jobs, [], gpu_sources
    quarantine = _quarantine_rows(
        table, lines, reason, bad, layout, pseudonymiser, pseudonymise_job_names
    )
    return jobs.filter(pc.invert(bad)), quarantine, gpu_sources


def _gpu_counts(
    layout: DumpLayout,
    alloc_tres: pa.StructArray,
    struct_of: Callable[[str, Callable[[Any], dict[str, Any]], pa.StructType, str], pa.Array],
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
            parsed = struct_of(source, parse_tres, _TRES_TYPE, f"{source} is not name=value[,…]")
        else:
            parsed = struct_of(source, parse_gres, _GRES_TYPE, f"{source} is not name[:type]:N[,…]")
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


def _quarantine_rows(
    table: pa.Table,
    lines: pa.Array,
    reason: pa.Array,
    bad: pa.Array,
    layout: DumpLayout,
    pseudonymiser: Pseudonymiser,
    pseudonymise_job_names: bool,
) -> list[Quarantined]:
    """The rejected rows as read, identities as keyed tokens: user and account always, the
    job name when the plan asks, and any field ckpt-poc does not read unless plainly an id,
    count, time or state (a site's dump may carry WorkDir, Group, Comment, …)."""
    tokens = {"User": "user", "Account": "account"}
    if pseudonymise_job_names:
        tokens["JobName"] = "name"
    delim = layout.delimiter.decode(errors="replace")
    rows = table.filter(bad).to_pylist()
    out = []
    for row, line, why in zip(
        rows, lines.filter(bad).to_pylist(), reason.filter(bad).to_pylist(), strict=True
    ):
        values = []
        for name, value in row.items():
            text = _raw_text(value)
            if text and name in tokens:
                text = pseudonymiser.token(tokens[name], text)
            elif text and name.startswith("_unknown") and not _is_plain(text):
                text = pseudonymiser.token("field", text)
            values.append(text)
        out.append(Quarantined(line, why, delim.join(values)))
    return out


def _raw_text(value: Any) -> str:
    """A value of the typed or the raw reader as the text it was read from."""
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


# --- reading whole inputs --------------------------------------------------------------------


def iter_blocks(
    stream: io.BufferedIOBase, block_bytes: int = BLOCK_BYTES
) -> Iterator[tuple[memoryview, int, int]]:
    """Newline-aligned blocks (zero-copy views), the 1-based line each starts at, and the
    number of newlines each holds."""
    carry = b""
    line = 1
    while True:
        chunk = stream.read(block_bytes)
        if not chunk:
            break
        data = carry + chunk if carry else chunk
        cut = data.rfind(b"\n") + 1
        if not cut:
            carry = data
            continue
        view = memoryview(data)
        newlines = data.count(b"\n", 0, cut)
        yield view[:cut], line, newlines
        carry = bytes(view[cut:])
        line += newlines
    if carry:
        yield memoryview(carry), line, carry.count(b"\n")


def _first_content_line(stream: io.BufferedIOBase) -> tuple[bytes, int, int]:
    """The first non-empty line, its 1-based line number and the byte offset it starts at."""
    offset, number = 0, 0
    while True:
        line = stream.readline()
        if not line:
            return b"", number, offset
        number += 1
        if line.strip():
            return line, number, offset
        offset += len(line)


def parse_sacct_stream(
    stream: io.BufferedIOBase,
    source: str,
    pseudonymiser: Pseudonymiser,
    *,
    delimiter: bytes | None = None,
    sacct_format: str | None = None,
    pseudonymise_job_names: bool = False,
    block_bytes: int = BLOCK_BYTES,
) -> Iterator[ParsedBlock]:
    """Parse a whole ``sacct -P`` stream block by block (the stream must be seekable).

    ``delimiter`` overrides the one the header shows (or '|'); ``sacct_format`` names the
    columns of a header-less dump in sacct's --format syntax.
    """
    first, first_number, first_offset = _first_content_line(stream)
    if not first:
        return
    layout = detect_layout(first, source, delimiter, sacct_format, first_number)
    if layout.has_header:
        stream.seek(first_offset + len(first))
        start_line = first_number + 1
    else:
        stream.seek(first_offset)
        start_line = first_number
    for block, offset, newlines in iter_blocks(stream, block_bytes):
        yield parse_block(
            block,
            layout,
            start_line + offset - 1,
            pseudonymiser,
            newlines=newlines,
            pseudonymise_job_names=pseudonymise_job_names,
        )


# --- sacct --json ----------------------------------------------------------------------------


def _fmt_time(epoch: Any) -> str:
    if isinstance(epoch, dict):  # newer Slurm: {"set": true, "number": N}
        epoch = epoch.get("number") if epoch.get("set", True) else None
    if not epoch:
        return "Unknown"
    return dt.datetime.fromtimestamp(int(epoch), dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _number(value: Any) -> Any:
    if isinstance(value, dict):
        return value.get("number") if value.get("set", True) else None
    return value


def _tres_text(entries: Sequence[dict[str, Any]]) -> str:
    items = []
    for e in entries or []:
        count = _number(e.get("count"))
        if count is None:  # e.g. energy, which 22.05 lists with a null count
            continue
        name = e.get("type", "")
        if e.get("name"):
            name = f"{name}/{e['name']}"
        items.append(f"mem={int(count)}M" if name == "mem" else f"{name}={int(count)}")
    return ",".join(items)


def sacct_json_to_psv(data: bytes, source: str) -> bytes:
    """Turn ``sacct --json`` into a ``-P`` dump in our --format, with a header.

    Exit codes in 22.05's JSON are unreliable (notes/slurm.md): prefer ``-P`` dumps for them.
    """
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AccountingError(f"{source}: not valid sacct --json output: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise AccountingError(f"{source}: sacct --json output has no 'jobs' list")
    out = ["|".join(SACCT_FIELDS)]
    for i, job in enumerate(doc["jobs"]):
        try:
            out.extend(_json_job_rows(job))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            out.append(f"UNPARSEABLE-JSON-JOB-{i}: {type(exc).__name__} {exc}".replace("|", "/"))
    return ("\n".join(out) + "\n").encode()


def _clean(value: Any) -> str:
    return str(value if value is not None else "").replace("|", "/").replace("\n", " ")


def _json_exit(exit_code: dict[str, Any] | None) -> str:
    exit_code = exit_code or {}
    rc = _number(exit_code.get("return_code")) or 0
    sig = _number((exit_code.get("signal") or {}).get("signal_id")) or 0
    return f"{rc}:{sig}"


def _json_job_rows(job: dict[str, Any]) -> list[str]:
    """One allocation row and one row per step, in SACCT_FIELDS order."""
    job_id = str(job["job_id"])
    array = job.get("array") or {}
    task = _number(array.get("task_id"))
    array_job = _number(array.get("job_id"))
    shown = f"{array_job}_{task}" if array_job and task is not None else job_id
    het = job.get("het") or {}
    if _number(het.get("job_id")) and _number(het.get("job_offset")) is not None:
        shown = f"{_number(het['job_id'])}+{_number(het['job_offset'])}"
    time = job.get("time") or {}
    limit = _number(time.get("limit"))
    user, account = job.get("user", ""), job.get("account", "")
    fields = [
        shown,
        job_id,
        job.get("cluster", ""),
        job.get("partition", ""),
        user,
        account,
        job.get("name", ""),
        _json_state(job.get("state")),
        _json_exit(job.get("exit_code")),
        _fmt_time(time.get("submission")),
        _fmt_time(time.get("start")),
        _fmt_time(time.get("end")),
        "",
        str(int(_number(time.get("elapsed")) or 0)),
        str(limit) if limit else "UNLIMITED",
        str(job.get("allocation_nodes") or 0),
        "",
        _tres_text((job.get("tres") or {}).get("allocated") or []),
        job.get("nodes", ""),
    ]
    rows = [fields]
    for step in job.get("steps") or []:
        st_time = step.get("time") or {}
        step_id = (step.get("step") or {}).get("id", "")
        nodes = step.get("nodes") or {}
        rows.append(
            [
                f"{shown}.{step_id}",
                f"{job_id}.{step_id}",
                job.get("cluster", ""),
                "",
                "",
                account,
                (step.get("step") or {}).get("name", ""),
                _json_state(step.get("state")),
                _json_exit(step.get("exit_code")),
                _fmt_time(st_time.get("start")),
                _fmt_time(st_time.get("start")),
                _fmt_time(st_time.get("end")),
                "",
                str(int(_number(st_time.get("elapsed")) or 0)),
                "",
                str(nodes.get("count") or 0),
                "",
                _tres_text((step.get("tres") or {}).get("allocated") or []),
                nodes.get("range", ""),
            ]
        )
    return ["|".join(_clean(f) for f in row) for row in rows]


def _json_state(state: Any) -> str:
    text = state.get("current") if isinstance(state, dict) else state
    if isinstance(text, list):  # newer Slurm: a list of flags, the first being the state
        text = text[0] if text else ""
    return str(text or "")


# --- live sacct ------------------------------------------------------------------------------


def sacct_argv(start: dt.datetime, end: dt.datetime, clusters: Sequence[str] = ()) -> list[str]:
    argv = [
        "sacct",
        "-a",
        "-D",
        "-P",
        "--noheader",
        f"--format={','.join(SACCT_FIELDS)}",
        "-S",
        start.strftime("%Y-%m-%dT%H:%M:%S"),
        "-E",
        end.strftime("%Y-%m-%dT%H:%M:%S"),
    ]
    if clusters:
        argv += ["-M", ",".join(clusters)]
    return argv


def day_chunks(start: dt.datetime, end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime]]:
    chunks = []
    t = start
    while t < end:
        nxt = min(t + dt.timedelta(days=1), end)
        chunks.append((t, nxt))
        t = nxt
    return chunks


def run_sacct_live(
    start: dt.datetime, end: dt.datetime, clusters: Sequence[str] = (), timeout_s: float = 300
) -> bytes:
    """Live sacct over [start, end) in day-sized chunks, in UTC, as one header-less dump.

    A job that spans chunks is reported by each; the exact duplicates are dropped later.
    """
    env = {**os.environ, "TZ": "UTC"}
    out = []
    for a, b in day_chunks(start, end):
        argv = sacct_argv(a, b, clusters)
        try:
            done = subprocess.run(
                argv, capture_output=True, env=env, timeout=timeout_s, check=False
            )
        except FileNotFoundError as exc:
            raise AccountingError("sacct is not on PATH: is this a Slurm client host?") from exc
        except subprocess.TimeoutExpired as exc:
            raise AccountingError(f"sacct timed out after {timeout_s}s for {a}..{b}") from exc
        if done.returncode != 0:
            raise AccountingError(
                f"sacct exited {done.returncode} for {a:%Y-%m-%d}: "
                f"{done.stderr.decode(errors='replace').strip()[-500:]}"
            )
        out.append(done.stdout)
    return b"".join(out)


def open_source(path: str | Path) -> tuple[io.BufferedIOBase, str]:
    """Open a dump; sacct --json is converted to a -P stream up front."""
    p = Path(path)
    try:
        fh = open(p, "rb")  # noqa: SIM115 - handed to the caller
    except OSError as exc:
        raise AccountingError(f"{p}: cannot open accounting file: {exc.strerror}") from exc
    head = fh.read(64).lstrip()
    fh.seek(0)
    if head.startswith(b"{"):
        data = fh.read()
        fh.close()
        return io.BytesIO(sacct_json_to_psv(data, str(p))), "json"
    return fh, "psv"
