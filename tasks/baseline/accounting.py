"""Slurm accounting (sacct) → parsed, pseudonymised job rows plus a quarantine.

Inputs: live ``sacct`` (UTC, ``-a -D -P --noheader --format=SACCT_FIELDS``, day-sized chunks),
a ``sacct -P``/``--parsable`` dump with or without a header, or ``sacct --json``. Every one
becomes a ``-P`` byte stream that ``parse_sacct_stream`` reads block by block.

This module is the entry point the rest of ckpt-poc calls; the work is done, one reason to
change each, by:

- ``dump_layout``: which fields a dump has, in which order, on which delimiter (header or
  ``--format``), and which measures those fields allow;
- ``fields``: what one value (or one column) of a field means: dates, durations, TRES/GRES,
  states, exit codes;
- ``blocks``: one newline-aligned block → job rows, with pyarrow's multithreaded CSV reader
  and vectorised Arrow compute; ``quarantine``: the rows that cannot be parsed, never dropped
  (``rows_read == parsed + quarantined`` always holds); ``pseudonym``: identities as keyed
  tokens;
- ``source_files`` (text dumps and ``sacct --json`` files) and ``source_sacct`` (live sacct).
"""

from __future__ import annotations

import datetime as dt
import io
import mmap
import os
import stat
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from tasks.baseline.blocks import JOB_COLUMNS, ParsedBlock, parse_block
from tasks.baseline.dump_layout import (
    GPU_SOURCE_LABELS,
    GPU_SOURCES,
    SACCT_FIELDS,
    detect_layout,
    not_computed,
)
from tasks.baseline.fields import parse_tres
from tasks.baseline.pseudonym import KEY_ENV, Pseudonymiser, load_pseudonym_key
from tasks.baseline.quarantine import Quarantined
from tasks.baseline.source_files import open_source
from tasks.baseline.source_sacct import run_sacct_live
from tasks.baseline.time_formats import detect_dump_time_formats
from tasks.data.cpus import usable_cpus
from tasks.data.settings import settings
from tasks.data.slurm_states import DOCUMENTED_STATES

# What the rest of ckpt-poc imports from here (among them DOCUMENTED_STATES and parse_tres,
# for the experiments' report and the Slurm cluster backend).
__all__ = [
    "DOCUMENTED_STATES",
    "GPU_SOURCES",
    "GPU_SOURCE_LABELS",
    "JOB_COLUMNS",
    "KEY_ENV",
    "SACCT_FIELDS",
    "ParsedBlock",
    "Pseudonymiser",
    "Quarantined",
    "detect_layout",
    "load_pseudonym_key",
    "not_computed",
    "open_source",
    "parse_sacct_stream",
    "parse_tres",
    "run_sacct_live",
]

BLOCK_BYTES = 32 << 20
SAMPLE_BYTES = 1 << 20  # the dump's first bytes its time formats are detected from


def iter_blocks(
    stream: io.BufferedIOBase, block_bytes: int = BLOCK_BYTES
) -> Iterator[tuple[memoryview, int, int]]:
    """Newline-aligned blocks (zero-copy views) from the stream's position on, the 1-based line
    each starts at, and the number of newlines each holds."""
    in_place = _bytes_in_place(stream)
    if in_place is not None:
        yield from _view_blocks(*in_place, stream.tell(), block_bytes)
        return
    carry = b""
    line = 1
    while True:
        chunk = stream.read(block_bytes)
        if not chunk:
            break
        data = carry + chunk if carry else chunk
        cut = data.rfind(b"\n") + 1
        if not cut:
            carry = data
            continue
        view = memoryview(data)
        newlines = data.count(b"\n", 0, cut)
        yield view[:cut], line, newlines
        carry = bytes(view[cut:])
        line += newlines
    if carry:
        yield memoryview(carry), line, carry.count(b"\n")


def _bytes_in_place(stream: io.BufferedIOBase) -> tuple[memoryview, mmap.mmap | None] | None:
    """The stream's bytes where they can be had without reading them into new memory: a
    BytesIO's value (shared, not copied), or a regular file's pages mapped (and the mapping).
    Each 32 MB read is a fresh allocation the kernel zeroes and the read copies into: at 5 M
    rows 1.7 s of the parse's 8 CPU-s, in the thread that feeds the others. None for anything
    else (a pipe, a decompressing stream)."""
    if isinstance(stream, io.BytesIO):
        return memoryview(stream.getvalue()), None
    if type(stream) is io.BufferedReader and isinstance(stream.raw, io.FileIO):
        info = os.fstat(stream.fileno())
        if stat.S_ISREG(info.st_mode) and info.st_size > 0:
            # Unmapped when the last view goes; closing the file does not end the mapping.
            # As with any mapped reader, a file truncated while it is read would end the
            # process (SIGBUS): a dump is written once, then read.
            mapped = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
            return memoryview(mapped), mapped
    return None


_SCAN = 1 << 20  # bytes copied at a time to look for or count newlines in a view
# Blocks behind the newest whose mapped pages are given back: parsed by then (at most
# PARSE_THREADS + 1 are held), and a mapped page counts in the process's RSS until it is.
_MAPPED_BLOCKS = 4


def _view_blocks(
    view: memoryview, mapped: mmap.mmap | None, start: int, block_bytes: int
) -> Iterator[tuple[memoryview, int, int]]:
    """iter_blocks over bytes already in memory: the same blocks, each a slice of ``view``."""
    line, pos, size = 1, start, len(view)
    read = pos  # how far the reads would have got
    behind: deque[tuple[int, int]] = deque()
    while pos < size:
        # As the reads would cut: after the last newline read so far, reading block_bytes
        # more while there is none (a line longer than a block); the rest at the end.
        read = min(read + block_bytes, size)
        last = _last_newline(view, pos, read)
        if last < 0 and read < size:
            continue
        cut = size if last < 0 else last + 1
        block = view[pos:cut]
        newlines = sum(bytes(block[i : i + _SCAN]).count(b"\n") for i in range(0, cut - pos, _SCAN))
        yield block, line, newlines
        line += newlines
        if mapped is not None:
            behind.append((pos, cut))
            if len(behind) > _MAPPED_BLOCKS:
                _give_back(mapped, *behind.popleft())
        pos = cut


def _give_back(mapped: mmap.mmap, start: int, end: int) -> None:
    """Drop a parsed range's pages from the mapping (the page cache keeps them; a later
    access would read them again, so this is never wrong, only slower if early)."""
    start -= start % mmap.PAGESIZE
    if end > start:
        mapped.madvise(mmap.MADV_DONTNEED, start, end - start)


def _last_newline(view: memoryview, start: int, end: int) -> int:
    """The index of the last newline in ``view[start:end]``, -1 if there is none."""
    hi = end
    while hi > start:
        lo = max(start, hi - _SCAN)
        found = bytes(view[lo:hi]).rfind(b"\n")
        if found >= 0:
            return lo + found
        hi = lo
    return -1


def _first_content_line(stream: io.BufferedIOBase) -> tuple[bytes, int, int]:
    """The first non-empty line, its 1-based line number and the byte offset it starts at."""
    offset, number = 0, 0
    while True:
        line = stream.readline()
        if not line:
            return b"", number, offset
        number += 1
        if line.strip():
            return line, number, offset
        offset += len(line)


def parse_sacct_stream(
    stream: io.BufferedIOBase,
    source: str,
    pseudonymiser: Pseudonymiser,
    *,
    delimiter: bytes | None = None,
    sacct_format: str | None = None,
    pseudonymise_job_names: bool = False,
    block_bytes: int = BLOCK_BYTES,
    relative_to: tuple[dt.date, str] | None = None,
) -> Iterator[ParsedBlock]:
    """Parse a whole ``sacct -P`` stream block by block (the stream must be seekable).

    ``delimiter`` overrides the one the header shows (or '|'); ``sacct_format`` names the
    columns of a header-less dump in sacct's --format syntax. Each time field's format is
    detected from the dump's first rows; ``relative_to`` (the day sacct ran, and where that
    was read) dates SLURM_TIME_FORMAT=relative times (tasks.baseline.time_formats).
    """
    first, first_number, first_offset = _first_content_line(stream)
    if not first:
        return
    layout = detect_layout(first, source, delimiter, sacct_format, first_number)
    if layout.has_header:
        stream.seek(first_offset + len(first))
        start_line = first_number + 1
    else:
        stream.seek(first_offset)
        start_line = first_number
    body = stream.tell()
    sample = stream.read(SAMPLE_BYTES)
    stream.seek(body)
    where = f"{source}:{start_line}"
    time_formats = detect_dump_time_formats(sample, layout, where, relative_to)
    parse = partial(
        parse_block,
        layout=layout,
        pseudonymiser=pseudonymiser,
        pseudonymise_job_names=pseudonymise_job_names,
        time_formats=time_formats,
    )
    blocks = (
        (block, start_line + offset - 1, newlines)
        for block, offset, newlines in iter_blocks(stream, block_bytes)
    )
    yield from _in_order(parse, blocks, PARSE_THREADS)


# Blocks parsed at once. Arrow's compute kernels release the GIL, and a block's field parsing
# runs one kernel at a time: a second block beside it uses the core the first leaves idle
# (5 M rows on 2 cores: ~1.5 s less). CKPT_POC_PARSE_THREADS=1 parses one at a time.
PARSE_THREADS = settings().parse_threads or min(2, usable_cpus())


def _in_order(
    parse: partial[ParsedBlock], blocks: Iterator[tuple[memoryview, int, int]], threads: int
) -> Iterator[ParsedBlock]:
    """Each block parsed, in input order, ``threads`` at a time; at most ``threads`` + 1
    blocks are held, so a history larger than memory still streams."""
    if threads <= 1:
        for block, first_line, newlines in blocks:
            yield parse(block, first_line=first_line, newlines=newlines)
        return
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="parse") as pool:
        pending: deque[Future[ParsedBlock]] = deque()
        for block, first_line, newlines in blocks:
            pending.append(pool.submit(parse, block, first_line=first_line, newlines=newlines))
            if len(pending) > threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
