"""A run's life on disk: live while it runs, visible only once committed.

A stage writes its datasets file by file; a run killed half-way would leave some of them
behind (the first `jobs` block without its exposure, trials without their gates). So a run
becomes visible to readers only when its commit record exists, written atomically and
last, once its rows are complete and gated (passed or refused):

    <data_dir>/<poc>/_live/<run_id>.json      while the run's process lives (pid, start)
    <data_dir>/<poc>/_commits/<run_id>.json   the run is complete: stage, outcome, files

Every reader of the product takes committed runs only (tasks.data.datasets), and so does the
pandas/DuckDB recipe in the README. `ckpt-poc status` reports what killed runs left and
`ckpt-poc clean` deletes it (only runs that are neither committed nor alive).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tasks.data.jsonform import JsonForm

# What a commit record's `status` field says of the run (its `outcome` says why, in words):
# complete (its rows count), partial (written, but some part could not be read) or refused
# (written and kept as the record of why, but no stage counts it).
RunStatus = Literal["complete", "partial", "refused"]
RUN_STATUSES: tuple[RunStatus, ...] = ("complete", "partial", "refused")

COMMITS = "_commits"
LIVE = "_live"
# <run_id>.parquet or <run_id>-partNNNNN.parquet (tasks.data.store.write_dataset)
_RUN_FILE = re.compile(r"^(?P<run_id>.+?)(?:-part\d{5})?\.parquet$")
_TMP_FILE = re.compile(r"^\..+\.tmp$")  # tasks.data.store._write_temp's temp files


def poc_dir(data_dir: str | Path, poc: str) -> Path:
    return Path(data_dir) / poc


def run_id_of(path: Path) -> str | None:
    match = _RUN_FILE.match(path.name)
    return match.group("run_id") if match else None


def write_json_atomically(path: Path, record: Mapping[str, Any]) -> None:
    """temp file, fsync, rename: a reader sees the whole record or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# --- liveness ----------------------------------------------------------------------------------


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None: no such process); with the
    pid it names one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def mark_live(data_dir: str | Path, poc: str, run_id: str, stage: str) -> Path:
    marker = poc_dir(data_dir, poc) / LIVE / f"{run_id}.json"
    write_json_atomically(
        marker,
        {
            "run_id": run_id,
            "stage": stage,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_start_ticks": process_start_ticks(os.getpid()),
            "started_at": dt.datetime.now(dt.UTC).isoformat(),
            "started_epoch": time.time(),
        },
    )
    return marker


def _read_json(path: Path) -> dict[str, Any] | None:  # a dict: a JSON file's document
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _is_alive(record: dict[str, Any]) -> bool:
    """Its process still runs; a run of another host (a shared data folder) counts as
    alive: this host cannot tell, and must never delete it."""
    if record.get("host") != socket.gethostname():
        return True
    pid, ticks = record.get("pid"), record.get("pid_start_ticks")
    return isinstance(pid, int) and ticks is not None and process_start_ticks(pid) == ticks


def live_markers(data_dir: str | Path, poc: str) -> list[dict[str, Any]]:
    """Every live marker, each with ``alive`` (its process still runs)."""
    out = []
    for path in sorted((poc_dir(data_dir, poc) / LIVE).glob("*.json")):
        record = _read_json(path)
        if record is not None:
            out.append({**record, "alive": _is_alive(record), "marker": str(path)})
    return out


# --- commits -----------------------------------------------------------------------------------


def run_files(data_dir: str | Path, poc: str, run_id: str) -> list[Path]:
    """Every dataset file the run wrote."""
    return [p for p in _dataset_files(data_dir, poc) if run_id_of(p) == run_id]


def status_of_outcome(outcome: str) -> RunStatus:
    """The status an outcome line stands for; records written before the `status` field
    existed are read through this too (their outcome began with the status)."""
    for status in ("refused", "partial"):
        if outcome.startswith(status):
            return status  # type: ignore[return-value]
    return "complete"


def run_status(record: dict[str, Any]) -> RunStatus:
    """A commit record's status: its field, or (an older record) read from its outcome."""
    status = record.get("status")
    if status in RUN_STATUSES:
        return status  # type: ignore[no-any-return]
    return status_of_outcome(str(record.get("outcome", "")))


def commit_run(
    data_dir: str | Path,
    poc: str,
    run_id: str,
    stage: str,
    outcome: str,
    status: RunStatus | None = None,
    plan_dates: dict[str, Any] | None = None,
) -> Path:
    """The run is complete: record it with its files (last, atomically) and drop its live
    marker. ``outcome``: 'complete', or why its result was refused (a failed gate);
    ``status``: what the outcome means (read from the outcome's first word when not given);
    ``plan_dates``: the plan's dates the run was judged under (tasks/data/plan_dates.py)."""
    root = poc_dir(data_dir, poc)
    files = run_files(data_dir, poc, run_id)
    record = root / COMMITS / f"{run_id}.json"
    write_json_atomically(
        record,
        {
            "run_id": run_id,
            "stage": stage,
            "outcome": outcome,
            "status": status or status_of_outcome(outcome),
            "committed_at": dt.datetime.now(dt.UTC).isoformat(),
            "files": sorted(str(Path(f).relative_to(root)) for f in files),
            **({"plan_dates": plan_dates} if plan_dates is not None else {}),
        },
    )
    (root / LIVE / f"{run_id}.json").unlink(missing_ok=True)
    return record


def committed_runs(data_dir: str | Path, poc: str) -> dict[str, dict[str, Any]]:
    out = {}
    for path in (poc_dir(data_dir, poc) / COMMITS).glob("*.json"):
        record = _read_json(path)
        if record is not None and record.get("run_id") == path.stem:
            out[path.stem] = record
    return out


def committed_run_ids(data_dir: str | Path, poc: str) -> set[str]:
    return set(committed_runs(data_dir, poc))


# --- what killed runs leave --------------------------------------------------------------------


@dataclass
class UncommittedRun:
    run_id: str
    stage: str | None
    alive: bool  # still running: not a leftover (yet)
    files: list[Path] = field(default_factory=list)
    marker: Path | None = None


def _dataset_files(data_dir: str | Path, poc: str) -> list[Path]:
    root = poc_dir(data_dir, poc)
    return sorted(root.glob("*/week=*/*.parquet"))


def uncommitted_runs(data_dir: str | Path, poc: str) -> list[UncommittedRun]:
    """Runs with files or a live marker but no commit record."""
    committed = committed_run_ids(data_dir, poc)
    runs: dict[str, UncommittedRun] = {}
    for record in live_markers(data_dir, poc):
        run_id = str(record["run_id"])
        if run_id not in committed:
            runs[run_id] = UncommittedRun(
                run_id, record.get("stage"), record["alive"], marker=Path(record["marker"])
            )
    for path in _dataset_files(data_dir, poc):
        run_id = run_id_of(path)
        if run_id is None or run_id in committed:
            continue
        runs.setdefault(run_id, UncommittedRun(run_id, None, alive=False)).files.append(path)
    return sorted(runs.values(), key=lambda r: r.run_id)


def clean_uncommitted(data_dir: str | Path, poc: str, dry_run: bool = False) -> list[Path]:
    """Delete what uncommitted runs that no longer run left (files and markers); never a
    committed run, never a live one. Returns what was (or would be) deleted."""
    removed: list[Path] = []
    for run in uncommitted_runs(data_dir, poc):
        if run.alive:
            continue
        for path in [*run.files, *([run.marker] if run.marker else [])]:
            removed.append(path)
            if not dry_run:
                path.unlink(missing_ok=True)
    return removed


def stale_tmp_files(data_dir: str | Path, poc: str) -> list[Path]:
    """Hidden temp files of killed writes: older than the start of every live run (a live
    run's own write may be in flight)."""
    # A live run whose start is unknown (another host's marker) protects every temp file.
    live = [float(m.get("started_epoch", 0)) for m in live_markers(data_dir, poc) if m["alive"]]
    cutoff = min(live, default=time.time())
    root = poc_dir(data_dir, poc)
    candidates = [*root.glob("*/week=*/.*.tmp"), *root.glob(f"{COMMITS}/.*.tmp")]
    return sorted(p for p in candidates if _TMP_FILE.match(p.name) and p.stat().st_mtime < cutoff)


def clean_stale_tmp(data_dir: str | Path, poc: str) -> list[Path]:
    stale = stale_tmp_files(data_dir, poc)
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


@dataclass(frozen=True, slots=True)
class CommittedStage(JsonForm):
    runs: int
    refused: int  # of them, refused by a gate
    last_committed_at: str


@dataclass(frozen=True, slots=True)
class LiveRun(JsonForm):
    run_id: str
    stage: str | None


@dataclass(frozen=True, slots=True)
class LeftRun(JsonForm):
    """A killed run's uncommitted files, which no reader takes."""

    run_id: str
    stage: str | None
    files: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DataStatus(JsonForm):
    """Where the PoC's data stands (`ckpt-poc status`)."""

    data_dir: str
    committed: Mapping[str, CommittedStage]  # stage → its committed runs
    running: tuple[LiveRun, ...]
    uncommitted: tuple[LeftRun, ...]
    stale_tmp_files: tuple[str, ...]


def status_summary(data_dir: str | Path, poc: str) -> DataStatus:
    """Where the PoC's data stands: committed runs per stage, runs in progress, what killed
    runs left (uncommitted files and markers) and stale temp files."""
    stages: dict[str, CommittedStage] = {}
    for record in committed_runs(data_dir, poc).values():
        stage = record.get("stage", "unknown")
        seen = stages.get(stage, CommittedStage(0, 0, ""))
        stages[stage] = CommittedStage(
            seen.runs + 1,
            seen.refused + (run_status(record) == "refused"),
            max(seen.last_committed_at, str(record.get("committed_at", ""))),
        )
    uncommitted = uncommitted_runs(data_dir, poc)
    return DataStatus(
        data_dir=str(poc_dir(data_dir, poc)),
        committed=dict(sorted(stages.items())),
        running=tuple(LiveRun(r.run_id, r.stage) for r in uncommitted if r.alive),
        uncommitted=tuple(
            LeftRun(r.run_id, r.stage, tuple(str(f) for f in r.files))
            for r in uncommitted
            if not r.alive
        ),
        stale_tmp_files=tuple(str(p) for p in stale_tmp_files(data_dir, poc)),
    )


def forget_if_empty(data_dir: str | Path, poc: str, run_id: str) -> bool:
    """A run that ended on an error before writing anything (a busy node, a workload that
    does not start) leaves nothing to report: drop its live marker. True if dropped."""
    if run_files(data_dir, poc, run_id):
        return False
    (poc_dir(data_dir, poc) / LIVE / f"{run_id}.json").unlink(missing_ok=True)
    return True
