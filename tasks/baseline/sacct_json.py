"""``sacct --json`` (and slurmrestd's ``/slurmdb/v0.0.NN/jobs``) → a ``-P`` dump in our --format.

Every data_parser version from v0.0.37 (Slurm 21.08) to v0.0.44 (Slurm 25.11) is read; the
shapes differ (tests/support/fixtures/sacct_json/README.md has the table and where each comes from):

- numbers: plain ints (v0.0.37/38, where Slurm writes null for "not set" and "infinite"), or
  ``{"set", "infinite", "number"}`` (v0.0.39 on);
- ``state.current``: a string (to v0.0.39), or a list of a base state and flags (v0.0.40 on).
  The state kept is the one ``sacct -P`` prints for the same record (Slurm's
  ``job_state_string``: a flag such as REQUEUED or RESIZING wins over the base state), so a
  JSON document and a ``-P`` dump of the same jobs count the same states;
- TRES counts Slurm does not track are ``null`` (v0.0.37/38) or a negative sentinel (v0.0.39
  on, e.g. energy ``-2``, NO_VAL64 read as int64): dropped, never a bad row;
- step ids: ``"batch"`` or a number (v0.0.37/38), ``{"job_id", "step_id",
  "step_het_component"}`` (v0.0.39), ``"5737.batch"`` / ``"5737.0+1"`` (v0.0.40 on). Only the
  step part is kept (a step's het component, ``+1``, is dropped: the -P grammar has no place
  for it);
- a job whose ``time.end`` is 0 or unset is an open record (End ``Unknown``, as ``sacct -P``).

The document is decoded a few jobs at a time, so a million-job document never exists as one
Python object tree: by orjson, ~16 KiB of jobs a call, where each cut between jobs is proven
by the chunk parsing (sacct_json_fast.fast_jobs); a document no cut can be proven in, or a
broken one, is read again by ``json.JSONDecoder.raw_decode`` one job at a time, whose errors
are the ones shown. Each job's rows come from sacct_json_fast.fast_job_rows where its values
have the ordinary shapes, else from job_rows, which reads every shape. A big file is
converted by several processes at once, each a region of the list (sacct_json_parallel), to
the same bytes.

A job that cannot be read is kept as a row the baseline quarantines, whose JobID names the
first field that failed; a document from a data_parser version not listed in DATA_PARSERS is
read as far as it goes and a warning names the version and that field.
"""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from tasks.baseline.dump_layout import SACCT_FIELDS
from tasks.baseline.sacct_json_fast import (
    NotCommon,
    Unchunked,
    fast_job_rows,
    fast_jobs,
    step_row_text,
)
from tasks.data.errors import AccountingError

log = logging.getLogger(__name__)

# data_parser (or, before it, openapi/dbv) version → the Slurm release that ships it.
DATA_PARSERS = {
    "v0.0.37": "21.08",
    "v0.0.38": "22.05",
    "v0.0.39": "23.02",
    "v0.0.40": "23.11",
    "v0.0.41": "24.05",
    "v0.0.42": "24.11",
    "v0.0.43": "25.05",
    "v0.0.44": "25.11",
}
# Flags that job_state_string (src/common/slurm_protocol_defs.c) prints instead of the base
# state, in its order of precedence.
STATE_FLAGS_SHOWN = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "EXPEDITING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)
_VERSION_RE = re.compile(r"v\d+\.\d+\.\d+")
# A step id that carries its job's id: 5737.batch, 5737_3.0, 5737+1.extern (v0.0.40 on).
_STEP_PREFIX_RE = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?\.")
_WS = re.compile(r"[ \t\n\r]*")
_JOBS_PER_CHUNK = 20_000
N_FIELDS = len(SACCT_FIELDS)
HEADER = ("|".join(SACCT_FIELDS) + "\n").encode()


class Unreadable(ValueError):
    """A field of a job whose value has none of the shapes Slurm gives it."""

    def __init__(self, path: str, expected: str, got: Any) -> None:
        super().__init__(f"{path}: {type(got).__name__}, expected {expected}")
        self.path = path


@dataclass
class JsonConversion:
    """A converted document: the -P bytes and what was learnt reading it."""

    psv: bytes
    data_parser: str  # "v0.0.44", or "unknown" when the document does not say
    slurm_release: str
    jobs: int
    unreadable: list[tuple[int, str]] = field(default_factory=list)  # (job index, first field)

    @property
    def known_version(self) -> bool:
        return self.data_parser in DATA_PARSERS

    def problems(self, source: str) -> str | None:
        """The warning to give, or None when the document was read whole by a known parser."""
        if self.known_version and not self.unreadable:
            return None
        read = self.jobs - len(self.unreadable)
        seen = (
            ""
            if self.known_version
            else (
                f", a version ckpt-poc has not seen (it reads {min(DATA_PARSERS)}–"
                f"{max(DATA_PARSERS)})"
            )
        )
        first = (
            f"; first field it could not read: jobs[{self.unreadable[0][0]}] "
            f"{self.unreadable[0][1]}"
            if self.unreadable
            else "; every field it needs was read"
        )
        return (
            f"{source}: sacct --json from data_parser {self.data_parser} (Slurm "
            f"{self.slurm_release or 'release not given'}){seen}: read {read} of "
            f"{self.jobs} jobs{first}"
        )


# --- values ----------------------------------------------------------------------------------


def number(value: Any, path: str) -> int | None:
    """A plain number or ``{set, infinite, number}`` → int; None when unset or infinite."""
    kind = type(value)
    if kind is int:  # the common cases first: this runs a dozen times a job
        return value
    if kind is dict:
        if value.get("infinite") or not value.get("set", True):
            return None
        return number(value.get("number"), path)
    if value is None:
        return None
    if isinstance(value, bool):
        raise Unreadable(path, "a number", value)
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        if value.get("infinite") or not value.get("set", True):
            return None
        return number(value.get("number"), path)
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    raise Unreadable(path, "a number or {set, infinite, number}", value)


def is_infinite(value: Any) -> bool:
    return isinstance(value, dict) and bool(value.get("infinite"))


def epoch_text(value: Any, path: str) -> str:
    """A UNIX time → sacct's UTC ISO text; 0, unset or negative is ``Unknown``."""
    epoch = number(value, path)
    if not epoch or epoch < 0:
        return "Unknown"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch))


def state_text(value: Any, path: str) -> str:
    """``state`` (a string, a list of flags, or ``{"current": …}``) → the state -P prints."""
    if isinstance(value, dict):
        return state_text(value.get("current"), f"{path}.current")
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        for flag in STATE_FLAGS_SHOWN:
            if flag in value:
                return flag
        return value[0]
    raise Unreadable(path, "a state name or a list of state flags", value)


def tres_text(entries: Any, path: str) -> str:
    """A TRES list → ``type[/name]=count,…``; counts Slurm does not track are dropped."""
    if entries is None:
        return ""
    if not isinstance(entries, list):
        raise Unreadable(path, "a list of TRES", entries)
    items = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("type"), str):
            raise Unreadable(f"{path}[{i}]", "{type, name, count}", e)
        count = number(e.get("count"), f"{path}[{i}].count")
        if count is None or count < 0:  # null (to v0.0.38) or a sentinel (v0.0.39 on)
            continue
        name = f"{e['type']}/{e['name']}" if e.get("name") else e["type"]
        items.append(f"mem={count}M" if name == "mem" else f"{name}={count}")
    return ",".join(items)


def step_suffix(value: Any, path: str) -> str:
    """The step part of a step id in any version's shape: batch, extern, 0, …"""
    if isinstance(value, dict):
        if "step_id" in value:  # v0.0.39: {"job_id", "step_het_component", "step_id"}
            return step_suffix(value["step_id"], f"{path}.step_id")
        if "id" in value:
            return step_suffix(value["id"], f"{path}.id")
        raise Unreadable(path, "a step id", value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value:
        step = _STEP_PREFIX_RE.sub("", value, count=1)
        return step.split("+", 1)[0]  # a step's het component (0+1) has no -P spelling
    raise Unreadable(path, "a step id", value)


def exit_text(value: Any, path: str) -> str:
    if value is None:
        return "0:0"
    if not isinstance(value, dict):
        raise Unreadable(path, "{return_code, signal}", value)
    rc = number(value.get("return_code"), f"{path}.return_code") or 0
    signal = value.get("signal") or {}
    if not isinstance(signal, dict):
        raise Unreadable(f"{path}.signal", "{id, name}", signal)
    sig = signal.get("id", signal.get("signal_id"))
    return f"{rc}:{number(sig, f'{path}.signal.id') or 0}"


def _text(value: Any, path: str) -> str:
    if type(value) is str:
        return (
            value.replace("|", "/").replace("\n", " ") if "|" in value or "\n" in value else value
        )
    if value is None:
        return ""
    if isinstance(value, str):
        return value.replace("|", "/").replace("\n", " ")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise Unreadable(path, "text", value)


def _dict(value: Any, path: str) -> dict[str, Any]:  # a dict: an object of sacct's JSON
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Unreadable(path, "an object", value)
    return value


# --- jobs ------------------------------------------------------------------------------------


def _time_limit(value: Any, path: str) -> str:
    """Minutes (the -P parser reads bare digits as minutes); infinite or null is UNLIMITED
    (v0.0.37/38 write both "infinite" and "not set" as null), unset is empty."""
    if value is None or is_infinite(value):
        return "UNLIMITED"
    minutes = number(value, path)
    return "" if minutes is None else str(minutes)


def _shown_id(job: dict[str, Any], job_id: str) -> str:
    """JobID as sacct -P shows it: array task 123_4, het component 123+0, else the id."""
    array = _dict(job.get("array"), "array")
    array_job = number(array.get("job_id"), "array.job_id")
    task = number(array.get("task_id"), "array.task_id")
    if array_job and task is not None:
        return f"{array_job}_{task}"
    het = _dict(job.get("het"), "het")
    het_job = number(het.get("job_id"), "het.job_id")
    offset = number(het.get("job_offset"), "het.job_offset")
    if het_job and offset is not None:
        return f"{het_job}+{offset}"
    return job_id


def job_rows(job: Any) -> list[str]:
    """One allocation row and one row per step, in SACCT_FIELDS order, '|'-joined."""
    job = _dict(job, "job")
    job_id = str(number(job.get("job_id"), "job_id"))
    shown = _shown_id(job, job_id)
    t = _dict(job.get("time"), "time")
    cluster = _text(job.get("cluster"), "cluster")
    account = _text(job.get("account"), "account")
    rows = [
        shown,
        job_id,
        cluster,
        _text(job.get("partition"), "partition"),
        _text(job.get("user"), "user"),
        account,
        _text(job.get("name"), "name"),
        state_text(job.get("state"), "state"),
        exit_text(job.get("exit_code"), "exit_code"),
        epoch_text(t.get("submission"), "time.submission"),
        epoch_text(t.get("start"), "time.start"),
        epoch_text(t.get("end"), "time.end"),
        "",
        str(number(t.get("elapsed"), "time.elapsed") or 0),
        _time_limit(t.get("limit"), "time.limit"),
        str(number(job.get("allocation_nodes"), "allocation_nodes") or 0),
        "",
        tres_text(_dict(job.get("tres"), "tres").get("allocated"), "tres.allocated"),
        _text(job.get("nodes"), "nodes"),
    ]
    out = ["|".join(rows)]
    steps = job.get("steps") or []
    if not isinstance(steps, list):
        raise Unreadable("steps", "a list of steps", steps)
    for i, step in enumerate(steps):
        out.append(
            _step_row(_dict(step, f"steps[{i}]"), f"steps[{i}]", shown, job_id, cluster, account)
        )
    return out


def _step_row(
    step: dict[str, Any], path: str, shown: str, job_id: str, cluster: str, account: str
) -> str:
    t = _dict(step.get("time"), f"{path}.time")
    ident = _dict(step.get("step"), f"{path}.step")
    suffix = step_suffix(ident.get("id"), f"{path}.step.id")
    nodes = _dict(step.get("nodes"), f"{path}.nodes")
    start = epoch_text(t.get("start"), f"{path}.time.start")
    tres = _dict(step.get("tres"), f"{path}.tres").get("allocated")
    return step_row_text(
        shown,
        job_id,
        suffix,
        cluster,
        account,
        _text(ident.get("name"), f"{path}.step.name"),
        state_text(step.get("state"), f"{path}.state"),
        exit_text(step.get("exit_code"), f"{path}.exit_code"),
        start,
        epoch_text(t.get("end"), f"{path}.time.end"),
        str(number(t.get("elapsed"), f"{path}.time.elapsed") or 0),
        str(number(nodes.get("count"), f"{path}.nodes.count") or 0),
        tres_text(tres, f"{path}.tres.allocated"),
        _text(nodes.get("range"), f"{path}.nodes.range"),
    )


def unreadable_row(index: int, path: str) -> str:
    """A row the baseline quarantines ("JobID is not a job id"): its JobID names the job and
    the field, never a value (values may name people)."""
    return "|".join([f"unreadable-json-jobs[{index}].{path}", *([""] * (N_FIELDS - 1))])


# --- the document ----------------------------------------------------------------------------


def _skip(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()  # type: ignore[union-attr]  # matches the empty string


def _expect(text: str, pos: int, chars: str, source: str) -> tuple[str, int]:
    pos = _skip(text, pos)
    if pos >= len(text) or text[pos] not in chars:
        got = repr(text[pos]) if pos < len(text) else "the end"
        line = text.count("\n", 0, pos) + 1
        raise AccountingError(
            f"{source}: not valid sacct --json output: expected {' or '.join(chars)} at line "
            f"{line}, found {got}"
        )
    return text[pos], pos + 1


def iter_document(text: str, source: str, top: dict[str, Any]) -> Iterator[Any]:
    """The ``jobs`` of a document one by one; every other top-level key goes into ``top``."""
    dec = json.JSONDecoder()
    _expect(text, 0, "{", source)
    pos, seen_jobs = _skip(text, 1), False
    if text.startswith("}", pos):
        raise AccountingError(f"{source}: sacct --json output has no 'jobs' list")
    while True:
        key, pos = _decode(dec, text, _skip(text, pos), source)
        _, pos = _expect(text, pos, ":", source)
        pos = _skip(text, pos)
        if key == "jobs" and text.startswith("[", pos):
            seen_jobs = True
            pos = _skip(text, pos + 1)
            if text.startswith("]", pos):
                pos += 1
            else:
                while True:
                    job, pos = _decode(dec, text, _skip(text, pos), source)
                    yield job
                    sep, pos = _expect(text, pos, ",]", source)
                    if sep == "]":
                        break
        else:
            top[str(key)], pos = _decode(dec, text, pos, source)
        sep, pos = _expect(text, pos, ",}", source)
        if sep == "}":
            break
    if not seen_jobs:
        raise AccountingError(f"{source}: sacct --json output has no 'jobs' list")


def _decode(dec: json.JSONDecoder, text: str, pos: int, source: str) -> tuple[Any, int]:
    try:
        return dec.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        raise AccountingError(f"{source}: not valid sacct --json output: {exc}") from exc


def document_version(top: dict[str, Any]) -> tuple[str, str]:
    """(data_parser version, Slurm release) from ``meta``, in any version's spelling:
    meta.plugin.data_parser (v0.0.40 on), meta.plugins.data_parser (v0.0.39),
    meta.plugin.type "openapi/dbv0.0.38" (to v0.0.38); meta.slurm or meta.Slurm."""
    meta = top.get("meta") if isinstance(top.get("meta"), dict) else {}
    version = "unknown"
    for holder in ("plugin", "plugins"):
        plugin = meta.get(holder) if isinstance(meta.get(holder), dict) else {}
        for key in ("data_parser", "type"):
            m = _VERSION_RE.search(str(plugin.get(key) or ""))
            if m:
                version = m.group(0)
                break
        if version != "unknown":
            break
    slurm = meta.get("slurm") or meta.get("Slurm") or {}
    release = str(slurm.get("release") or "") if isinstance(slurm, dict) else ""
    return version, release


def convert_sacct_json(data: bytes | str, source: str) -> JsonConversion:
    """The whole document → -P bytes in our --format, with a header, job by job.

    orjson decodes the jobs a chunk at a time (sacct_json_fast.fast_jobs, ~3× the standard
    library's raw_decode job by job); a document it cannot cut for sure, and every broken one,
    is read again from the start by iter_document, so errors and their positions are the
    standard library's."""
    raw = _as_bytes(data)
    if raw is not None:
        top: dict[str, Any] = {}
        try:
            jobs = fast_jobs(raw, top, lambda tail, tail_top: iter_document(tail, source, tail_top))
            return _convert(jobs, top)
        except Unchunked:
            pass
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise AccountingError(f"{source}: not valid sacct --json output: {exc}") from exc
    top = {}
    return _convert(iter_document(text, source, top), top)


def _as_bytes(data: bytes | str) -> bytes | None:
    if isinstance(data, bytes):
        return data
    try:
        return data.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: only the slow reader takes it
        return None


def _convert(jobs: Iterator[Any], top: dict[str, Any]) -> JsonConversion:
    """Each job's rows (the fast reading of its shape when it has one, else job_rows); ``top``
    is filled as ``jobs`` is read."""
    out = io.BytesIO()
    out.write(HEADER)
    n, unreadable, _ = write_rows(jobs, out)
    version, release = document_version(top)
    return JsonConversion(out.getvalue(), version, release, n, unreadable)


def write_rows(
    jobs: Iterable[Any], out: BinaryIO
) -> tuple[int, list[tuple[int, str]], list[tuple[int, str]]]:
    """Each job's rows into ``out``: (jobs, unreadable (job index, message), and for each
    unreadable job where its row starts in ``out`` and its field path: a caller converting a
    part of the list renumbers that row)."""
    pending: list[str] = []
    unreadable: list[tuple[int, str]] = []
    marks: list[tuple[int, str]] = []
    n = 0
    for n, job in enumerate(jobs, start=1):
        try:
            pending.extend(fast_job_rows(job))
        except (NotCommon, KeyError):  # a shape (or a key left out) the fast reading lacks
            try:
                pending.extend(job_rows(job))
            except Unreadable as exc:
                unreadable.append((n - 1, str(exc)))
                if pending:
                    out.write(("\n".join(pending) + "\n").encode())
                    pending = []
                marks.append((out.tell(), exc.path))
                pending.append(unreadable_row(n - 1, exc.path))
        if len(pending) >= _JOBS_PER_CHUNK:
            out.write(("\n".join(pending) + "\n").encode())
            pending = []
    if pending:
        out.write(("\n".join(pending) + "\n").encode())
    return n, unreadable, marks


def sacct_json_to_psv(data: bytes | str, source: str) -> bytes:
    """Turn ``sacct --json`` into a ``-P`` dump in our --format, with a header; warn when the
    version is one not seen or a job could not be read (that job is quarantined).

    Exit codes in 22.05's JSON are unreliable (notes/slurm.md): prefer ``-P`` dumps for them.
    """
    return psv_of(convert_sacct_json(data, source), source)


def psv_of(conversion: JsonConversion, source: str) -> bytes:
    """A conversion's -P bytes, after its warning (if any) is logged."""
    warning = conversion.problems(source)
    if warning:
        log.warning(warning)
    return conversion.psv
