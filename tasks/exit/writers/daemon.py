"""Starting and stopping the writer recorder on the node it watches, as a root service that
outlives the command that starts it.

On Slurm this module runs on each install node as a job step (the install's path: ``srun``
pinned to the node), right after the ``before_install`` snapshot and after the recheck; the
recorder it starts must not belong to that step, or the step's end would end it and a
running recorder would hold the node against the comparisons' ``--exclusive`` jobs. So:

- with systemd (``/run/systemd/system``): a transient unit ``ckpt-poc-writers-<poc>.service``
  (``systemd-run --collect``: gone once stopped, even if it failed);
- without: its own session (out of the step's process group, which proctrack/pgid kills),
  and on cgroup v2 moved out of a Slurm job's cgroup into the root one (proctrack/cgroup
  kills a step's cgroup).

Locally the harness calls :func:`start` and :func:`stop` itself. Its process, unit and
files are the PoC's known footprint: the process and unit are allowed changes
(tasks/exit/writers/service.py), its log lives in the PoC's data folder, and :func:`stop`
checks that the process and unit are gone.

    python -m tasks.exit.writers.daemon start SPEC.json   # prints {"pid", "how"}
    python -m tasks.exit.writers.daemon stop FOLDER       # prints {"stopped", "how", "left"}
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tasks.data.jsonform import JsonForm
from tasks.engine.paths import mount_point
from tasks.exit.writers.lineage import cgroup_of
from tasks.exit.writers.recorder import LOG_NAME

PID_NAME = "recorder.pid"
HOW_NAME = "recorder.how"
UNIT_PREFIX = "ckpt-poc-writers-"
START_TIMEOUT_S = 20.0  # until its marks are placed: the install may start after that
STOP_TIMEOUT_S = 20.0
REPO = Path(__file__).resolve().parents[3]
SYSTEMD_RUN_DIR = Path("/run/systemd/system")
_SLURM_CGROUP = re.compile(r"/job_\d+(/|$)")
CGROUP2_MOUNTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")


def unit_name(poc: str) -> str:
    return f"{UNIT_PREFIX}{poc}.service"


def recorder_argv(spec_path: Path) -> list[str]:
    return [sys.executable, "-m", "tasks.exit.writers.recorder", str(spec_path)]


def systemd_run_argv(unit: str, spec_path: Path) -> list[str]:
    """The transient unit that runs the recorder where systemd manages the node."""
    return [
        "systemd-run",
        f"--unit={unit}",
        "--collect",  # unloaded once stopped, failed or not: nothing left in systemd
        "--quiet",
        f"--setenv=PYTHONPATH={REPO}",
        "--property=KillMode=mixed",
        "--",
        *recorder_argv(spec_path),
    ]


def uses_systemd() -> bool:
    return SYSTEMD_RUN_DIR.is_dir() and shutil.which("systemd-run") is not None


def _cgroup2_root() -> str | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or …/unified when hybrid)."""
    for folder in CGROUP2_MOUNTS:
        mounted, fstype = mount_point(folder)
        if mounted == folder and fstype == "cgroup2":
            return folder
    return None


def _leave_job_cgroup(pid: int) -> str:
    """Move ``pid`` out of a Slurm job's cgroup (v2) into the root one; say what was done."""
    cgroup = cgroup_of(pid)
    if cgroup is None or not _SLURM_CGROUP.search(cgroup):
        return "its own session"
    root = _cgroup2_root()
    if root is None:
        return f"its own session (in {cgroup}: no cgroup2 mount to leave it by)"
    try:
        (Path(root) / "cgroup.procs").write_text(f"{pid}\n")
    except OSError as exc:
        return f"its own session (still in {cgroup}: {exc})"
    return f"its own session, moved out of {cgroup}"


@dataclass(frozen=True, slots=True)
class RecorderStarted(JsonForm):
    """A recorder started: its pid, how it runs, whether its first flush came; where
    fanotify could not be had, why (the whole span is then a gap)."""

    _OMIT_NONE = ("unavailable",)

    pid: int
    how: str
    started: bool
    unavailable: str | None = None

    @classmethod
    def from_json(cls, answer: dict[str, Any]) -> RecorderStarted:
        return cls(
            int(answer.get("pid", 0)),
            str(answer.get("how", "")),
            bool(answer.get("started", False)),
            answer.get("unavailable"),
        )


@dataclass(frozen=True, slots=True)
class RecorderStopped(JsonForm):
    """A recorder stopped (False: no pid file, nothing to stop); ``left``: what is still
    there after the stop."""

    stopped: bool
    how: str | None
    left: list[str]

    @classmethod
    def from_json(cls, answer: dict[str, Any]) -> RecorderStopped:
        return cls(bool(answer.get("stopped", False)), answer.get("how"), answer.get("left", []))


def start(spec_path: Path) -> RecorderStarted:
    """Start the recorder of ``spec_path`` detached; wait for its first flush (its marks
    placed); return its pid and how it runs."""
    spec = json.loads(spec_path.read_text())
    folder = Path(spec["out"])
    stop(folder)  # one an earlier run left: its log is replaced
    if spec.get("harness_host") not in (None, socket.gethostname()):
        spec["poc_pids"] = []  # the harness's pids are another host's
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOG_NAME).unlink(missing_ok=True)
    spec_path.write_text(json.dumps(spec))
    unit = spec.get("unit")
    if unit and uses_systemd():
        done = subprocess.run(systemd_run_argv(unit, spec_path), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"systemd-run exited {done.returncode}: {done.stderr.strip()}")
        shown = subprocess.run(
            ["systemctl", "show", "--property=MainPID", "--value", unit],
            capture_output=True,
            text=True,
        )
        pid, how = int(shown.stdout.strip() or 0), f"systemd:{unit}"
    else:
        with open(folder / "recorder.log", "ab") as errors:
            proc = subprocess.Popen(
                recorder_argv(spec_path),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                start_new_session=True,  # outlives the step or stage that started it
                cwd=str(REPO),
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)},
            )
        pid, how = proc.pid, _leave_job_cgroup(proc.pid)
    (folder / PID_NAME).write_text(str(pid))
    (folder / HOW_NAME).write_text(how)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (folder / LOG_NAME).exists() and time.monotonic() < deadline:
        if not _not_zombie(pid):  # gone (not `alive`: its exec may not have happened yet)
            break
        time.sleep(0.05)
    return RecorderStarted(pid, how, (folder / LOG_NAME).exists())


def alive(pid: int) -> bool:
    """``pid`` runs and is a recorder (not a pid reused since)."""
    if pid <= 0:
        return False
    try:
        argv = psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):  # gone, or a zombie (ZombieProcess)
        return False
    return any("tasks.exit.writers.recorder" in word for word in argv) and _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    """``pid`` exists and is not a zombie (a dead one, state X, still counts)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError, ValueError):  # gone, or not a pid at all
        return False


def stop(folder: Path) -> RecorderStopped:
    """Stop the recorder whose pid file is in ``folder`` (SIGTERM: it flushes and ends;
    SIGKILL after STOP_TIMEOUT_S) and check it is gone: ``left`` names what is not."""
    how = (folder / HOW_NAME).read_text() if (folder / HOW_NAME).exists() else None
    try:
        pid = int((folder / PID_NAME).read_text())
    except (OSError, ValueError):
        return RecorderStopped(False, how, [])
    if how and how.startswith("systemd:"):
        subprocess.run(["systemctl", "stop", how.split(":", 1)[1]], capture_output=True)
    elif alive(pid):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    with contextlib.suppress(ChildProcessError):  # reap it where it is our child (local)
        os.waitpid(pid, os.WNOHANG)
    left = [f"process {pid}"] if alive(pid) else []
    if how and how.startswith("systemd:"):
        shown = subprocess.run(
            ["systemctl", "show", "--property=LoadState", "--value", how.split(":", 1)[1]],
            capture_output=True,
            text=True,
        )
        if shown.stdout.strip() not in ("", "not-found"):
            left.append(f"unit {how.split(':', 1)[1]} ({shown.stdout.strip()})")
    (folder / PID_NAME).unlink(missing_ok=True)
    (folder / HOW_NAME).unlink(missing_ok=True)
    return RecorderStopped(True, how, left)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2 or args[0] not in ("start", "stop"):
        print("usage: python -m tasks.exit.writers.daemon start SPEC|stop FOLDER", file=sys.stderr)
        return 2
    path = Path(args[1])
    result = start(path) if args[0] == "start" else stop(path)
    print(json.dumps(result.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
