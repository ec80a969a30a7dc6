"""Live sacct: ``sacct -a -D -P --noheader --format=SACCT_FIELDS`` over day-sized chunks, in UTC."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from collections.abc import Sequence

from tasks.baseline.dump_layout import SACCT_FIELDS
from tasks.data.errors import AccountingError


def sacct_argv(start: dt.datetime, end: dt.datetime, clusters: Sequence[str] = ()) -> list[str]:
    """The sacct command for [start, end): all users, duplicates kept, parsable, no header."""
    argv = [
        "sacct",
        "-a",
        "-D",
        "-P",
        "--noheader",
        f"--format={','.join(SACCT_FIELDS)}",
        "-S",
        start.strftime("%Y-%m-%dT%H:%M:%S"),
        "-E",
        end.strftime("%Y-%m-%dT%H:%M:%S"),
    ]
    if clusters:
        argv += ["-M", ",".join(clusters)]
    return argv


def day_chunks(start: dt.datetime, end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime]]:
    """[start, end) cut into consecutive spans of at most one day."""
    chunks = []
    t = start
    while t < end:
        nxt = min(t + dt.timedelta(days=1), end)
        chunks.append((t, nxt))
        t = nxt
    return chunks


def run_sacct_live(
    start: dt.datetime, end: dt.datetime, clusters: Sequence[str] = (), timeout_s: float = 300
) -> bytes:
    """Live sacct over [start, end) in day-sized chunks, in UTC, as one header-less dump.

    A job that spans chunks is reported by each; the exact duplicates are dropped later.
    """
    # Standard times whatever SLURM_TIME_FORMAT the caller's environment sets.
    env = {**os.environ, "TZ": "UTC", "SLURM_TIME_FORMAT": "standard"}
    out = []
    for a, b in day_chunks(start, end):
        argv = sacct_argv(a, b, clusters)
        try:
            done = subprocess.run(
                argv, capture_output=True, env=env, timeout=timeout_s, check=False
            )
        except FileNotFoundError as exc:
            raise AccountingError("sacct is not on PATH: is this a Slurm client host?") from exc
        except subprocess.TimeoutExpired as exc:
            raise AccountingError(f"sacct timed out after {timeout_s}s for {a}..{b}") from exc
        if done.returncode != 0:
            raise AccountingError(
                f"sacct exited {done.returncode} for {a:%Y-%m-%d}: "
                f"{done.stderr.decode(errors='replace').strip()[-500:]}"
            )
        out.append(done.stdout)
    return b"".join(out)
