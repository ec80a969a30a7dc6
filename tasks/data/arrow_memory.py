"""Which allocator Arrow uses while a stage holds multi-GB tables.

pyarrow's default pool in these wheels is mimalloc, which hands freed pages back to the kernel
and faults them in again on the next allocation of the same size; a columnar pipeline makes
hundreds of those, and on this VM a fresh page costs a host fault (its balloon takes free guest
pages back). The 5 M-row baseline spent 13.8 s of its 26.3 s in the kernel. jemalloc keeps
them a while (its decay) and reuses them. glibc's malloc is as fast in one thread, but with
Dask's threads its arenas hold on to what they freed: the 20 M-row Dask baseline peaked at
8,385 MiB with it, against 2,873 with mimalloc.

Measured on the bench dumps (2 cores, another benchmark running beside them), ours, seconds /
peak MiB:

=====================  ===========  ===========  ===========
pool                   mimalloc     glibc        jemalloc
=====================  ===========  ===========  ===========
5 M rows, in memory    26.3 / 2074  13.0–20.4 /  15.8–19.3 /
                                    2058–2115    1795
5 M rows, Dask path    33.7 / 2391  30.4 / 3937  19.3 / 2072
=====================  ===========  ===========  ===========
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pyarrow as pa


def _pool() -> pa.MemoryPool:
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        return pa.system_memory_pool()


@contextlib.contextmanager
def stage_allocator() -> Iterator[None]:
    """Arrow allocates from jemalloc inside (glibc's malloc where pyarrow lacks it); the
    previous pool is restored after, and arrays keep the pool they came from, so either frees
    them. An operator's own choice in ``ARROW_DEFAULT_MEMORY_POOL`` is left as it is."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        yield
        return
    previous = pa.default_memory_pool()
    pa.set_memory_pool(_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)
