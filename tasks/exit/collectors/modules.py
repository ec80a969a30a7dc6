"""``modules``: the loaded kernel modules (/proc/modules)."""

from __future__ import annotations

from tasks.exit.collectors.base import Collector, Observation


def collect_modules(col: Collector, obs: Observation) -> None:
    try:
        text = col.path("/proc/modules").read_text()
    except FileNotFoundError:
        col.excluded("modules", "no /proc/modules: the kernel has no loadable modules")
        return
    except OSError as exc:
        col.error("modules:/proc/modules", exc.strerror or exc)
        return
    for line in text.splitlines():
        if line.strip():
            col.add("modules", line.split()[0], "loaded")
