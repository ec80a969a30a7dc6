"""Helpers the benchmarks share (imported as `benchlib`: bench scripts run from bench/)."""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path

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
    """This process's peak RSS (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
