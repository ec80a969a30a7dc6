"""Accounting files: a ``sacct -P``/``--parsable`` text dump, or a ``sacct --json`` file.

A text dump is handed on as it is (its layout is detected from its first line); a JSON file is
converted up front to a ``-P`` dump in ckpt-poc's --format, with a header.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tasks.baseline.dump_layout import SACCT_FIELDS
from tasks.data.errors import AccountingError


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
