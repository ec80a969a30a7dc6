"""Helpers the benchmarks share (imported as `benchlib`: bench scripts run from bench/)."""

from __future__ import annotations

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
