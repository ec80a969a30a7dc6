"""``cron``: crontabs, cron folders, anacrontab and systemd timers, hashed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tasks.exit.collectors.base import Collector, Observation
from tasks.exit.collectors.fs import hash_files, sha256_file
from tasks.exit.collectors.units import unit_entries


def collect_cron(col: Collector, obs: Observation) -> None:
    found: list[Path] = [col.path("/etc/crontab")]
    for pattern in ("/etc/cron.*/*", "/var/spool/cron/crontabs/*", "/etc/anacrontab"):
        found += sorted(col.root.glob(pattern.lstrip("/")))
    hash_files(col, "cron", found)
    for path, st in unit_entries(col):
        if path.endswith(".timer") and not stat.S_ISDIR(st.st_mode):
            key = "timer:" + path[len(str(col.root).rstrip("/")) :]
            if stat.S_ISLNK(st.st_mode):
                col.add("cron", key, {"link": os.readlink(path)})
            else:
                try:
                    col.add("cron", key, {"sha256": sha256_file(path)})
                except OSError as exc:
                    col.error(f"cron:{key}", exc.strerror or exc)
