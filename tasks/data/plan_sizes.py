"""What a plan's ``prepare`` steps will write, against what the node can hold.

A weights file the node's disk cannot take fails its prepare step after minutes of writing;
one its memory cannot hold twice (the comparisons run both arms at once, and each copy
reads the whole file) swaps or is killed mid-trial. Both are bad input, said by `plan check`
naming the prepare item and the node's figure. The sizes read here are the shipped
examples' (``python -m examples.weights FILE --mb N``); a site's own prepare commands say no
size the plan could read, and are not checked. Only a local plan's node is this machine: a
Slurm or Kubernetes plan's nodes are not looked at from here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil

WEIGHTS_MODULE = "examples.weights"
WEIGHTS_DEFAULT_MB = 256.0  # examples/weights.py's --mb default
ARMS_AT_ONCE = 2  # the comparisons' managed and unmanaged copies run side by side
MIB = 1 << 20
GIB = 1 << 30


def weights_mb(argv: list[str]) -> float | None:
    """The MiB an ``examples.weights`` prepare command writes; None for any other command
    (or a size it cannot read: the command itself then refuses it)."""
    if WEIGHTS_MODULE not in argv or argv.index(WEIGHTS_MODULE) == 0:
        return None
    if argv[argv.index(WEIGHTS_MODULE) - 1] != "-m":
        return None
    for i, word in enumerate(argv):
        value = argv[i + 1] if word == "--mb" and i + 1 < len(argv) else None
        if word.startswith("--mb="):
            value = word.split("=", 1)[1]
        if value is not None:
            try:
                return float(value)
            except ValueError:
                return None
    return WEIGHTS_DEFAULT_MB


def available_memory() -> int:
    """MemAvailable, bytes."""
    return psutil.virtual_memory().available


def free_disk(folder: str | Path) -> tuple[int, Path]:
    """Free bytes on the file system ``folder`` will be on (its nearest existing parent)."""
    where = Path(folder).resolve()
    while not where.exists():
        where = where.parent
    return shutil.disk_usage(where).free, where


def size_problems(
    prepares: list[tuple[str, list[str]]],
    data_dir: str,
    *,
    disk: tuple[int, Path] | None = None,
    memory: int | None = None,
) -> list[str]:
    """``field: message`` for each prepare item (``(field, argv)``) whose weights the data
    dir's disk or the node's memory cannot hold; ``disk`` and ``memory`` default to this
    machine's figures."""
    disk = disk or free_disk(data_dir)
    memory = available_memory() if memory is None else memory
    problems = []
    for field, argv in prepares:
        mb = weights_mb(argv)
        if mb is None:
            continue
        size = mb * MIB
        if size > disk[0]:
            problems.append(
                f"{field}: --mb {mb:g} writes {size / GIB:.1f} GiB of weights; the disk of "
                f"data_dir ({disk[1]}) has {disk[0] / GIB:.1f} GiB free"
            )
        if memory is not None and ARMS_AT_ONCE * size > memory:
            problems.append(
                f"{field}: --mb {mb:g}: each copy reads {size / GIB:.1f} GiB of weights and "
                f"the comparisons run {ARMS_AT_ONCE} at once ({ARMS_AT_ONCE * size / GIB:.1f} "
                f"GiB); the node has {memory / GIB:.1f} GiB available (MemAvailable)"
            )
    return problems
