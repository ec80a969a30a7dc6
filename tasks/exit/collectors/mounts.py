"""``mounts``: every mount point (stacked ones numbered) with its type, source and options."""

from __future__ import annotations

from tasks.exit.collectors.base import Collector, Observation


def collect_mounts(col: Collector, obs: Observation) -> None:
    try:
        lines = col.path("/proc/self/mountinfo").read_text().splitlines()
    except OSError as exc:
        col.error("mounts:/proc/self/mountinfo", exc.strerror or exc)
        return
    for line in lines:
        left, _, right = line.partition(" - ")
        lf, rf = left.split(), right.split()
        point = lf[4].encode().decode("unicode_escape")
        key, n = point, 1
        while ("mounts", key) in col.items:  # stacked mounts on one point
            n += 1
            key = f"{point}#{n}"
        col.add(
            "mounts",
            key,
            {"fstype": rf[0], "source": rf[1], "options": lf[5], "super": rf[2:3]},
        )
