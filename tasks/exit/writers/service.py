"""Running the writer recorder (tasks/exit/writers/recorder.py) around the way out, and
reading what it recorded.

Locally it is a process of the harness's, started right after the ``before_install``
snapshot and stopped after the ``after_uninstall`` recheck: one per machine (a local plan's
nodes are this one machine), its log under ``DATA_DIR/POC/writers/``. It runs in its own
session, so a stage that ends does not end it; its pid file says which process to stop, and
a recorder found dead at the stop turns the span since its last flush into a gap. On
Slurm the recorder is not started yet (the exit diff then attributes as before, and says
so): it is to be a root service on each install node, started through the install's path.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.data.plan import AllowedChange, Plan
from tasks.exit.writers.recorder import LOG_NAME

PID_NAME = "recorder.pid"
# The recorder's own process, its known footprint: listed as allowed, never residue (it runs
# from the before_install snapshot to the recheck, then stop_recorder ends it).
RECORDER_ALLOWED = AllowedChange(
    kind="processes",
    key="*",
    argv="* -m tasks.exit.writers.recorder *",
    why="the writer recorder's own process, stopped after the recheck",
)
START_TIMEOUT_S = 20.0  # until its marks are placed: the install may start after that
STOP_TIMEOUT_S = 20.0
LOCAL_HOST = "local"  # a local plan's nodes' one machine


def recorder_folder(plan: Plan, host: str = LOCAL_HOST) -> Path:
    return Path(plan.data_dir).resolve() / plan.poc / "writers" / host


@dataclass(frozen=True)
class WriterLog:
    """What one recorder recorded: its rows, its gaps (the recorder's own end one included
    when it died), the file systems it marked, and whether it ran at all."""

    host: str
    rows: list[dict[str, Any]]
    gaps: list[dict[str, Any]]
    marked: list[str]
    started_at: str | None

    @classmethod
    def read(cls, folder: Path, host: str) -> WriterLog | None:
        try:
            log = json.loads((folder / LOG_NAME).read_text())
        except (OSError, ValueError):
            return None
        gaps = list(log.get("gaps", []))
        if not log.get("stopped"):
            gaps.append(
                {
                    "t_from": log.get("flushed_at"),
                    "t_to": None,
                    "reason": "the recorder was not running: its log ends at its last flush",
                }
            )
        return cls(host, log.get("rows", []), gaps, log.get("marked", []), log.get("started_at"))


def start_recorder(plan: Plan, skip: list[str], poc_folders: list[str]) -> Path | None:
    """Start this machine's recorder (a local plan only; None elsewhere): ``skip`` the
    folders it never records (the PoC's own, /proc, /sys), ``poc_folders`` where an
    executable is the PoC's."""
    if plan.cluster.kind != "local":
        return None
    folder = recorder_folder(plan)
    stop_recorder(plan)  # a recorder an earlier run left: its log is replaced
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOG_NAME).unlink(missing_ok=True)
    spec = {
        "node": LOCAL_HOST,
        "out": str(folder),
        "paths": list(plan.exit.watch.paths),
        "skip": skip,
        "poc_folders": poc_folders,
        "poc_pids": [os.getpid()],
    }
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tasks.exit.writers.recorder", str(spec_path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(folder / "recorder.log", "ab"),  # noqa: SIM115 (the child holds it)
        start_new_session=True,  # outlives the stage that started it
        cwd=str(Path(__file__).resolve().parents[3]),
    )
    (folder / PID_NAME).write_text(str(proc.pid))
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (folder / LOG_NAME).exists():  # its first flush: marks placed
        if proc.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"tasks.exit.writers.recorder" in fh.read()
    except OSError:
        return False


def stop_recorder(plan: Plan) -> WriterLog | None:
    """Stop this machine's recorder (SIGTERM: it flushes and ends) and read its log; None
    when no recorder ran for the plan."""
    folder = recorder_folder(plan)
    pid_file = folder / PID_NAME
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return WriterLog.read(folder, LOCAL_HOST)
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):  # reap it when it is our child
        os.waitpid(pid, os.WNOHANG)
    pid_file.unlink(missing_ok=True)
    return WriterLog.read(folder, LOCAL_HOST)
