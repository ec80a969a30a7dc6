"""``units``: systemd unit files and links (dangling ones marked) and, under systemd, states."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from tasks.data.errors import CkptPocError
from tasks.exit.collectors.base import Collector, Observation, run_command
from tasks.exit.collectors.fs import sha256_file, walk

UNIT_DIRS = ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")


def unit_entries(col: Collector) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry of the unit folders (timers too: the cron kind reads them)."""
    seen: set[str] = set()
    for folder in UNIT_DIRS:
        real = os.path.realpath(col.path(folder))
        if real in seen:  # /lib → /usr/lib on a merged-/usr system: one walk
            continue
        seen.add(real)
        yield from walk(str(col.path(folder)), [], col)


def _pid1_is_systemd(col: Collector) -> tuple[bool, str]:
    try:
        comm = col.path("/proc/1/comm").read_text().strip()
    except OSError as exc:
        return False, f"unreadable ({exc.strerror})"
    return comm == "systemd", comm


def collect_units(col: Collector, obs: Observation) -> None:
    for path, st in unit_entries(col):
        if stat.S_ISDIR(st.st_mode):
            continue
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(path)
            resolved = os.path.join(os.path.dirname(path), target)
            # Enabled units and masks are symlinks: one whose target is gone is a leftover
            # of a unit deleted without `systemctl disable`.
            dangling = target != "/dev/null" and not os.path.exists(resolved)
            col.add("units", path, {"link": target, "dangling": dangling})
        elif stat.S_ISREG(st.st_mode):
            try:
                col.add("units", path, {"sha256": sha256_file(path)})
            except OSError as exc:
                col.error(f"units:{path}", exc.strerror or exc)
    systemd, pid1 = _pid1_is_systemd(col)
    if not systemd or col.root != Path("/"):
        col.excluded(
            "units:active",
            f"systemd is not PID 1 here (PID 1 is {pid1!r}): active states are not observable",
        )
        return
    try:
        out = run_command(
            ["systemctl", "list-units", "--all", "--no-legend", "--plain", "--no-pager"]
        )
    except CkptPocError as exc:
        col.error("units:active", exc)
        return
    for line in out.splitlines():
        parts = line.split(None, 4)
        if len(parts) >= 4:
            col.add("units", f"active:{parts[0]}", {"load": parts[1], "active": parts[2:4]})
