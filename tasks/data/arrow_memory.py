"""Which allocator Arrow uses while a stage holds multi-GB tables.

pyarrow's bundled pool (mimalloc in these wheels) returns freed pages to the kernel and
faults them back in on the next allocation of the same size, which a columnar pipeline makes
hundreds of times: the 5 M-row baseline spent 13.8 s of its 26.3 s in the kernel. glibc's
malloc reuses them. Measured on the 5 M-row bench dump (2 cores): 26.3 s → 16.4 s, peak
2,074 → 1,934 MiB, system time 13.8 s → 4.6 s.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pyarrow as pa


@contextlib.contextmanager
def system_allocator() -> Iterator[None]:
    """Arrow allocates from glibc's malloc inside; the previous pool is restored after (arrays
    keep the pool they came from, so either can free them). An operator's own choice in
    ``ARROW_DEFAULT_MEMORY_POOL`` is left as it is."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        yield
        return
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)
