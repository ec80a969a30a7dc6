"""Dropping the kernel's clean page cache before a timed start (cold start, DESIGN §4).

Light on purpose: a Slurm job's wrapper (tasks/engine/clusters/slurm/job.py) drops it on the node
inside the job, before its own first event.
"""

from __future__ import annotations

import os
from pathlib import Path

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_page_cache() -> str:
    """'dropped' when the kernel's clean page cache was dropped, else 'warm' (not root, or
    a host that refuses it)."""
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
    except OSError:
        return "warm"
    return "dropped"
