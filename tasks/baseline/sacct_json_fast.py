"""``sacct --json`` read fast: the jobs decoded by orjson in chunks, their common shapes → rows.

Both halves are shortcuts that answer only when sure, each behind the slow reading it must
agree with (tests/unit/test_sacct_json.py holds them to it):

- ``fast_jobs`` cuts the jobs list into ~16 KiB chunks where this document writes its
  separator between jobs, and proves each cut by orjson parsing the chunk; a document it
  cannot cut for sure raises ``Unchunked`` and sacct_json.iter_document (the standard
  library's raw_decode, a job at a time, ~3× slower) reads it from the start.
- ``fast_job_rows`` reads only the shapes Slurm writes for an ordinary job (a number as an
  int or a set, finite ``{set, infinite, number}``; a one-flag state; text as text; every
  key there) with fewer Python calls, and gives sacct_json.job_rows's rows for them; on
  anything else it raises ``NotCommon`` (or KeyError) and job_rows, whose answer (rows or
  the ``Unreadable`` field) is the one that counts, reads the job.

Measured on the bench document (v0.0.44, loaded 2-core box): decoding and conversion
26.8 → 10.7 µs a job. A chunk whose every job has the shape Slurm writes from v0.0.40 on is
read faster still by sacct_json_typed (msgspec's typed decoding straight to rows; 15.6 →
8.8 µs a job on the same chunks), which ``_parses`` tries first.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from tasks.baseline.sacct_json_typed import chunk_rows
from tasks.baseline.sacct_json_values import (
    _MEMO_MAX,
    Converted,
    NotCommon,
    _allocated,
    _array_or_het_id,
    _epoch_text,
    _exit_text,
    _memo,
    _number,
    _state,
    _step_suffix,
    _text,
    _time_limit,
    _tres_text,
    step_row_text,
)
from tasks.data.errors import AccountingError

# Names the other readings and the tests find here.
__all__ = ["_MEMO_MAX", "Converted", "NotCommon", "Unchunked", "_epoch_text", "step_row_text"]


class Unchunked(Exception):
    """A document fast_jobs cannot cut into chunks it is sure of; the caller reads it whole
    with the standard library's decoder, whose errors are the ones a user sees."""


# --- the document in chunks ------------------------------------------------------------------

_WS = rb"[ \t\r\n]*"
_JOBS_KEY = re.compile(rb'"jobs"' + _WS + rb":" + _WS + rb"\[" + _WS)
# Between two jobs: the first one's closing brace (with the indent before it, which tells a
# pretty-printed job's brace from a nested object's), the comma, and the next job's first key.
_BETWEEN = re.compile(_WS + rb"\}" + _WS + rb"," + _WS + rb"\{" + _WS + rb'"[^"\\]*"')
CHUNK_BYTES = 16 << 10  # ~15 jobs: decoded and converted while still in the CPU cache
_TRIES = 8  # candidate cuts per chunk before the whole document is left to the slow reader
_TAIL_BYTES = 16 << 20  # the last chunk and what follows the list, read by iter_document


def fast_jobs(
    data: bytes, top: dict[str, Any], read_tail: Callable[[str, dict[str, Any]], Iterator[Any]]
) -> Iterator[Any]:
    """The ``jobs`` of a document, decoded by orjson a chunk of jobs at a time; the other
    top-level keys go into ``top``. ``read_tail`` (sacct_json.iter_document) reads the last
    chunk and what follows the list. Unchunked when a cut cannot be proven right.

    A cut is proven by its chunk: ``[`` + the bytes from a job's start to the cut + ``]``
    parses only if the cut closes a job of the list (inside a string or a nested value it
    leaves something open), so a chunk that parses holds exactly whole jobs.
    """
    pos, head, between = jobs_list(data)
    top.update(head)
    tail = pos
    if between is not None:
        for jobs, after in chunks(data, pos, between):
            yield from jobs
            tail = after
    yield from tail_jobs(data, tail, top, read_tail)


def jobs_list(data: bytes) -> tuple[int, dict[str, Any], bytes | None]:
    """Where the first job of the list starts, the top-level keys before the list, and the
    bytes this document writes between two jobs (None: no second job found soon)."""
    key = _JOBS_KEY.search(data)
    if key is None or b'"jobs"' in data[: key.start()]:
        raise Unchunked
    head = _head(data[: key.start()])
    return key.end(), head, _between_jobs(data, key.end())


def chunks(
    data: bytes, pos: int, between: bytes, stop: int | None = None
) -> Iterator[tuple[list[Any], int]]:
    """Proven chunks of jobs from the job starting at ``pos``, each with where the job after
    it starts. With ``stop`` (where ``between`` is found, a cut not yet proven) the last chunk
    ends at that cut, which it proves, or Unchunked; without, they end where no cut is left
    (the rest is the tail)."""
    if stop is None:
        while (cut := _next_cut(data, pos, between)) is not None:
            yield cut
            pos = cut[1]
        return
    close, after = between.index(b"}") + 1, between.index(b"{")
    while True:
        cut = _next_cut(data, pos, between, stop)
        if cut is None:  # the stop is the next cut: the last chunk proves it or nothing does
            jobs = _parses(data, pos, stop + close)
            if jobs is None:
                raise Unchunked
            yield jobs, stop + after
            return
        yield cut
        pos = cut[1]


def tail_jobs(
    data: bytes,
    pos: int,
    top: dict[str, Any],
    read_tail: Callable[[str, dict[str, Any]], Iterator[Any]],
) -> Iterator[Any]:
    """The jobs from ``pos`` (a proven job start) to the list's end, and the keys after it
    into ``top``, by ``read_tail``; Unchunked when that is too much to copy, or fails."""
    if len(data) - pos > _TAIL_BYTES:  # the separator stopped: the slow reader, not a copy
        raise Unchunked
    try:
        tail = b'{"jobs": [' + data[pos:]
        yield from read_tail(tail.decode(), top)
    except (UnicodeDecodeError, ValueError, AccountingError) as exc:
        raise Unchunked from exc


def _head(head: bytes) -> dict[str, Any]:  # a dict: a JSON object's keys
    """The top-level keys before ``jobs``, closed off where ``jobs`` starts."""
    try:
        keys = orjson.loads(head + b'"jobs": null}')
    except orjson.JSONDecodeError as exc:  # "jobs" was inside a string or a nested value
        raise Unchunked from exc
    if type(keys) is not dict:
        raise Unchunked
    del keys["jobs"]
    return keys


def _between_jobs(data: bytes, pos: int) -> bytes | None:
    """The bytes this document writes between two jobs, learnt from its first two; None
    when there is no second job (or it is not found soon).

    A separator is tried at up to _TRIES places: a job of Slurm 25.11 with its steps' TRES
    lists holds hundreds of ``},{`` between nested objects before its own end, all written
    alike (the same indent, the same first key), and trying every place in turn never
    reached the job's end (such documents were read whole by the slow reader). A nested
    list whose objects open with the jobs' own first key is written as the jobs are: that
    separator is tried again at its next places."""
    tries: dict[bytes, int] = {}
    for between in _BETWEEN.finditer(data, pos, pos + (1 << 20)):
        text = between.group(0)
        if tries.get(text, 0) == _TRIES:
            continue
        if sum(tries.values()) == 8 * _TRIES:
            break
        tries[text] = tries.get(text, 0) + 1
        if _parses(data, pos, between.start() + text.index(b"}") + 1) is not None:
            return text
    return None


def _next_cut(
    data: bytes, pos: int, between: bytes, stop: int | None = None
) -> tuple[list[Any], int] | None:
    """The jobs from ``pos`` to the first proven cut past CHUNK_BYTES, and where the next
    job starts; None when no cut is left (the rest is the tail), or none before ``stop``."""
    close = between.index(b"}") + 1
    start = pos + CHUNK_BYTES
    end = len(data) if stop is None else stop
    for _ in range(_TRIES):
        at = data.find(between, start, end + len(between) - 1)  # a cut at ``stop`` is not one
        if at < 0:
            return None
        jobs = _parses(data, pos, at + close)
        if jobs is not None:
            return jobs, at + between.index(b"{")
        start = at + 1
    raise Unchunked


def _parses(data: bytes, start: int, end: int) -> list[Any] | None:
    """The jobs from ``start`` to ``end``, None when they are not whole JSON: each job's
    rows (Converted) where sacct_json_typed is sure of every job, else orjson's dicts."""
    chunk = b"[" + data[start:end] + b"]"
    converted = chunk_rows(chunk)
    if converted is not None:
        return converted
    try:
        return orjson.loads(chunk)
    except orjson.JSONDecodeError:
        return None


# Keys every ordinary job, step, TRES entry and {set, infinite, number} has: one C call reads
# them all (a missing key is a KeyError, and job_rows, which reads a missing key as null,
# takes that job).
_JOB_KEYS = operator.itemgetter(
    "job_id", "array", "het", "time", "cluster", "account", "partition", "user", "name",
    "state", "exit_code", "allocation_nodes", "tres", "nodes",
)  # fmt: skip
_TIME_KEYS = operator.itemgetter("submission", "start", "end", "elapsed", "limit")
_STEP_KEYS = operator.itemgetter("time", "step", "nodes", "state", "exit_code", "tres")


def _key(value: Any) -> bytes:
    """A value's JSON, to memoise its text by; one orjson cannot write (an int past 64 bits,
    read by the standard library) is for job_rows."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        raise NotCommon from None


# A value's JSON (one C call) → its text, for the fields a site repeats: most jobs share a
# few exit codes, TRES lists and (outside arrays and het jobs) the same empty array/het.
_EXIT_TEXT: dict[bytes, str] = {}
_TRES_TEXT: dict[bytes, str] = {}
_SHOWN_ID: dict[bytes, str | None] = {}  # None: the job's own id


def _exit(value: Any) -> str:
    key = _key(value)
    text = _EXIT_TEXT.get(key)
    return text if text is not None else _memo(_EXIT_TEXT, key, _exit_text(value))


def _tres(holder: Any) -> str:
    """``tres.allocated`` of a job or step → ``type[/name]=count,…``, untracked counts
    (null to v0.0.38, a negative sentinel from v0.0.39) dropped. Memoised by the list's
    JSON (one C call, a third of converting it in Python)."""
    entries = _allocated(holder)
    key = _key(entries)
    text = _TRES_TEXT.get(key)
    return text if text is not None else _memo(_TRES_TEXT, key, _tres_text(entries))


def _shown_id(array: Any, het: Any, job_id: str) -> str:
    key = _key((array, het))
    if key in _SHOWN_ID:
        shown = _SHOWN_ID[key]
    else:
        shown = _memo(_SHOWN_ID, key, _array_or_het_id(array, het))
    return job_id if shown is None else shown


def fast_job_rows(job: Any) -> list[str]:
    """sacct_json.job_rows for the common shapes; NotCommon (or a KeyError, for a key not
    there) for any other. A job already Converted is its rows."""
    if type(job) is not dict:
        if type(job) is Converted:
            return job
        raise NotCommon
    (raw_id, array, het, t, cluster, account, partition, user, name, state, exit_code,
     nodes_allocated, tres, nodes) = _JOB_KEYS(job)  # fmt: skip
    if type(raw_id) is not int or type(t) is not dict:
        raise NotCommon
    job_id = str(raw_id)
    shown = _shown_id(array, het, job_id)
    submission, start, end, elapsed, limit = _TIME_KEYS(t)
    cluster = _text(cluster)
    account = _text(account)
    row = "|".join(
        (
            shown,
            job_id,
            cluster,
            _text(partition),
            _text(user),
            account,
            _text(name),
            _state(state),
            _exit(exit_code),
            _epoch_text(submission),
            _epoch_text(start),
            _epoch_text(end),
            "",
            str(_number(elapsed) or 0),
            _time_limit(limit),
            str(_number(nodes_allocated) or 0),
            "",
            _tres(tres),
            _text(nodes),
        )
    )
    steps = job.get("steps")
    if not steps:
        return [row]
    if type(steps) is not list:
        raise NotCommon
    return [row, *(_step_row(step, shown, job_id, cluster, account) for step in steps)]


def _step_row(step: Any, shown: str, job_id: str, cluster: str, account: str) -> str:
    if type(step) is not dict:
        raise NotCommon
    t, ident, nodes, state, exit_code, tres = _STEP_KEYS(step)
    if type(t) is not dict or type(ident) is not dict or type(nodes) is not dict:
        raise NotCommon
    return step_row_text(
        shown,
        job_id,
        _step_suffix(ident.get("id")),
        cluster,
        account,
        _text(ident.get("name")),
        _state(state),
        _exit(exit_code),
        _epoch_text(t.get("start")),
        _epoch_text(t.get("end")),
        str(_number(t.get("elapsed")) or 0),
        str(_number(nodes.get("count")) or 0),
        _tres(tres),
        _text(nodes.get("range")),
    )
