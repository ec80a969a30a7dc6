"""How many CPUs a stage may use (the counts an operator sets for its threads and workers are
settings: tasks/data/settings.py)."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on (a job step's cgroup or taskset), not the machine's."""
    affinity = getattr(os, "sched_getaffinity", None)
    return max(1, len(affinity(0)) if affinity else (os.cpu_count() or 1))
