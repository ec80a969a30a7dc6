"""``ldconfig``: the dynamic linker's configuration files and, on this machine, its cache."""

from __future__ import annotations

from pathlib import Path

from tasks.data.errors import CkptPocError
from tasks.exit.collectors.base import Collector, Observation, run_command
from tasks.exit.collectors.fs import hash_files


def collect_ldconfig(col: Collector, obs: Observation) -> None:
    hash_files(
        col,
        "ldconfig",
        [col.path("/etc/ld.so.conf"), *sorted(col.root.glob("etc/ld.so.conf.d/*"))],
    )
    if col.root != Path("/"):
        col.excluded("ldconfig:cache", "ldconfig -p reads this machine's cache, not the root's")
        return
    try:
        out = run_command(["ldconfig", "-p"])
    except CkptPocError as exc:
        col.error("ldconfig:cache", exc)
        return
    libs: dict[str, list[str]] = {}
    for line in out.splitlines()[1:]:
        name, sep, path = line.strip().partition(" => ")
        if sep:
            libs.setdefault(name, []).append(path)
    for name, paths in libs.items():
        col.add("ldconfig", name, sorted(paths))
