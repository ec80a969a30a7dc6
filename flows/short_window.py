"""The demo's short window: `ckpt-poc sample` in its own process while the comparisons run.

A real PoC samples its test nodes for months on the window's schedules. The demo cannot wait
that long, so `poc(..., short_window=True)` (scripts/demo, the `poc/demo` deployment) samples
the test nodes beside the stages that run both arms (recovery, overhead, cold start), exactly
as a scheduled span would, and stops the span when they are done: SIGTERM ends a span early,
written and committed (tasks/sampling). What it sampled is a few minutes, said as such.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

# Longer than the stages it watches take here (about 3 min); SIGTERM ends it when they end.
SPAN_S = 1800
INTERVAL_S = 1.0
REPO = Path(__file__).resolve().parent.parent


def start_sampler(plan_path: str) -> subprocess.Popen[bytes]:
    """One sampler span of every test node, in its own process (argv, no shell)."""
    argv = [
        sys.executable,
        "-m",
        "cli",
        "sample",
        str(Path(plan_path).resolve()),
        "--span-s",
        str(SPAN_S),
        "--interval-s",
        str(INTERVAL_S),
    ]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, cwd=REPO)


def stop_sampler(sampler: subprocess.Popen[bytes]) -> str | None:
    """End the span (written and committed); returns a warning when it did not end well."""
    if sampler.poll() is None:
        sampler.terminate()
    try:
        code = sampler.wait(timeout=60)
    except subprocess.TimeoutExpired:
        sampler.kill()
        code = sampler.wait()
    if code == -signal.SIGTERM:  # stopped while it was still starting: nothing to write
        return "the sampler was stopped before its first read"
    if code != 0:
        return f"the sampler ended with exit code {code}"
    return None
