"""A big ``sacct --json`` file converted by several processes at once.

Converting is Python holding the GIL (orjson's decoding and the rows), so threads do not help;
processes do. The jobs list is split into regions at cuts found near equal byte offsets with
the separator sacct_json_fast learns; this process converts the first region, and one worker
process each of the others, reading the file itself (mapped, never a pickled copy of the
document). A region's start is only a guess until the region before it ends there: its last
chunk, proven by orjson as every chunk is, must close at that cut. Any region that does not
prove out, a worker that fails, dies or stalls, a file that changed since it was read: the
document is converted again by sacct_json.convert_sacct_json, one process, as it always was,
so the answer and its errors are the same as without workers.

Workers are started with subprocess (fork and exec: safe in a process with threads, such as
a Prefect worker) running only this module, so they import orjson and the converter, not the
caller's ``__main__`` as multiprocessing's spawn would.

    CKPT_POC_JSON_WORKERS=1   one process, always
    CKPT_POC_JSON_WORKERS=N   N processes (this one included), whatever the document's size
"""

from __future__ import annotations

import io
import logging
import mmap
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.baseline.sacct_json import (
    HEADER,
    JsonConversion,
    convert_sacct_json,
    document_version,
    iter_document,
    psv_of,
    unreadable_row,
    write_rows,
)
from tasks.baseline.sacct_json_fast import Unchunked, chunks, jobs_list, tail_jobs
from tasks.data.cpus import usable_cpus
from tasks.data.settings_bare import env_name

log = logging.getLogger(__name__)

WORKERS_ENV = env_name("json_workers")
MIN_PARALLEL_BYTES = 64 << 20  # below this a worker's start costs more than it saves
MAX_PROCESSES = 8
_RELEASE_BYTES = 64 << 20  # a worker drops the mapped pages it has read every this many bytes
# A worker still running this long after this process finished its own region (itself
# timed in seconds, times this factor) is taken as stuck.
_STALL_FACTOR = 4.0
_STALL_MIN_S = 120.0
_ROOT = str(Path(__file__).resolve().parents[2])  # where ``tasks`` is: the workers import it
_WORKER_CODE = (
    f"import sys; sys.path.insert(0, {_ROOT!r}); "
    "from tasks.baseline.sacct_json_parallel import worker_main; worker_main()"
)
_LEN = struct.Struct("<Q")  # a length on a worker's stdout
_GUESSES = 8  # cuts tried near each offset before the regions are fewer


class _Lost(Exception):
    """A worker gave no answer: it failed, died or stalled."""


def processes(size: int) -> int:
    """How many processes convert a document of ``size`` bytes (1: no workers)."""
    # Here, not at the top: a worker process imports this module and has no use for pydantic.
    from tasks.data.settings import settings

    forced = settings().json_workers
    if forced is not None:
        return min(forced, MAX_PROCESSES)
    if size < MIN_PARALLEL_BYTES:
        return 1
    return min(usable_cpus(), MAX_PROCESSES)


def sacct_json_path_to_psv(path: str | Path, source: str) -> bytes:
    """sacct_json.sacct_json_to_psv for the document in the file ``path``."""
    return psv_of(convert_path(path, source), source)


def convert_path(path: str | Path, source: str) -> JsonConversion:
    """The file's document converted. A big one is converted by several processes from the
    file mapped, never read into one bytes copy (1 M jobs: 0.6 s and 1 GB of RSS less);
    otherwise, or when that does not answer, the file is read whole and converted in one."""
    with open(path, "rb") as fh:
        stamp = os.fstat(fh.fileno())
        if processes(stamp.st_size) > 1 and stamp.st_size:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return convert_file(data, source, path, stamp)
    return convert_sacct_json(Path(path).read_bytes(), source)


def convert_file(
    data: bytes | mmap.mmap, source: str, path: str | Path, stamp: os.stat_result
) -> JsonConversion:
    """sacct_json.convert_sacct_json, by several processes when the document is big; ``data``
    is the file's bytes or the file mapped (read whole only if one process converts)."""
    n = processes(len(data))
    try:
        conversion = _convert_parallel(data, str(path), stamp, n) if n > 1 else None
    except Unchunked:
        conversion = None
    if conversion is not None:
        return conversion
    if n > 1:
        log.debug("%s: converted again in one process", source)
    return convert_sacct_json(data if isinstance(data, bytes) else Path(path).read_bytes(), source)


def _stops(data: bytes, pos: int, between: bytes, n: int) -> list[int]:
    """Up to ``n - 1`` cuts (where ``between`` is found) near equal offsets of the list, each
    followed by what parses as jobs (a cut inside a nested list of objects seldom is): the
    guesses the regions then prove."""
    after = between.index(b"{")
    stops: list[int] = []
    for i in range(1, n):
        at = data.find(
            between, max(pos + (len(data) - pos) * i // n, stops[-1] + 1 if stops else pos)
        )
        for _ in range(_GUESSES):
            if at < 0:
                return stops
            try:
                if _next_cut_from(data, at + after, between):
                    stops.append(at)
                    break
            except Unchunked:
                pass
            at = data.find(between, at + 1)
    return stops


def _next_cut_from(data: bytes, start: int, between: bytes) -> bool:
    """Whether the bytes from ``start`` parse as jobs up to a cut past CHUNK_BYTES (False
    too when no cut is left after it: a region there would be all tail)."""
    for _ in chunks(data, start, between):
        return True
    return False


@dataclass
class _Answer:
    """What a worker sends back: its region's rows and what was learnt reading them."""

    ok: bool
    why: str = ""
    jobs: int = 0
    unreadable: list[tuple[int, str]] | None = None
    marks: list[tuple[int, str]] | None = None
    top: dict[str, Any] | None = None
    seconds: float = 0.0  # converting, in the worker
    peak_mib: float = 0.0  # the worker's peak RSS
    psv: bytes | bytearray = b""


def _convert_parallel(
    data: bytes | mmap.mmap, path: str, stamp: os.stat_result, n: int
) -> JsonConversion | None:
    """The document by ``n`` processes; None when a worker's region did not prove out or a
    worker gave no answer, Unchunked when this process's own region did not."""
    if len(data) != stamp.st_size:  # not the whole file as it was: the workers would not agree
        return None
    pos, top, between = jobs_list(data)
    if between is None:
        return None
    stops = _stops(data, pos, between, n)
    if not stops:
        return None
    after = between.index(b"{")
    starts = [stop + after for stop in stops]
    ends: list[int | None] = [*stops[1:], None]
    request = {"path": path, "stamp": _identity(stamp), "between": between}
    workers: list[_Worker] = []
    try:
        for start, stop in zip(starts, ends, strict=True):
            workers.append(_Worker({**request, "start": start, "stop": stop}))
        t = time.monotonic()
        out = io.BytesIO()
        out.write(HEADER)
        jobs = _releasing(data, pos, chunks(data, pos, between, stops[0]))
        total, unreadable, _ = write_rows(jobs, out)
        own = time.monotonic() - t
        deadline = time.monotonic() + max(_STALL_MIN_S, _STALL_FACTOR * own)
        for worker in workers:
            answer = worker.answer(deadline, 8 * len(data) + (1 << 20), out)
            if not answer.ok:
                log.debug("a worker's region did not prove out: %s", answer.why)
                return None
            if answer.marks:
                _append(out, answer, total, unreadable)
            total += answer.jobs
            top.update(answer.top or {})
            log.debug(
                "a worker: %.2f s, peak %.0f MiB; its rows read by %.2f s",
                answer.seconds,
                answer.peak_mib,
                time.monotonic() - t,
            )
        log.debug("%d processes: %.2f s, this one's region %.2f s", n, time.monotonic() - t, own)
    except _Lost as exc:
        log.warning("sacct --json conversion: %s; converting in one process instead", exc)
        return None
    finally:
        for worker in workers:
            worker.close()
    version, release = document_version(top)
    return JsonConversion(out.getvalue(), version, release, total, unreadable)


def _append(
    out: io.BytesIO, answer: _Answer, first: int, unreadable: list[tuple[int, str]]
) -> None:
    """A worker's rows after those before, its unreadable jobs' rows renumbered from the
    region's first job to the document's (the index is in the row's JobID)."""
    view = memoryview(answer.psv)
    done = 0
    for (index, message), (at, field) in zip(
        answer.unreadable or [], answer.marks or [], strict=True
    ):
        out.write(view[done:at])
        out.write((unreadable_row(first + index, field) + "\n").encode())
        done = at + len(unreadable_row(index, field)) + 1
        unreadable.append((first + index, message))
    out.write(view[done:])


def _identity(stamp: os.stat_result) -> tuple[int, int, int, int]:
    """What tells the file read from this one: a rewrite, a replacement or a write changes it."""
    return (stamp.st_dev, stamp.st_ino, stamp.st_size, stamp.st_mtime_ns)


class _Worker:
    """A worker process converting one region; its request is sent at start."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CODE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.errors,
            )
        except OSError as exc:  # no process to be had (EAGAIN, ENOMEM): one process it is
            self.errors.close()
            raise _Lost(f"no worker could be started: {exc}") from exc
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(pickle.dumps(request))
            self.proc.stdin.close()
        except OSError:  # it died already: answer() says so
            pass

    def answer(self, deadline: float, limit: int, out: io.BytesIO) -> _Answer:
        """The worker's answer; its rows (at most ``limit`` bytes: a length past that is no
        worker's) are read straight onto the end of ``out`` unless some are to be renumbered,
        so no second copy of them is held."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        answer = pickle.loads(self._read(fd, self._length(fd, deadline, 1 << 30), deadline))
        if not isinstance(answer, _Answer):
            raise _Lost(f"a worker (pid {self.proc.pid}) answered {type(answer).__name__}")
        if not answer.ok:
            return answer
        size = self._length(fd, deadline, limit)
        if answer.marks:
            answer.psv = self._read(fd, size, deadline)
        elif size:
            at = out.seek(0, io.SEEK_END)
            out.seek(at + size - 1)
            out.write(b"\0")  # out grows to hold the rows, which are then read into it
            with out.getbuffer() as view:
                self._read_into(fd, view[at:], deadline)
        return answer

    def _length(self, fd: int, deadline: float, limit: int) -> int:
        (size,) = _LEN.unpack(self._read(fd, _LEN.size, deadline))
        if size > limit:
            raise _Lost(f"a worker (pid {self.proc.pid}) announced {size} bytes")
        return size

    def _read(self, fd: int, size: int, deadline: float) -> bytearray:
        buf = bytearray(size)
        self._read_into(fd, memoryview(buf), deadline)
        return buf

    def _read_into(self, fd: int, view: memoryview, deadline: float) -> None:
        got = 0
        while got < len(view):
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Lost(f"a worker (pid {self.proc.pid}) still had no answer when timed out")
            if not select.select([fd], [], [], left)[0]:
                continue
            n = os.readv(fd, [view[got:]])
            if n == 0:
                raise _Lost(self._death())
            got += n

    def _death(self) -> str:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # its output closed, itself still there
            self.proc.kill()
            code = self.proc.wait()
        self.errors.seek(0)
        said = self.errors.read()[-2000:].decode(errors="replace").strip()
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        tail = f": {said}" if said else ""
        return f"a worker (pid {self.proc.pid}) ended without an answer ({how}){tail}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self.errors.close()


# --- the worker process ----------------------------------------------------------------------


def worker_main() -> None:
    """Read a request from stdin, convert its region, write the answer to stdout."""
    request = pickle.loads(sys.stdin.buffer.read())
    out = sys.stdout.buffer
    answer, psv = _work(request)
    head = pickle.dumps(answer)
    out.write(_LEN.pack(len(head)) + head)
    if answer.ok:
        out.write(_LEN.pack(len(psv.getbuffer())))
        out.write(psv.getbuffer())
    out.flush()


def _work(request: dict[str, Any]) -> tuple[_Answer, io.BytesIO]:
    t = time.monotonic()
    psv = io.BytesIO()
    with open(request["path"], "rb") as fh:
        if _identity(os.fstat(fh.fileno())) != tuple(request["stamp"]):
            return _Answer(False, "the file changed since it was read"), psv
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            top: dict[str, Any] = {}
            jobs = _region_jobs(data, request["start"], request["between"], request["stop"], top)
            try:
                n, unreadable, marks = write_rows(jobs, psv)
            except Unchunked as exc:
                return _Answer(False, f"Unchunked {exc.__cause__ or ''}"), psv
    return _Answer(True, "", n, unreadable, marks, top, time.monotonic() - t, _peak_mib()), psv


def _peak_mib() -> float:
    """This process's peak RSS (VmHWM: exec starts it afresh, unlike ru_maxrss)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _region_jobs(
    data: Any, start: int, between: bytes, stop: int | None, top: dict[str, Any]
) -> Iterator[Any]:
    """The region's jobs (``data``: the file mapped, read as bytes are); the last region's go
    on through the tail, its keys into ``top``. Pages read are dropped as it goes, so the
    mapped file does not stay in the worker's RSS."""
    pos = start
    for jobs, after in _chunks_releasing(data, start, chunks(data, start, between, stop)):
        yield from jobs
        pos = after
    if stop is None:
        yield from tail_jobs(data, pos, top, lambda tail, t: iter_document(tail, "worker", t))


def _chunks_releasing(
    data: Any, start: int, chunked: Iterator[tuple[list[Any], int]]
) -> Iterator[tuple[list[Any], int]]:
    """``chunked`` as it comes; where ``data`` is the file mapped, the pages read so far are
    dropped every _RELEASE_BYTES, so the mapped file does not stay in this process's RSS."""
    released = start
    for jobs, pos in chunked:
        yield jobs, pos
        if isinstance(data, mmap.mmap) and pos - released >= _RELEASE_BYTES:
            released = pos // mmap.PAGESIZE * mmap.PAGESIZE
            data.madvise(mmap.MADV_DONTNEED, 0, released)


def _releasing(data: Any, start: int, chunked: Iterator[tuple[list[Any], int]]) -> Iterator[Any]:
    """The jobs of ``chunked``, pages dropped as in _chunks_releasing."""
    for jobs, _ in _chunks_releasing(data, start, chunked):
        yield from jobs
