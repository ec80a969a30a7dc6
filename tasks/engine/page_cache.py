"""The kernel's page cache before a timed start (cold start, docs/design.md §4).

A warm cache flatters whichever side reads from it: a native start that finds its weights
and libraries in memory, a restore that finds its images there. So before each timed start
the clean page cache is dropped: all of it where the host allows (`/proc/sys/vm/drop_caches`,
root), else the files that start reads (`posix_fadvise(POSIX_FADV_DONTNEED)`: the caller's
files — weights, data, checkpoint images — and the interpreter's own binary and extension
libraries). Each timed row says which: ``page_cache`` is `dropped`, `warm` (the plan asked
for a warm run) or `not_allowed` (neither drop could be made); ``page_cache_drop`` is
`global` or `files`.

Light on purpose: a Slurm job's wrapper (tasks/engine/clusters/slurm/job.py) drops it on the
node inside the job, before its own first event.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

DROP_CACHES = Path("/proc/sys/vm/drop_caches")
MAX_FILES = 50_000  # a walk that finds more stops there (a stray huge folder)


@dataclass(frozen=True)
class CacheState:
    state: str  # one of tasks.data.page_cache.PAGE_CACHE_STATES
    drop: str | None = None  # one of PAGE_CACHE_DROPS when dropped
    files: int = 0  # files advised, for a `files` drop


def _walk(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_file():
            yield path
        elif path.is_dir():
            for root, _dirs, names in os.walk(path):
                for name in names:
                    yield Path(root) / name


def interpreter_files() -> list[Path]:
    """The interpreter's binary and the shared libraries its start maps: what a Python
    workload's start reads besides its own files."""
    paths = {Path(sys.executable).resolve()}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        folder = Path(sysconfig.get_paths()[key])
        paths |= {p for p in _walk([folder]) if p.suffix == ".so" or ".so." in p.name}
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir:
        paths |= set(Path(libdir).glob("libpython*.so*"))
    return sorted(paths)


def advise_dontneed(paths: Iterable[Path]) -> int:
    """POSIX_FADV_DONTNEED on every file under ``paths``; how many were advised."""
    advised = 0
    for n, path in enumerate(_walk(paths)):
        if n >= MAX_FILES:
            break
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # gone, a socket, unreadable: nothing of ours to drop
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            advised += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return advised


def drop_page_cache(files: Iterable[Path] = ()) -> CacheState:
    """Drop the clean page cache: all of it where the host allows, else that of ``files``
    (and the interpreter's); `not_allowed` when neither could be done."""
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
        return CacheState("dropped", "global")
    except OSError:
        pass
    advised = advise_dontneed([*files, *interpreter_files()])
    return CacheState("dropped", "files", advised) if advised else CacheState("not_allowed")


def prepare_cache(condition: str, files: Iterable[Path] = ()) -> CacheState:
    """The page cache as the plan's condition asks before a timed start: `warm` leaves it
    as it is; `dropped` drops it."""
    if condition == "warm":
        return CacheState("warm")
    return drop_page_cache(files)


READ_CHUNK = 16 << 20


def read_all(files: Iterable[Path]) -> int:
    """Every byte of ``files``, READ_CHUNK at a time into one buffer (no copy kept)."""
    total, buf = 0, bytearray(READ_CHUNK)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                total += n
    return total


def raw_read(files: list[Path], condition: str) -> tuple[float, int]:
    """Seconds and bytes to read ``files`` end to end with the page cache as a restore of
    them found it (``condition``: `warm` reads them once untimed; `dropped` drops them): the
    physical limit a restore that reads the same bytes can approach."""
    if condition == "warm":
        read_all(files)
    else:
        drop_page_cache(files)
    t0 = time.perf_counter()
    total = read_all(files)
    return time.perf_counter() - t0, total
