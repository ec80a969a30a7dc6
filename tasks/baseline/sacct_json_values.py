"""The values of ``sacct --json`` in the shapes Slurm writes for an ordinary job, read to text.

The readings sacct_json_fast (orjson's dicts) and sacct_json_typed (msgspec's structs) share:
each answers for the common shapes only and raises NotCommon on any other, for
sacct_json.job_rows (the reading every other agrees with) to read. A step's row layout is
declared here once, for all three.
"""

from __future__ import annotations

import operator
import time
from typing import Any

_SECONDS_PER_DAY = 86_400
# Epochs past 9999-12-31 are left to job_rows (strftime's year grows a digit there).
_LAST_EPOCH = 253_402_300_799
# "HH:MM:SS" of each second of a day, built on first use: a time is then a day's date (one
# strftime a day, memoised) and an index, not a gmtime and a strftime per value.
_CLOCK: list[str] = []
_DAY_TEXT: dict[int, str] = {}


class NotCommon(Exception):
    """A value whose shape this fast path does not read; job_rows reads it instead."""


class Converted(list):  # list[str]
    """A job's rows, made already by sacct_json_typed from its chunk."""


_TRES_KEYS = operator.itemgetter("type", "name", "count")
_NO_VAL_KEYS = operator.itemgetter("set", "infinite", "number")


def _number(value: Any) -> int | None:
    """sacct_json.number for an int, null, or a finite ``{set, infinite, number}`` of an
    int."""
    if type(value) is int:
        return value
    if type(value) is dict:
        is_set, infinite, inner = _NO_VAL_KEYS(value)
        if infinite is False:
            if is_set is True and type(inner) is int:
                return inner
            if is_set is False:
                return None
    elif value is None:
        return None
    raise NotCommon


def _epoch_text(value: Any) -> str:
    """sacct_json.epoch_text: UTC ISO text; 0, unset or negative is ``Unknown``."""
    epoch = value if type(value) is int else _number(value)
    if not epoch or epoch < 0:
        return "Unknown"
    if epoch > _LAST_EPOCH:
        raise NotCommon
    day = epoch // _SECONDS_PER_DAY
    date = _DAY_TEXT.get(day)
    if date is None:
        if not _CLOCK:  # filled whole in one step, before any day is memoised: thread-safe
            _CLOCK[:] = [
                f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}" for s in range(_SECONDS_PER_DAY)
            ]
        date = _DAY_TEXT[day] = time.strftime("%Y-%m-%dT", time.gmtime(day * _SECONDS_PER_DAY))
    return date + _CLOCK[epoch % _SECONDS_PER_DAY]


def _text(value: Any) -> str:
    if type(value) is str:
        if "|" in value or "\n" in value:
            return value.replace("|", "/").replace("\n", " ")
        return value
    if value is None:
        return ""
    raise NotCommon


def _state(value: Any) -> str:
    """One state name, bare, in a one-item list, or as ``{"current": …}`` of either."""
    if type(value) is dict:
        value = value.get("current")
    if type(value) is list and len(value) == 1:
        value = value[0]
    if type(value) is str:
        return value
    raise NotCommon  # several flags: job_rows applies Slurm's order of precedence


def _memo(table: dict[bytes, Any], key: bytes, value: Any) -> Any:
    """Remember ``value`` for ``key`` (a value's JSON); the table is emptied when full, so
    a history of unique values cannot grow it."""
    if len(table) >= _MEMO_MAX:
        table.clear()
    # A copy the key's size: orjson's bytes keep the 4 KiB they were written in (tracemalloc:
    # 4,089 B a key, 256 MiB a full table), and the tables kept them.
    table[bytes(memoryview(key))] = value
    return value


_MEMO_MAX = 1 << 16


def _exit_text(value: Any) -> str:
    if type(value) is not dict:
        raise NotCommon  # null is "0:0" to job_rows; rare enough to leave it there
    signal = value.get("signal") or {}
    if type(signal) is not dict:
        raise NotCommon
    rc = _number(value.get("return_code")) or 0
    return f"{rc}:{_number(signal.get('id', signal.get('signal_id'))) or 0}"


def _tres_of(holder: Any) -> str:
    """_tres without its memo (the caller memoises by the holder's raw JSON)."""
    return _tres_text(_allocated(holder))


def _allocated(holder: Any) -> list[Any]:
    if type(holder) is not dict:
        raise NotCommon
    entries = holder.get("allocated")
    if type(entries) is not list:
        raise NotCommon
    return entries


def _tres_text(entries: list[Any]) -> str:
    items = []
    for entry in entries:
        if type(entry) is not dict:
            raise NotCommon
        kind, name, count = _TRES_KEYS(entry)
        if type(count) is not int:
            count = _number(count)
        if count is None or count < 0 or type(kind) is not str:
            if type(kind) is not str:
                raise NotCommon
            continue
        if name:
            if type(name) is not str:
                raise NotCommon
            items.append(f"{kind}/{name}={count}")
        else:
            items.append(f"mem={count}M" if kind == "mem" else f"{kind}={count}")
    return ",".join(items)


def _time_limit(value: Any) -> str:
    if type(value) is dict and value.get("infinite") is True:
        return "UNLIMITED"
    if value is None:
        return "UNLIMITED"
    minutes = _number(value)
    return "" if minutes is None else str(minutes)


def _array_or_het_id(array: Any, het: Any) -> str | None:
    """``123_4`` or ``123+0``; None for a job in neither."""
    if type(array) is not dict or type(het) is not dict:
        raise NotCommon
    array_job = _number(array.get("job_id"))
    task = _number(array.get("task_id"))
    het_job = _number(het.get("job_id"))
    offset = _number(het.get("job_offset"))
    if array_job and task is not None:
        return f"{array_job}_{task}"
    if het_job and offset is not None:
        return f"{het_job}+{offset}"
    return None


def step_row_text(
    shown: str,
    job_id: str,
    suffix: str,
    cluster: str,
    account: str,
    name: str,
    state: str,
    exit_code: str,
    start: str,
    end: str,
    elapsed: str,
    nodes: str,
    tres: str,
    node_list: str,
) -> str:
    """A step's row in sacct_json.HEADER's order, from its fields' texts: a step has no
    partition, user, elapsed text, limit or CPU count of its own, and its start stands for
    its submit."""
    return "|".join(
        (
            f"{shown}.{suffix}",
            f"{job_id}.{suffix}",
            cluster,
            "",
            "",
            account,
            name,
            state,
            exit_code,
            start,
            start,
            end,
            "",
            elapsed,
            "",
            nodes,
            "",
            tres,
            node_list,
        )
    )


def _step_suffix(value: Any) -> str:
    """A step id as a number, a bare name (to v0.0.38) or "JOB.STEP" (v0.0.40 on) with a
    plain job id; a job id with an array task or het part, or a step's het part, is not."""
    if type(value) is int:
        return str(value)
    if type(value) is str:
        job, dot, step = value.partition(".")
        if not dot:
            job, step = "0", value
        if step.isalnum() and job.isascii() and job.isdigit():
            return step
    raise NotCommon
