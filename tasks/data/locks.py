"""One experiment at a time on a node: two runs on the same slots would time each other's load.

Every experiment holds the plan's nodes (local slots or Slurm test nodes) for as long as it
runs: one lock file per node in a folder shared by every run on this host, held with
``flock``. The kernel releases a flock when its holder's process ends, however it ends, so
a killed run never leaves a node locked. A second run waits, saying for whom, or refuses
at once (``wait=False``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tasks.data.errors import CkptPocError
from tasks.data.settings import env_name, settings

LOCK_DIR_ENV = env_name("lock_dir")
WAIT_NOTICE_S = 30  # how often a waiting run says again what it waits for


class NodesBusy(CkptPocError):
    """A node the run needs is held by another experiment (and the run would not wait)."""


def lock_dir() -> Path:
    return settings().lock_dir


def _lock_path(cluster_kind: str, node: str) -> Path:
    # Plan node names are checked to be plain names (tasks.data.plan): safe as file names.
    return lock_dir() / f"{cluster_kind}-{node}.lock"


def holder_of(path: Path) -> str:
    """Who holds a node, as its holder wrote it."""
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "another run (unknown)"
    return (
        f"{info.get('stage', '?')} run {info.get('run_id', '?')} of PoC {info.get('poc', '?')} "
        f"(pid {info.get('pid', '?')}, since {info.get('since', '?')})"
    )


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


@contextlib.contextmanager
def hold_nodes(
    cluster_kind: str,
    nodes: list[str],
    *,
    poc: str,
    run_id: str,
    stage: str,
    wait: bool = True,
    timeout_s: float | None = None,
    notify: Callable[[str], None] = lambda message: None,
    poll_s: float = 0.2,
) -> Iterator[None]:
    """Hold every node (in a fixed order, so two runs never deadlock) while the block runs."""
    lock_dir().mkdir(parents=True, exist_ok=True)
    held: list[int] = []
    try:
        for node in sorted(set(nodes)):
            path = _lock_path(cluster_kind, node)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            started = time.monotonic()
            told = -WAIT_NOTICE_S
            while not _try_lock(fd):
                waited = time.monotonic() - started
                if not wait or (timeout_s is not None and waited >= timeout_s):
                    os.close(fd)
                    raise NodesBusy(
                        f"node {node} is held by {holder_of(path)}"
                        + (f"; waited {waited:.0f} s" if wait else "; not waiting (--no-wait)")
                    )
                if waited - told >= WAIT_NOTICE_S:
                    notify(f"waiting for node {node}: held by {holder_of(path)}")
                    told = waited
                time.sleep(poll_s)
            held.append(fd)
            record = {
                "poc": poc,
                "run_id": run_id,
                "stage": stage,
                "pid": os.getpid(),
                "since": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
        yield
    finally:
        for fd in held:
            # The record stays for the curious; the lock itself goes with the descriptor.
            os.close(fd)
