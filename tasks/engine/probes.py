"""Probes: how the harness sees a workload progress or become ready, within 50 ms (a step
that follows another by less than ``HOLD_S``: within that hold; its time is still its write's).

A progress probe follows the workload's append-only log (or a file holding a counter) and
yields a step counter; a ready probe (a URL answering 200, a TCP port accepting, a command
exiting 0, a line in the log) is asked until it says ready. Each records the moment it
observes a change as an event.

On Linux the progress probe sleeps on inotify until the log changes (``mode == "inotify"``):
its latency is the wake-up plus the read, and an idle log costs a wake-up only every
``SAFETY_POLL_S``. Where inotify is missing or cannot see every writer (a network or FUSE
filesystem: writes from other hosts raise no local event) it polls every ``POLL_S``
(``mode == "poll"``), so its latency is bounded by that interval plus the read.

Watched, it coalesces: after a read that found a new step it reads again no sooner than
``hold_s`` later (``HOLD_S``), so a workload logging faster than that costs one wake-up per
``hold_s``, not one per line (at 48 lines/s: ~10 instead of 48). A line after a quiet spell
(the first one, the first after a recovery) is still read at once. Each read takes its time
from the log's mtime (the kernel's time of its last write, on this host's clock), clamped
between the previous read and this one: the step a read ends on is timed to its write, not
to the read, to within the mtime's granularity (one jiffy, a few ms early at most); the
steps before it in the same read get no event of their own (readers interpolate,
tasks/window/chains.py). So ``hold_s`` bounds when the harness *knows* of a step (its read
is at most ``hold_s`` plus a wake-up late), not its recorded time. The first `progress`
event of a probe says how it times (``timing``, ``hold_ms``). Callers that need the step up
to a moment (a fault, a dump) call ``poll()`` (or ``latest()``) first: a fresh read.

A clock that ends on the first line after a moment (recovery's `serving_again`, cold
start's `ready`) cannot use a held read: the hold gathers that line with the ones after it,
and the read is timed by the last of them (seen: every managed recovery 100 ms, the hold).
Inside ``time_exactly()`` there is no hold: each write is read on its own wake-up.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import re
import select
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tasks.data.events import Ev
from tasks.engine.clock import EventRecorder
from tasks.engine.paths import mount_fstype

POLL_S = 0.01
# In inotify mode: how often the probe reads the log even without an event (a lost or
# unseen event then costs at most this much latency; 2 wake-ups/s cost ~0.01 % of a core).
SAFETY_POLL_S = 0.5
# In inotify mode: after a read that found a new step, the next read waits this long (lines
# written meanwhile are read together: ~5 at 48 lines/s). It bounds how late the harness
# learns of such a step, not the step's time, which comes from the log's mtime.
HOLD_S = 0.1
# Filesystems whose writes from other hosts raise no inotify event here; their logs are
# polled. "fuse" covers fuse.* (sshfs, gcsfuse, ...) too; fuseblk (ntfs-3g etc.) is local.
NETWORK_FS = frozenset(
    {"nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ceph", "beegfs", "9p", "fuse"}
    | {"afs", "glusterfs", "virtiofs", "panfs", "orangefs"}
)

ProbeMode = Literal["inotify", "poll"]

# <sys/inotify.h>
_IN_MODIFY, _IN_CLOSE_WRITE = 0x2, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF = 0x400, 0x800
_IN_Q_OVERFLOW, _IN_IGNORED, _IN_ONLYDIR = 0x4000, 0x8000, 0x01000000
# The log itself: its writes. The directory: only the log's name appearing or going (so a
# sibling log written every step, as in a run folder with both arms, wakes nobody).
_FILE_MASK = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_DELETE_SELF | _IN_MOVE_SELF
_DIR_MASK = (
    _IN_CREATE | _IN_MOVED_TO | _IN_DELETE | _IN_MOVED_FROM | _IN_DELETE_SELF | _IN_MOVE_SELF
)
_READ_CHUNK = 1 << 16
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name


@dataclass(frozen=True)
class StepSeen:
    step: int
    t_mono_ns: int
    offset: int  # byte offset in the log just after the line that carried it


def steps_in(text: str, pattern: re.Pattern[str]) -> list[int]:
    return [int(m.group(1) or 0) for m in pattern.finditer(text)]


def compile_progress(regex: str | re.Pattern[str]) -> re.Pattern[str]:
    """A progress regex, line-anchored: ``^`` and ``$`` match at each line of the log."""
    return regex if isinstance(regex, re.Pattern) else re.compile(regex, re.MULTILINE)


def last_step_before(log: Path, size: int, regex: str | re.Pattern[str]) -> int | None:
    """The last step the log held in its first ``size`` bytes (what a checkpoint froze)."""
    pattern = compile_progress(regex)
    with open(log, "rb") as fh:
        text = fh.read(size).decode("utf-8", "replace")
    steps = steps_in(text, pattern)
    return steps[-1] if steps else None


def is_network_fs(fstype: str) -> bool:
    return fstype in NETWORK_FS or fstype.startswith("fuse.")


@functools.cache
def _libc_inotify() -> tuple[Callable[..., int], Callable[..., int], Callable[..., int]] | None:
    """libc's inotify_init1, inotify_add_watch, inotify_rm_watch; None off Linux or without."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own libc (glibc or musl)
        init1, add, rm = libc.inotify_init1, libc.inotify_add_watch, libc.inotify_rm_watch
    except (OSError, AttributeError):
        return None
    init1.argtypes, init1.restype = [ctypes.c_int], ctypes.c_int
    add.argtypes, add.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32], ctypes.c_int
    rm.argtypes, rm.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return init1, add, rm


class _Inotify:
    """A non-blocking inotify instance (raises OSError where there is none)."""

    def __init__(self) -> None:
        funcs = _libc_inotify()
        if funcs is None:
            raise OSError(errno.ENOSYS, "no inotify in this libc")
        init1, self._add, self._rm = funcs
        self.fd = init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")

    def add_watch(self, path: Path | str, mask: int) -> int:
        wd = self._add(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
        return wd

    def rm_watch(self, wd: int) -> None:
        self._rm(self.fd, wd)  # fails harmlessly if the kernel already dropped it

    def read(self) -> list[tuple[int, int, bytes]]:
        """Pending events as (wd, mask, name); [] when none."""
        return _parse_events(self.read_raw())

    def read_raw(self) -> bytes:
        """Pending events as the kernel wrote them; b"" when none."""
        try:
            return os.read(self.fd, 65536)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        os.close(self.fd)


def _parse_events(buf: bytes) -> list[tuple[int, int, bytes]]:
    """struct inotify_event records as (wd, mask, name)."""
    events, i = [], 0
    while i + _EVENT.size <= len(buf):
        wd, mask, _cookie, length = _EVENT.unpack_from(buf, i)
        i += _EVENT.size
        events.append((wd, mask, buf[i : i + length].rstrip(b"\0")))
        i += length
    return events


def _choose_mode(log: Path, watch: bool) -> tuple[ProbeMode, str]:
    """inotify where it sees every write to ``log``, else poll; and why."""
    if not watch:
        return "poll", "watch=False"
    if _libc_inotify() is None:
        return "poll", "no inotify on this platform"
    fstype = mount_fstype(Path(log).parent)
    if fstype is None:
        return "poll", "filesystem type unknown"
    if is_network_fs(fstype):
        return "poll", f"log on {fstype}: other hosts' writes raise no inotify event"
    return "inotify", f"log on {fstype}"


class LogProgressProbe:
    """Follows an append-only log from a byte offset; records `progress` on each new step.

    ``mode`` says how it learns of new lines: "inotify" (it sleeps until the log changes,
    with a read every ``safety_s`` anyway) or "poll" (a read every ``poll_s``; forced with
    ``watch=False``); ``mode_reason`` says why. start() falls back to "poll" if it cannot
    get an inotify instance. ``from_offset`` skips what the log held before (another copy's
    lines, when a restored copy writes on in its log).

    Watched, it wakes (and reads) once per write of the log, but no sooner than ``hold_s``
    after a read that found a step (module docstring): a workload printing 48 lines/s
    costs ~10 wake-ups/s at the default 0.1 s, each read timed by the log's mtime. (A 30 ms
    hold did not pay, bench/README.md: ~1.5 lines a read did not repay the timer's wake-up.)
    """

    def __init__(
        self,
        log: Path,
        regex: str,
        recorder: EventRecorder,
        trial_id: str,
        arm: str,
        *,
        poll_s: float = POLL_S,
        record_every_step: bool = True,
        watch: bool = True,
        safety_s: float = SAFETY_POLL_S,
        hold_s: float = HOLD_S,
        from_offset: int = 0,
    ) -> None:
        self.log = log
        self.pattern = compile_progress(regex)
        self._recorder = recorder
        self._trial, self.arm = trial_id, arm
        self._poll_s = poll_s
        self._record_every = record_every_step
        self._read_to = from_offset  # bytes of the log read so far (or skipped)
        self._offset = from_offset  # bytes up to the end of the last complete line
        self._partial = b""
        self.seen: list[StepSeen] = []
        self.reads = 0  # reads of the log
        self.wakeups = 0  # sleeps of the probe's thread that ended (its cost is per wake-up)
        # The condition's lock is entered directly, and the condition notified only while
        # someone waits: Condition's __enter__ and notify_all are Python, paid every step.
        self._seen_lock = threading.RLock()
        self._lock = threading.Condition(self._seen_lock)
        self._waiting = 0  # threads in wait_for
        # A one-group regex: one findall (C) per read, not a match object per line.
        self._findall = self.pattern.findall if self.pattern.groups == 1 else None
        self._read_lock = threading.Lock()  # poll() is public: one reader at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.mode, self.mode_reason = _choose_mode(log, watch)
        self._safety_s = safety_s
        self.hold_s = hold_s
        # Monotonic ns at the previous read's start (or the probe's): no new byte is older.
        self._t_lo = time.monotonic_ns()
        self._t_step = 0  # ... at the start of the last read that found a step
        self._ino: _Inotify | None = None
        self._wake_fd: int | None = None  # eventfd: stop() wakes the sleeping thread
        self._fd_lock = threading.Lock()  # stop() never writes to an fd the thread closed
        self._dir_wd: int | None = None
        self._file_wd: int | None = None
        self._armed = False  # both watches set (or the log's absence noted by the dir watch)
        self._log_fd: int | None = None  # the log, open between reads in inotify mode
        self._reopen = True  # open the log afresh before the next read
        self._name = os.fsencode(Path(log).name)  # a str log worked before: still does
        self._modified: bytes | None = None  # the inotify record of a write to the log
        self._exact = 0  # > 0: holds are off, each write read on its own (time_exactly)

    def start(self) -> LogProgressProbe:
        if self.mode == "inotify":
            try:
                self._ino = _Inotify()
                self._wake_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            except OSError as exc:  # e.g. EMFILE: the user's inotify instances are used up
                self._close_fds()
                self.mode, self.mode_reason = "poll", f"inotify unavailable: {exc}"
        self._t_lo = time.monotonic_ns()  # a line already in the log is timed from here on
        self._thread = threading.Thread(target=self._run, name=f"progress-{self.arm}", daemon=True)
        self._thread.start()
        return self

    @contextlib.contextmanager
    def time_exactly(self) -> Iterator[None]:
        """While inside: no hold, every write read as it comes, so the first line after a
        moment (a fault, a restore) is read alone and timed to its own write, not to the
        last of the lines a hold gathered. It costs a wake-up per line meanwhile."""
        with self._read_lock:
            self._exact += 1
        self._wake()  # cut a hold in progress short
        try:
            yield
        finally:
            with self._read_lock:
                self._exact -= 1

    def _wake(self) -> None:
        with self._fd_lock:
            if self._wake_fd is not None:
                os.eventfd_write(self._wake_fd, 1)

    def _drain_wake(self) -> None:
        with self._fd_lock:
            if self._wake_fd is not None:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(self._wake_fd)

    def stop(self) -> None:
        """End the thread; watched, it reads the log once more first (a hold may have left
        its last lines unread)."""
        self._stop.set()
        self._wake()
        if self._thread:
            self._thread.join(timeout=5)  # its exit closes the inotify and wake fds

    def _close_fds(self) -> None:
        with self._fd_lock:
            if self._ino is not None:
                self._ino.close()
            if self._wake_fd is not None:
                os.close(self._wake_fd)
            self._ino, self._wake_fd = None, None

    def _run(self) -> None:
        if self._ino is not None and self._wake_fd is not None:
            try:
                self._run_watched(self._ino, self._wake_fd)
                with self._read_lock:  # stopped: lines a hold left unread still count
                    self._poll()
            finally:
                self._close_fds()
                with self._read_lock:
                    self._close_log()
            return
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self._poll_s)
            self.wakeups += 1

    def _run_watched(self, ino: _Inotify, wake_fd: int) -> None:
        poller, holder = select.poll(), select.poll()
        poller.register(ino.fd, select.POLLIN)
        poller.register(wake_fd, select.POLLIN)
        holder.register(wake_fd, select.POLLIN)  # a hold: stop() or time_exactly cuts it short
        wait, stopped, lock = poller.poll, self._stop.is_set, self._read_lock
        hold_ns = int(self.hold_s * 1e9)
        while not stopped():
            # Watch first, then read: a line appended between the read and a watch added
            # after it would raise no event and wait for the safety read (seen: 500 ms).
            if not self._armed:
                self._arm(ino)
            self.poll()
            # Unarmed (no directory yet, watch refused): poll as fast as poll mode would.
            timeout_ms = (self._safety_s if self._armed else self._poll_s) * 1000
            streaming = False  # the last read followed a hold: lines come faster than it
            while True:
                if streaming and not self._exact:  # hold first: hold_s of lines, one wake-up
                    if holder.poll(hold_ns / 1e6):
                        self._drain_wake()
                    self.wakeups += 1
                # Once per wake-up: each Python call here costs µs (cold after the sleep),
                # so one lock and, for a plain write, one bytes compare.
                ready = wait(0 if streaming else timeout_ms)
                self.wakeups += not streaming
                if stopped():
                    return
                with lock:  # _reopen is read and cleared under it
                    if not ready:
                        if streaming:  # nothing came during the hold: sleep on inotify
                            streaming = False
                            continue
                        self._reopen = True  # the safety read: also catch a replacement unseen
                        break
                    if any(fd == wake_fd for fd, _ in ready):
                        self._drain_wake()  # time_exactly began: read now, hold no more
                        streaming = self._poll() and not self._exact
                        continue
                    raw = ino.read_raw()
                    if raw != self._modified and not self._relevant(_parse_events(raw)):
                        continue
                    if not self._armed:
                        break  # re-arm before the read
                    left_ns = self._t_step + hold_ns - time.monotonic_ns()
                    if self._exact:
                        streaming = False
                        self._poll()
                        continue
                    if left_ns <= 0 or streaming:
                        streaming = self._poll() and streaming
                        continue
                # A step was read less than hold_s ago: wait out the rest (unlocked: a
                # caller's poll() goes on), then read what came meanwhile in one go.
                if holder.poll(left_ns / 1e6):
                    self._drain_wake()
                self.wakeups += 1
                if stopped():
                    return
                with lock:
                    streaming = self._poll()

    def _arm(self, ino: _Inotify) -> None:
        """Watch the log's directory for the log's name and, if it exists, the log itself."""
        self._armed = False
        if self._dir_wd is None:
            try:
                self._dir_wd = ino.add_watch(Path(self.log).parent, _DIR_MASK | _IN_ONLYDIR)
            except OSError:
                return
        try:
            wd: int | None = ino.add_watch(self.log, _FILE_MASK)
        except FileNotFoundError:
            wd = None  # the directory watch says when it appears
        except OSError:
            return
        if self._file_wd is not None and wd != self._file_wd:
            ino.rm_watch(self._file_wd)  # the name now points at another file (or none)
        self._file_wd = wd
        self._modified = None if wd is None else _EVENT.pack(wd, _IN_MODIFY, 0, 0)
        self._armed = True

    def _relevant(self, events: list[tuple[int, int, bytes]]) -> bool:
        """Whether ``events`` may mean new bytes in the log; re-arms the watches they moved."""
        relevant = False
        for wd, mask, name in events:
            if mask & _IN_Q_OVERFLOW:
                relevant, self._armed, self._reopen = True, False, True
            elif wd == self._file_wd:
                relevant = True
                if mask & (_IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF):
                    if mask & _IN_IGNORED:
                        self._file_wd = self._modified = None  # dropped; no rm_watch
                    self._armed, self._reopen = False, True
            elif wd == self._dir_wd:
                if mask & (_IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF):
                    relevant, self._armed, self._reopen = True, False, True
                    if mask & _IN_IGNORED:
                        self._dir_wd = None
                elif name == self._name:  # created, moved in or gone: re-arm, reopen
                    relevant, self._armed, self._reopen = True, False, True
        return relevant

    def poll(self) -> bool:
        """Read what the log gained since the last poll; record the newest step seen.
        Whether it found a new step."""
        with self._read_lock:
            return self._poll()

    def latest(self) -> StepSeen | None:
        """The newest step the log holds now (a fresh read first, not the last wake-up's:
        for the step at a fault or a dump)."""
        self.poll()
        return self.last

    def _close_log(self) -> None:
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    def _poll(self) -> bool:
        self.reads += 1
        fd = self._log_fd
        if fd is None or self._reopen:
            self._close_log()
            try:
                fd = os.open(self.log, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return False
            # While watched, the fd stays open (an open() cost more CPU than the rest of a
            # read) until the watch says the name moved; polled, each read opens afresh.
            self._log_fd, self._reopen = fd, self._ino is None
        watched = self._ino is not None  # a local log: its mtime is this host's clock
        t_lo, self._t_lo = self._t_lo, time.monotonic_ns()
        try:
            if watched:
                # Only the bytes the log held at this fstat: the mtime is their last write's
                # (a line appended after it would be read but timed too early).
                st = os.fstat(fd)
                want = st.st_size - self._read_to
                data = os.pread(fd, want, self._read_to) if want > 0 else b""
            else:
                data = os.pread(fd, _READ_CHUNK, self._read_to)
                if len(data) == _READ_CHUNK:
                    data = self._read_rest(fd, data)
        finally:
            if self._reopen:
                self._close_log()
        if not data:
            return False
        if watched:  # when the last write happened, not when this read did (docstring)
            m0, real, t = time.monotonic_ns(), time.time_ns(), time.monotonic_ns()
            t = min(t, max(t_lo, st.st_mtime_ns - real + (m0 + t) // 2))
        else:
            t = time.monotonic_ns()
        self._read_to += len(data)
        buf = self._partial + data if self._partial else data
        # A line ends at "\n" or at "\r" (GROMACS -v rewrites its progress line with "\r").
        cut = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1
        complete, self._partial = buf[:cut], buf[cut:]
        self._offset = self._read_to - len(self._partial)
        text = complete.decode("utf-8", "replace")
        if self._findall is None:
            steps = steps_in(text, self.pattern)
            if not steps:
                return False
            step = steps[-1]
        else:
            found = self._findall(text)
            if not found:
                return False
            step = int(found[-1] or 0)
        self._t_step = self._t_lo
        seen = StepSeen(step, t, self._offset)
        with self._seen_lock:
            self.seen.append(seen)
            if self._waiting:
                self._lock.notify_all()
        if len(self.seen) == 1:  # how this probe's events are timed, once
            timing = "mtime" if watched else "read"
            hold_ms = self.hold_s * 1000 if watched else 0.0
            rec = self._recorder.record_at
            rec(self._trial, self.arm, Ev.PROGRESS, t, step=step, timing=timing, hold_ms=hold_ms)
        elif self._record_every:
            self._recorder.record_at(self._trial, self.arm, Ev.PROGRESS, t, step=step)
        return True

    def _read_rest(self, fd: int, first: bytes) -> bytes:
        """The rest of a log that gained more than a chunk since the last read."""
        chunks = [first]
        while len(chunks[-1]) == _READ_CHUNK:
            chunks.append(os.pread(fd, _READ_CHUNK, self._read_to + _READ_CHUNK * len(chunks)))
        return b"".join(chunks)

    @property
    def last(self) -> StepSeen | None:
        with self._lock:
            return self.seen[-1] if self.seen else None

    def wait_for(self, predicate: Callable[[StepSeen], bool], timeout: float) -> StepSeen | None:
        """Block until a seen step satisfies ``predicate``; None on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                match = next((s for s in self.seen if predicate(s)), None)
                if match or time.monotonic() >= deadline:
                    return match
                # poll() notifies on every new step; the cap is only a safety net.
                cap = max(self._poll_s, self._safety_s)
                self._waiting += 1
                try:
                    self._lock.wait(min(cap, max(0.0, deadline - time.monotonic())))
                finally:
                    self._waiting -= 1
