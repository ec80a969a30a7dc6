"""Helpers the benchmarks share (imported as `benchlib`: bench scripts run from bench/)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def code_version(*paths: str) -> str:
    """HEAD's short sha, and '+dirty' when ``paths`` differ from it (what the run measured)."""

    def git(*args: str) -> str:
        try:
            out = subprocess.run(
                ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    sha = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", *paths)
    return f"{sha}+dirty" if dirty else sha


def self_peak_mib() -> float:
    """This process's own peak RSS: the kernel's VmHWM for its address space.

    Not ru_maxrss: Linux carries that across fork and exec, so a child spawned by a bench
    that had just generated a 4 GB dump reported the parent's peak as its own (measured: a
    child of a parent that touched 1.5 GB read ru_maxrss 1,514 MiB, VmHWM 13 MiB).
    ru_maxrss (KiB on Linux) only where /proc is not there.
    """
    hwm = proc_mib("/proc/self/status", "VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def proc_mib(path: str, key: str) -> float | None:
    """A ``key: N kB`` line of a /proc file (status, meminfo) in MiB; None if absent."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith(f"{key}:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def write_record(folder: Path, name: str, stamp: dt.datetime, record: dict[str, Any]) -> Path:
    """The run's JSON record, ``<name>-<stamp>.json`` under ``folder``, written atomically:
    every run is kept, never only the best."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{stamp:%Y%m%dT%H%M%S}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, default=str, indent=1))
    os.replace(tmp, path)
    return path


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def tree_rss(proc: Any) -> int:
    """RSS bytes of a psutil process and all its descendants (0 once it is gone)."""
    import psutil

    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process, its reaped children and its
    live descendants (a worker process a contender started and has not waited for yet)."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            c = child.cpu_times()
            total += c.user + c.system
    return total


def run_polled(
    cmd: list[str], log_file: Path, env: dict[str, str] | None = None
) -> tuple[int, float, int]:
    """Run a contender, its output to ``log_file``, polling its process tree's RSS every
    50 ms: (exit code, wall seconds, polled peak RSS bytes)."""
    import psutil

    started = time.perf_counter()
    with open(log_file, "wb") as log:
        proc = psutil.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        polled = 0
        while proc.poll() is None:
            polled = max(polled, tree_rss(proc))
            time.sleep(0.05)
    return proc.returncode, time.perf_counter() - started, polled
