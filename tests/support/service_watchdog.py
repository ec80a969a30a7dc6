"""Stop a test session's Slurm and Prefect services when the test run dies, however it dies.

    python tests/support/service_watchdog.py PID slurm DIR      (scripts/slurm-down --purge DIR)
    python tests/support/service_watchdog.py PID prefect DIR    (scripts/prefect-down DIR, then any
                                                         process still carrying its home)

The session fixtures start one watchdog per service *before* the service itself, in its own
session (so a signal to the test run's process group does not reach it), and disarm it with
SIGTERM once their own teardown has stopped the service. Until then it blocks on a pidfd of
PID (no polling, no sleeps): when PID is gone — a clean exit, Ctrl-C, SIGKILL, an OOM kill —
it stops what the run left.

:func:`start` is what the fixtures call; :func:`disarm` ends a watchdog without it acting.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
KINDS = ("slurm", "prefect")


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks): tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def wait_gone(pid: int, started: str | None) -> None:
    """Return once process ``pid`` (started at ``started``) has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:  # no pidfd (old kernel): watch /proc instead
        fd = None
    if fd is not None:
        try:
            # The pidfd is only readable once the process has exited; if it already had
            # when the pidfd was opened, the pid may be a new process: check its start time.
            if _start_time(pid) != started:
                return
            select.select([fd], [], [])
        finally:
            os.close(fd)
        return
    while _start_time(pid) == started:
        time.sleep(0.5)


def stop(kind: str, directory: Path) -> None:
    """Stop the services under ``directory`` as the fixtures' own teardown would."""
    if kind == "slurm":
        subprocess.run(
            [str(REPO / "scripts" / "slurm-down"), "--purge", str(directory)],
            check=False,
            timeout=180,
        )
    else:
        sys.path.insert(0, str(HERE))
        from prefect_server import PrefectStack

        PrefectStack(directory).down()


def start(kind: str, directory: Path, pid: int | None = None) -> subprocess.Popen:
    """A watchdog that stops ``kind``'s services under ``directory`` once ``pid`` (default:
    this process) is gone; its output goes to ``directory``/watchdog.log."""
    assert kind in KINDS, kind
    directory.mkdir(parents=True, exist_ok=True)
    target = os.getpid() if pid is None else pid
    with open(directory / "watchdog.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(target), kind, str(directory)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO,
        )


def disarm(proc: subprocess.Popen) -> None:
    """End a watchdog without it stopping anything (the caller did that itself)."""
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    proc.wait(timeout=30)


def main(argv: list[str]) -> int:
    pid, kind, directory = int(argv[0]), argv[1], Path(argv[2])
    started = _start_time(pid)
    # Disarmed with SIGTERM; SIGINT/SIGHUP of a terminal the run was started from must not
    # end it before it did its job.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    wait_gone(pid, started)
    # From here on even SIGTERM does not interrupt the clean-up.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"service-watchdog: pid {pid} is gone; stopping {kind} under {directory}", flush=True)
    stop(kind, directory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
