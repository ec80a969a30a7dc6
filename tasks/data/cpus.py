"""How many CPUs a stage may use, and the counts an operator sets for its threads and workers."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def usable_cpus() -> int:
    """The CPUs this process may run on (a job step's cgroup or taskset), not the machine's."""
    affinity = getattr(os, "sched_getaffinity", None)
    return max(1, len(affinity(0)) if affinity else (os.cpu_count() or 1))


def count_from_env(name: str) -> int | None:
    """The count set in the environment variable ``name`` (at least 1); None when it is unset.
    A value that is not a number is warned of, naming the variable, and read as 1."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return max(1, int(value))
    except ValueError:
        log.warning("%s=%r is not a number; using 1", name, value)
        return 1
