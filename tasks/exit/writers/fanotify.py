"""fanotify on whole file systems: every creation, deletion, modification, attribute change
and move, with the directory and name it happened at and the pid that made it.

A filesystem mark (``FAN_MARK_FILESYSTEM``) sees every write on that file system, whoever
makes it; with ``FAN_REPORT_DFID_NAME | FAN_REPORT_TARGET_FID`` each event names the
directory (a file handle) and the entry's name, so a creation or deletion is reported with
its path, not only an inode. A handle is opened (``open_by_handle_at``, root) to learn its
directory's path at read time; the paths of directories seen are cached, so the events of a
folder deleted by then still resolve. An entry whose directory cannot be resolved is
reported as such (``path`` None), never guessed. The kernel queues at most
``/proc/sys/fs/fanotify/max_queued_events`` events; past that it drops them and says so once
(``FAN_Q_OVERFLOW``): the caller records a gap.

Linux 5.17+ (FAN_REPORT_TARGET_FID); needs CAP_SYS_ADMIN. Pure ctypes over libc.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
from collections import OrderedDict
from dataclasses import dataclass

from tasks.engine.paths import mount_point

# <linux/fanotify.h>
FAN_CLASS_NOTIF = 0x0
FAN_UNLIMITED_MARKS = 0x20
FAN_REPORT_FID = 0x200
FAN_REPORT_DIR_FID = 0x400
FAN_REPORT_NAME = 0x800
FAN_REPORT_TARGET_FID = 0x1000
FAN_MARK_ADD = 0x1
FAN_MARK_FILESYSTEM = 0x100

FAN_MODIFY = 0x2
FAN_ATTRIB = 0x4
FAN_MOVED_FROM = 0x40
FAN_MOVED_TO = 0x80
FAN_CREATE = 0x100
FAN_DELETE = 0x200
FAN_DELETE_SELF = 0x400
FAN_MOVE_SELF = 0x800
FAN_OPEN_EXEC = 0x1000
FAN_Q_OVERFLOW = 0x4000
FAN_ONDIR = 0x40000000

FAN_EVENT_INFO_TYPE_FID = 1
FAN_EVENT_INFO_TYPE_DFID_NAME = 2
FAN_EVENT_INFO_TYPE_DFID = 3

# What a change of a watched tree is made of (directories' own events too: FAN_ONDIR).
CHANGE_MASK = (
    FAN_CREATE | FAN_DELETE | FAN_MODIFY | FAN_ATTRIB | FAN_MOVED_FROM | FAN_MOVED_TO | FAN_ONDIR
)
# And every exec's executable (queued at the exec, with its pid): a writer that runs for a
# millisecond is gone before /proc can be read, but its exec was queued before its write.
WATCHED_MASK = CHANGE_MASK | FAN_OPEN_EXEC
# Words for a change's mask, in the order a reader expects them.
MASK_WORDS = (
    (FAN_CREATE, "create"),
    (FAN_DELETE, "delete"),
    (FAN_MODIFY, "modify"),
    (FAN_ATTRIB, "attrib"),
    (FAN_MOVED_FROM, "moved_from"),
    (FAN_MOVED_TO, "moved_to"),
    (FAN_OPEN_EXEC, "exec"),
)

_METADATA = struct.Struct("IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid
_INFO_HEADER = struct.Struct("BBH")  # info_type, pad, len
_FSID = struct.Struct("ii")
_HANDLE_HEAD = struct.Struct("Ii")  # handle_bytes, handle_type
FAN_NOFD = -1
READ_BUFFER = 1 << 20
DIR_CACHE = 65536  # directory handles whose paths are remembered
O_PATH = 0o10000000


class FanotifyUnavailable(Exception):
    """fanotify cannot watch here (no CAP_SYS_ADMIN, an old kernel, a file system that
    reports no file handles); the message says which and why."""


@dataclass(frozen=True)
class FileEvent:
    """One change: its path (None when its directory could not be resolved; ``name`` is
    then the entry's name alone), what happened, the writer's pid (the thread group's)."""

    path: str | None
    name: str
    mask: int
    pid: int

    @property
    def is_exec(self) -> bool:
        """An executable opened by an exec: no change, the name of the pid's image."""
        return bool(self.mask & FAN_OPEN_EXEC) and not self.mask & CHANGE_MASK

    @property
    def what(self) -> str:
        return "+".join(word for bit, word in MASK_WORDS if self.mask & bit) or hex(self.mask)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
    libc.fanotify_mark.argtypes = [
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_uint64,
        ctypes.c_int,
        ctypes.c_char_p,
    ]
    libc.open_by_handle_at.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    return libc


def _fsid_of(path: str) -> tuple[int, int]:
    """statfs's f_fsid as the two ints fanotify reports (glibc packs them into one)."""
    packed = os.statvfs(path).f_fsid
    lo, hi = packed & 0xFFFFFFFF, (packed >> 32) & 0xFFFFFFFF
    return _FSID.unpack(struct.pack("II", lo, hi))


class FanotifyGroup:
    """One fanotify group with a filesystem mark on each file system holding ``paths``."""

    def __init__(self, paths: list[str]) -> None:
        self._libc = _libc()
        flags = (
            FAN_CLASS_NOTIF
            | FAN_UNLIMITED_MARKS
            | FAN_REPORT_FID
            | FAN_REPORT_DIR_FID
            | FAN_REPORT_NAME
            | FAN_REPORT_TARGET_FID
        )
        fd = self._libc.fanotify_init(flags, os.O_RDONLY | os.O_CLOEXEC | os.O_LARGEFILE)
        if fd < 0:
            err = ctypes.get_errno()
            raise FanotifyUnavailable(
                f"fanotify_init: {os.strerror(err)} ({errno.errorcode.get(err)})"
            )
        self.fd = fd
        self.mounts: dict[tuple[int, int], int] = {}  # fsid → a directory fd on that file system
        self.marked: list[str] = []
        self.refused: list[str] = []  # "mount: why": file systems it could not mark (gaps)
        for mount in sorted({mount_point(p)[0] for p in paths if os.path.exists(p)}):
            self._mark(mount)
        self._dirs: OrderedDict[bytes, str] = OrderedDict()

    def _mark(self, mount: str) -> None:
        done = self._libc.fanotify_mark(
            self.fd, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, WATCHED_MASK, -100, mount.encode()
        )
        if done < 0:
            err = ctypes.get_errno()
            self.refused.append(f"{mount}: {os.strerror(err)}")
            return
        try:
            self.mounts[_fsid_of(mount)] = os.open(
                mount, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
            )
        except OSError as exc:
            self.refused.append(f"{mount}: {exc.strerror}")
            return
        self.marked.append(mount)

    def close(self) -> None:
        for fd in [*self.mounts.values(), self.fd]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.mounts.clear()

    def read(self) -> tuple[list[FileEvent], bool]:
        """The events queued now (blocks until one is; select on ``fd`` first), and whether
        the kernel dropped some (an overflow)."""
        try:
            data = os.read(self.fd, READ_BUFFER)
        except InterruptedError:
            return [], False
        events, overflow, at = [], False, 0
        while at + _METADATA.size <= len(data):
            length, _vers, _res, meta_len, mask, fd, pid = _METADATA.unpack_from(data, at)
            if length < meta_len or at + length > len(data):
                break
            if fd >= 0:  # not with FID reporting, but never leak one
                os.close(fd)
            if mask & FAN_Q_OVERFLOW:
                overflow = True
            else:
                events.append(self._event(data[at + meta_len : at + length], mask, pid))
            at += length
        return events, overflow

    def _event(self, info: bytes, mask: int, pid: int) -> FileEvent:
        directory, name, target = None, "", None
        at = 0
        while at + _INFO_HEADER.size <= len(info):
            info_type, _pad, length = _INFO_HEADER.unpack_from(info, at)
            if length == 0:
                break
            record = info[at + _INFO_HEADER.size : at + length]
            fsid = _FSID.unpack_from(record, 0)
            handle, rest = _handle(record[_FSID.size :])
            if info_type in (FAN_EVENT_INFO_TYPE_DFID_NAME, FAN_EVENT_INFO_TYPE_DFID):
                directory = self._dir_path(fsid, handle)
                if info_type == FAN_EVENT_INFO_TYPE_DFID_NAME:
                    name = rest.split(b"\0", 1)[0].decode(errors="surrogateescape")
            elif info_type == FAN_EVENT_INFO_TYPE_FID:
                target = (fsid, handle)
            at += length
        if mask & FAN_ONDIR and mask & (FAN_MOVED_FROM | FAN_MOVED_TO):
            self._dirs.clear()  # a folder moved: every path under it changed
        if directory is None:
            return FileEvent(None, name, mask, pid)
        path = directory if name in ("", ".") else os.path.join(directory, name)
        if target is not None and mask & FAN_ONDIR and mask & (FAN_CREATE | FAN_MOVED_TO):
            # A new folder: its path from now on, even if it is gone by its next event's read.
            self._remember(target[0], target[1], path)
        return FileEvent(path, name, mask, pid)

    def _remember(self, fsid: tuple[int, int], handle: bytes, path: str) -> None:
        key = struct.pack("ii", *fsid) + handle
        self._dirs[key] = path
        self._dirs.move_to_end(key)
        while len(self._dirs) > DIR_CACHE:
            self._dirs.popitem(last=False)

    def _dir_path(self, fsid: tuple[int, int], handle: bytes) -> str | None:
        key = struct.pack("ii", *fsid) + handle
        known = self._dirs.get(key)
        if known is not None:  # no syscall per event (a folder moved clears the cache)
            return known
        mount_fd = self.mounts.get(fsid)
        if mount_fd is not None:
            fd = self._libc.open_by_handle_at(mount_fd, handle, O_PATH | os.O_CLOEXEC)
            if fd >= 0:
                try:
                    path = os.readlink(f"/proc/self/fd/{fd}")
                finally:
                    os.close(fd)
                if path.endswith(" (deleted)"):
                    return known  # gone: the path it had when last seen
                self._remember(fsid, handle, path)
                return path
        return known


def _handle(record: bytes) -> tuple[bytes, bytes]:
    """A struct file_handle (as open_by_handle_at takes it) and the bytes after it."""
    size, _type = _HANDLE_HEAD.unpack_from(record, 0)
    end = _HANDLE_HEAD.size + size
    return record[:end], record[end:]
