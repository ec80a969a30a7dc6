"""A chunk of ``sacct --json`` jobs read straight to rows, when every job has the common shape.

sacct_json_fast decodes each chunk of the jobs list with orjson into dicts (every value of
every job a Python object) and fast_job_rows turns each into rows. For the shape Slurm has
written since data_parser v0.0.40 this module does both at once, about twice as fast: msgspec
decodes the chunk into typed structs holding only the fields the rows need, with the fields
a site repeats (exit code, TRES, state, time limit, array and het ids) kept as their raw JSON
bytes, whose text is memoised by those bytes. Nothing else of a job becomes an object.

It answers only when sure: a chunk whose any job does not fit the structs, or whose any value
fast_job_rows would not read, gives None, and the caller decodes it with orjson as before. The
rows it gives are fast_job_rows's (tests/unit/test_sacct_json.py holds them to job_rows's).
A chunk msgspec decodes is whole JSON, so it proves its cut as orjson's reading does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import msgspec
import orjson

from tasks.baseline.sacct_json_values import (
    Converted,
    NotCommon,
    _array_or_het_id,
    _epoch_text,
    _exit_text,
    _memo,
    _state,
    _step_suffix,
    _text,
    _time_limit,
    _tres_of,
    step_row_text,
)

# An int64: msgspec reads ints past orjson's 64 bits, which orjson (whose reading this must
# agree with) refuses; those chunks are left to it.
_Int = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]


class _NoVal(msgspec.Struct):
    """``{set, infinite, number}``: Slurm's number that may be unset or infinite."""

    set: bool
    infinite: bool
    number: _Int


_Number = _Int | _NoVal | None


class _Time(msgspec.Struct):
    submission: _Number
    start: _Number
    end: _Number
    elapsed: _Number
    limit: msgspec.Raw


class _StepTime(msgspec.Struct):
    start: _Number = None  # absent: null, as fast_job_rows reads it
    end: _Number = None
    elapsed: _Number = None


class _StepId(msgspec.Struct):
    id: _Int | str | None = None
    name: str | None = None


class _StepNodes(msgspec.Struct):
    count: _Number = None
    range: str | None = None


class _Step(msgspec.Struct):
    time: _StepTime
    step: _StepId
    nodes: _StepNodes
    state: msgspec.Raw
    exit_code: msgspec.Raw
    tres: msgspec.Raw


class _Job(msgspec.Struct):
    job_id: _Int
    array: msgspec.Raw
    het: msgspec.Raw
    time: _Time
    cluster: str | None
    account: str | None
    partition: str | None
    user: str | None
    name: str | None
    state: msgspec.Raw
    exit_code: msgspec.Raw
    allocation_nodes: _Number
    tres: msgspec.Raw
    nodes: str | None
    steps: list[_Step] | None = None


_DECODER = msgspec.json.Decoder(list[_Job])

# A field's raw JSON → its text, one table a field; bounded as sacct_json_fast's.
_SHOWN_ID: dict[bytes, str | None] = {}  # None: the job's own id
_EXIT_TEXT: dict[bytes, str] = {}
_TRES_TEXT: dict[bytes, str] = {}
_STATE_TEXT: dict[bytes, str] = {}
_LIMIT_TEXT: dict[bytes, str] = {}


def chunk_rows(chunk: bytes) -> list[Converted] | None:
    """Each job's rows of ``chunk`` (``[`` jobs ``]``), or None when the chunk is not one
    this reading is sure of (not whole JSON, a job of another shape, an odd value)."""
    try:
        jobs = _DECODER.decode(chunk)
    except msgspec.MsgspecError:
        return None
    try:
        return [Converted(_job_rows(job)) for job in jobs]
    except (NotCommon, KeyError):  # as fast_job_rows: job_rows reads what these cannot
        return None


def _loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:  # an int past 64 bits: job_rows's to judge
        raise NotCommon from None


def _number(value: _Number) -> int | None:
    """sacct_json_values._number for a typed value."""
    if type(value) is int or value is None:
        return value
    if value.infinite is False:  # type: ignore[union-attr]
        return value.number if value.set else None  # type: ignore[union-attr]
    raise NotCommon


def _text_of(raw: msgspec.Raw, table: dict[bytes, str], text_of: Callable[[Any], str]) -> str:
    """A repeated field's text, memoised by its raw JSON."""
    key = bytes(raw)
    text = table.get(key)
    return text if text is not None else _memo(table, key, text_of(_loads(key)))


_UNSEEN = object()


def _shown_id(array: msgspec.Raw, het: msgspec.Raw, job_id: str) -> str:
    # NUL never stands bare in JSON: the two raw values joined by it are one unambiguous key.
    key = bytes(array) + b"\0" + bytes(het)
    shown = _SHOWN_ID.get(key, _UNSEEN)
    if shown is _UNSEEN:
        shown = _memo(_SHOWN_ID, key, _array_or_het_id(_loads(bytes(array)), _loads(bytes(het))))
    return job_id if shown is None else shown  # type: ignore[return-value]


_SEPARATORS = 18  # in a row of sacct_json.HEADER's 19 fields


def _job_rows(job: _Job) -> list[str]:
    """sacct_json_fast.fast_job_rows for a typed job."""
    job_id = str(job.job_id)
    shown = _shown_id(job.array, job.het, job_id)
    t = job.time
    # Times and counts are plain ints from v0.0.40 on: read without a call.
    submission, start, end, elapsed, nodes = (
        t.submission, t.start, t.end, t.elapsed, job.allocation_nodes
    )  # fmt: skip
    fields = [
        shown,
        job_id,
        job.cluster or "",
        job.partition or "",
        job.user or "",
        job.account or "",
        job.name or "",
        _text_of(job.state, _STATE_TEXT, _state),
        _text_of(job.exit_code, _EXIT_TEXT, _exit_text),
        _epoch_text(submission if type(submission) is int else _number(submission)),
        _epoch_text(start if type(start) is int else _number(start)),
        _epoch_text(end if type(end) is int else _number(end)),
        "",
        str((elapsed if type(elapsed) is int else _number(elapsed)) or 0),
        _text_of(t.limit, _LIMIT_TEXT, _time_limit),
        str((nodes if type(nodes) is int else _number(nodes)) or 0),
        "",
        _text_of(job.tres, _TRES_TEXT, _tres_of),
        job.nodes or "",
    ]
    row = "|".join(fields)
    # The text fields as they are, unless one holds a separator or a newline (one check of
    # the row, not six): then as _text writes them.
    if row.count("|") != _SEPARATORS or "\n" in row:
        texts = (job.cluster, job.partition, job.user, job.account, job.name, job.nodes)
        for i, value in zip((2, 3, 4, 5, 6, 18), texts, strict=True):
            fields[i] = _text(value)
        row = "|".join(fields)
    cluster, account = fields[2], fields[5]
    if not job.steps:
        return [row]
    return [row, *(_step_row(step, shown, job_id, cluster, account) for step in job.steps)]


def _step_row(step: _Step, shown: str, job_id: str, cluster: str, account: str) -> str:
    """sacct_json_fast._step_row for a typed step."""
    t, ident, nodes = step.time, step.step, step.nodes
    return step_row_text(
        shown,
        job_id,
        _step_suffix(ident.id),
        cluster,
        account,
        _text(ident.name),
        _text_of(step.state, _STATE_TEXT, _state),
        _text_of(step.exit_code, _EXIT_TEXT, _exit_text),
        _epoch_text(_number(t.start)),
        _epoch_text(_number(t.end)),
        str(_number(t.elapsed) or 0),
        str(_number(nodes.count) or 0),
        _text_of(step.tres, _TRES_TEXT, _tres_of),
        _text(nodes.range),
    )
