"""Process lineage as it happens: every fork, exec and exit on the node, from the kernel's
process-events connector, so that a pid's executable, parent and cgroup can be told after
the process has gone.

fanotify tells the pid that wrote a file, but its event is read after the fact: a
short-lived writer (an installer's ``sh -c``, a ``cp`` or ``sed`` it runs) has often exited,
and its pid may be reused, by the time the event is looked at, so ``/proc/PID`` says nothing
or the wrong thing. Here the table is kept as the kernel reports: a fork gives the child its
parent (the parent at fork, not the one it is reparented to later) and the parent's image; an
exec re-reads ``/proc/PID`` while the process is (usually) still alive; an exit marks the
entry exited and keeps it ``keep_exited_s`` seconds.

The connector (``NETLINK_CONNECTOR``, ``CN_IDX_PROC``; linux/connector.h, linux/cn_proc.h)
needs CONFIG_PROC_EVENTS, CAP_NET_ADMIN and the initial pid and user namespaces. An exec
event names no file: a process that exits before its exec is read keeps ``exe`` None (its
``comm``, the new image's name, if still readable). The kernel drops events when the socket's
buffer is full; those are counted (``lost``), a gap the caller records. Pure Python sockets.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, replace

import psutil

from tasks.exit.collectors.processes import env_markers

# <linux/netlink.h>, <linux/connector.h>, <linux/cn_proc.h>
NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
NLMSG_DONE = 3
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
SO_RCVBUFFORCE = 33  # <asm-generic/socket.h>; not in Python's socket module

PROC_EVENT_NONE = 0x0  # also the kernel's ack of a (un)subscribe
PROC_EVENT_FORK = 0x1
PROC_EVENT_EXEC = 0x2
PROC_EVENT_COMM = 0x200
PROC_EVENT_EXIT = 0x80000000

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
_EVENT_HEAD = struct.Struct("=IIQ")  # what, cpu, timestamp_ns (ktime_get_ns: CLOCK_MONOTONIC)
_FORK = struct.Struct("=iiii")  # parent_pid, parent_tgid, child_pid, child_tgid
_EXEC = struct.Struct("=ii")  # process_pid, process_tgid
_COMM = struct.Struct("=ii16s")  # process_pid, process_tgid, comm
_EXIT = struct.Struct("=iiIIii")  # pid, tgid, exit_code, exit_signal, parent_pid, parent_tgid
_ACK_ERR = struct.Struct("=I")
_U32 = struct.Struct("=I")

RCVBUF = 8 << 20  # room for a burst of forks while the reader is descheduled
RECV_SIZE = 1 << 16
ACK_TIMEOUT_S = 2.0
PRUNE_EVERY_S = 1.0
_DELETED = " (deleted)"


@dataclass(frozen=True)
class ProcInfo:
    """One process (thread group) as last known: ``ppid`` is its parent at fork when the fork
    was seen, else the parent ``/proc`` gave; ``exe`` the image it ran (``/proc/PID/exe`` at
    exec, or when first seen; a memfd's ``/memfd:NAME`` as read); ``cgroup`` its cgroup v2
    path; None where it could not be read."""

    pid: int
    ppid: int | None
    exe: str | None
    cgroup: str | None
    comm: str | None
    exited: bool = False
    # The PoC's marker variables in its environment (names only, read at exec: a writer
    # gone by its event's read is still known as the PoC's; tasks.exit.collectors.processes).
    markers: tuple[str, ...] = ()
    # Where it runs from: argv[0] and an interpreter's script (never the other arguments),
    # read at exec: a venv's python resolves to the base interpreter as its exe.
    run_from: tuple[str, ...] = ()


class LineageUnavailable(Exception):
    """The process-events connector cannot be followed here; the message says why (EPERM
    without CAP_NET_ADMIN, EPROTONOSUPPORT without CONFIG_CONNECTOR, no acknowledgement
    outside the initial namespaces)."""


@dataclass
class _Entry:
    info: ProcInfo
    read_ns: int  # when /proc was last read for it (0: never): older events do not undo it
    exited_at: float | None = None  # time.monotonic() of its exit


def _exe(pid: int) -> str | None:
    try:
        target = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    return target.removesuffix(_DELETED)


def cgroup_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("0::"):
                    return line[3:].rstrip("\n")
    except OSError:
        return None
    return None


def _stat(pid: int) -> tuple[int | None, str, bool] | None:
    """(ppid, comm, zombie or dead) from /proc/PID/stat; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: it runs from the first "(" to the last ")".
    head, _, tail = raw.rpartition(b")")
    comm = head.partition(b"(")[2].decode("utf-8", "replace")
    fields = tail.split()
    try:
        ppid: int | None = int(fields[1])
    except (IndexError, ValueError):
        ppid = None
    return ppid, comm, bool(fields) and fields[0] in (b"Z", b"X")


def read_proc(pid: int) -> ProcInfo | None:
    """The process ``pid`` as ``/proc`` shows it now; None when it is gone."""
    stat = _stat(pid)
    if stat is None:
        return None
    ppid, comm, gone = stat
    return ProcInfo(
        pid=pid,
        ppid=ppid,
        exe=_exe(pid),
        cgroup=cgroup_of(pid),
        comm=comm,
        exited=gone,
        markers=_markers(pid),
        run_from=_run_from(pid),
    )


def _markers(pid: int) -> tuple[str, ...]:
    return tuple(env_markers(f"/proc/{pid}"))


def _run_from(pid: int) -> tuple[str, ...]:
    """argv[0], and argv[1] when it is a path (a script), as absolute paths where relative
    to the process's cwd."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = fh.read(8192).split(b"\0")[:2]
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ()
    out = []
    for i, raw in enumerate(words):
        word = raw.decode("utf-8", "replace")
        if not word or (i == 1 and (word.startswith("-") or "/" not in word)):
            continue
        out.append(word if word.startswith("/") or "/" not in word else os.path.join(cwd, word))
    return tuple(out)


def _socket_drops(sock: socket.socket) -> int | None:
    """The kernel's count of messages it could not queue on ``sock`` (/proc/net/netlink)."""
    try:
        inode = os.fstat(sock.fileno()).st_ino
        with open("/proc/net/netlink", encoding="ascii") as fh:
            next(fh)
            for line in fh:
                cols = line.split()
                # sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
                if len(cols) >= 10 and int(cols[9]) == inode:
                    return int(cols[8])
    except (OSError, ValueError, StopIteration):
        return None
    return None


def _control(op: int, ack: int = 0) -> bytes:
    """nlmsghdr + cn_msg + the op (LISTEN or IGNORE) for the proc connector."""
    payload = _U32.pack(op)
    cn = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, ack, len(payload), 0) + payload
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(cn), NLMSG_DONE, 0, 0, 0) + cn


class Lineage:
    """Follows every process's fork, exec and exit on this node from the kernel's
    process-events connector, so that the writer fanotify names (a pid, read after the fact)
    can be told, with its executable, parent and cgroup, even when it has exited by then.

    ``start()`` subscribes, seeds the table from ``/proc`` and reads events on a thread;
    ``who()`` and ``ancestry()`` answer from the table (``/proc`` for a pid not seen yet).
    Exited processes are kept ``keep_exited_s`` seconds. Thread-safe.
    """

    def __init__(self, *, keep_exited_s: float = 600.0) -> None:
        self.keep_exited_s = keep_exited_s
        self._table: dict[int, _Entry] = {}
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._wake_r = -1
        self._wake_w = -1
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._seen = 0
        self._enobufs = 0
        self._drops_at_close: int | None = None
        self._lost_before = 0  # lost while following before the last start()
        self._last_prune = time.monotonic()
        self.error: str | None = None  # why the reader stopped early, if it did

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Lineage:
        """Subscribe to process events, seed the table from /proc, start the reader."""
        if self._thread is not None:
            return self
        self._lost_before, self._enobufs, self._drops_at_close = self.lost, 0, None
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        except OSError as exc:
            raise LineageUnavailable(
                f"netlink connector socket: {errno.errorcode.get(exc.errno or 0, exc)}"
            ) from exc
        try:
            try:  # past rmem_max needs CAP_NET_ADMIN; without it take what rmem_max allows
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            try:
                sock.bind((0, CN_IDX_PROC))  # port id chosen by the kernel: no clash
            except OSError as exc:
                raise LineageUnavailable(
                    f"bind to CN_IDX_PROC: {errno.errorcode.get(exc.errno or 0, exc)}"
                ) from exc
            self._sock = sock
            self._stopping.clear()
            self._subscribe(sock)
        except BaseException:
            self._sock = None
            sock.close()
            raise
        # Seeded after subscribing, so no process falls between the two; events queued
        # meanwhile are older than the seed's reads and do not undo them.
        self._seed()
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="lineage-reader", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Unsubscribe, stop the reader, close the socket. Idempotent."""
        thread, self._thread = self._thread, None
        self._stopping.set()
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
        if thread is not None:
            thread.join(timeout=5.0)
        sock, self._sock = self._sock, None
        if sock is not None:
            self._drops_at_close = _socket_drops(sock)
            # Otherwise the kernel keeps counting a listener and building events for none.
            with contextlib.suppress(OSError):
                sock.send(_control(PROC_CN_MCAST_IGNORE))
            sock.close()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._wake_r = self._wake_w = -1

    def __enter__(self) -> Lineage:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- lookups -----------------------------------------------------------------------

    def who(self, pid: int) -> ProcInfo | None:
        """What is known of ``pid``: from the table, else read from /proc now (and kept);
        None when it is neither known nor alive."""
        with self._lock:
            entry = self._table.get(pid)
            if entry is not None:
                return entry.info
        read_ns = time.monotonic_ns()
        info = read_proc(pid)
        if info is None:
            return None
        with self._lock:
            # The reader may have learnt it meanwhile, from an event: that one stands.
            entry = self._table.get(pid)
            if entry is None:
                entry = _Entry(info, read_ns, time.monotonic() if info.exited else None)
                self._table[pid] = entry
            return entry.info

    def _image_now(self, pid: int) -> ProcInfo | None:
        """``pid`` as :meth:`who` knows it; one known only from its fork (its parent's image)
        and still alive is read from /proc now, keeping its parent at fork: an image can
        change without an exec (CRIU's restore puts back the dumped one, its executable and
        environment included)."""
        with self._lock:
            entry = self._table.get(pid)
        if entry is None or entry.read_ns or entry.exited_at is not None:
            return self.who(pid)
        read_ns = time.monotonic_ns()
        info = read_proc(pid)
        if info is None or info.exited:
            return entry.info
        with self._lock:
            if self._table.get(pid) is entry and not entry.read_ns:
                entry.info = replace(info, ppid=entry.info.ppid)
                entry.read_ns = read_ns
            return self._table[pid].info if pid in self._table else info

    def ancestry(self, pid: int, limit: int = 64) -> list[ProcInfo]:
        """``pid`` first, then its parent, and so on up to pid 1 or the first unknown one."""
        chain: list[ProcInfo] = []
        visited: set[int] = set()
        current = self._image_now(pid)
        while current is not None and len(chain) < limit and current.pid not in visited:
            chain.append(current)
            visited.add(current.pid)
            if current.pid == 1 or not current.ppid:
                break
            current = self.who(current.ppid)
        return chain

    def prune(self) -> int:
        """Forget processes that exited more than ``keep_exited_s`` ago; how many."""
        cutoff = time.monotonic() - self.keep_exited_s
        with self._lock:
            old = [
                pid
                for pid, entry in self._table.items()
                if entry.exited_at is not None and entry.exited_at <= cutoff
            ]
            for pid in old:
                del self._table[pid]
        self._last_prune = time.monotonic()
        return len(old)

    @property
    def lost(self) -> int:
        """Events the kernel dropped (socket buffer full): a gap the caller records."""
        drops = _socket_drops(self._sock) if self._sock is not None else self._drops_at_close
        # /proc/net/netlink counts each message dropped; ENOBUFS comes once per overrun.
        return self._lost_before + max(drops or 0, self._enobufs)

    @property
    def seen(self) -> int:
        """Events read."""
        return self._seen

    # -- internals ---------------------------------------------------------------------

    def _subscribe(self, sock: socket.socket) -> None:
        """Send PROC_CN_MCAST_LISTEN and wait for the kernel's ack, handling what arrives
        meanwhile. The kernel says nothing outside the initial pid/user namespaces.

        The ack is multicast to every listener, and its cn_msg seq is the kernel's own
        counter, not ours: it is told from others' by its ack field, ours + 1."""
        ack = random.getrandbits(31) | 1
        try:
            sock.send(_control(PROC_CN_MCAST_LISTEN, ack))
        except OSError as exc:
            raise LineageUnavailable(
                f"subscribe: {errno.errorcode.get(exc.errno or 0, exc)}"
            ) from exc
        deadline = time.monotonic() + ACK_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LineageUnavailable(
                    "no acknowledgement from the process-events connector "
                    "(not in the initial pid/user namespace?)"
                )
            sock.settimeout(left)
            try:
                data = sock.recv(RECV_SIZE)
            except TimeoutError:
                continue
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self._enobufs += 1
                    continue
                raise LineageUnavailable(
                    f"subscribe: {errno.errorcode.get(exc.errno or 0, exc)}"
                ) from exc
            acked = False
            for cn_ack, what, ts, body in self._messages(data):
                if what == PROC_EVENT_NONE and cn_ack == ack + 1:
                    err = _ACK_ERR.unpack_from(body)[0] if len(body) >= 4 else 0
                    if err:
                        raise LineageUnavailable(
                            f"subscribe refused: {errno.errorcode.get(err, err)} "
                            f"({os.strerror(err)})"
                        )
                    acked = True
                self._apply(what, ts, body)
            if acked:
                sock.setblocking(False)
                return

    def _seed(self) -> None:
        for pid in psutil.pids():
            read_ns = time.monotonic_ns()
            info = read_proc(pid)
            if info is None:
                continue
            with self._lock:
                entry = self._table.get(pid)
                # An event handled while subscribing (an exit, a fork's parent) stands.
                if entry is None or (entry.read_ns < read_ns and entry.exited_at is None):
                    ppid = entry.info.ppid if entry is not None else info.ppid
                    exited_at = time.monotonic() if info.exited else None
                    self._table[pid] = _Entry(replace(info, ppid=ppid), read_ns, exited_at)

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        timeout_ms = int(min(PRUNE_EVERY_S, max(self.keep_exited_s, 0.05)) * 1000)
        while not self._stopping.is_set():
            try:
                poller.poll(timeout_ms)
            except InterruptedError:
                continue
            overrun = False
            while not self._stopping.is_set():
                try:
                    data = sock.recv(RECV_SIZE)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.ENOBUFS:
                        # The kernel dropped events; the socket goes on with what follows.
                        self._enobufs += 1
                        overrun = True
                        continue
                    if exc.errno == errno.EINTR:
                        continue
                    self.error = f"recv: {errno.errorcode.get(exc.errno or 0, exc)}"
                    return
                for _ack, what, ts, body in self._messages(data):
                    self._apply(what, ts, body)
            if overrun:
                self._resync()
            if time.monotonic() - self._last_prune >= min(PRUNE_EVERY_S, self.keep_exited_s):
                self.prune()

    def _resync(self) -> None:
        """After a drop: mark exited what /proc no longer has (its exit may be among the
        lost), so it is pruned in time; processes missed alive are read when asked for."""
        with self._lock:
            live = [pid for pid, entry in self._table.items() if entry.exited_at is None]
        gone = [pid for pid in live if not os.path.exists(f"/proc/{pid}")]
        now = time.monotonic()
        with self._lock:
            for pid in gone:
                entry = self._table.get(pid)
                if entry is not None and entry.exited_at is None:
                    entry.info = replace(entry.info, exited=True)
                    entry.exited_at = now

    def _messages(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        """(cn_msg ack, what, timestamp_ns, event data) of each proc event in ``data``."""
        out: list[tuple[int, int, int, bytes]] = []
        offset = 0
        while offset + _NLMSGHDR.size <= len(data):
            length, _type, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
            if length < _NLMSGHDR.size:
                break
            start = offset + _NLMSGHDR.size
            end = min(offset + length, len(data))
            offset += (length + 3) & ~3  # NLMSG_ALIGN
            if end - start < _CN_MSG.size + _EVENT_HEAD.size:
                continue
            idx, val, _cn_seq, cn_ack, _len, _cflags = _CN_MSG.unpack_from(data, start)
            if (idx, val) != (CN_IDX_PROC, CN_VAL_PROC):
                continue
            head = start + _CN_MSG.size
            what, _cpu, ts = _EVENT_HEAD.unpack_from(data, head)
            self._seen += 1
            out.append((cn_ack, what, ts, data[head + _EVENT_HEAD.size : end]))
        return out

    def _apply(self, what: int, ts: int, body: bytes) -> None:
        if what == PROC_EVENT_FORK and len(body) >= _FORK.size:
            _ppid, parent_tgid, child_pid, child_tgid = _FORK.unpack_from(body)
            if child_pid == child_tgid:  # a new process, not a thread
                self._on_fork(parent_tgid, child_pid, ts)
        elif what == PROC_EVENT_EXEC and len(body) >= _EXEC.size:
            pid, tgid = _EXEC.unpack_from(body)
            if pid == tgid:
                self._on_exec(tgid, ts)
        elif what == PROC_EVENT_EXIT and len(body) >= _EXIT.size:
            pid, tgid, _code, _sig, _parent_pid, parent_tgid = _EXIT.unpack_from(body)
            if pid == tgid:  # a thread's exit leaves its process running
                self._on_exit(tgid, parent_tgid, ts)
        elif what == PROC_EVENT_COMM and len(body) >= _COMM.size:
            pid, tgid, raw = _COMM.unpack_from(body)
            if pid == tgid:
                comm = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
                with self._lock:
                    entry = self._table.get(tgid)
                    if entry is not None and entry.read_ns < ts:
                        entry.info = replace(entry.info, comm=comm)

    def _on_fork(self, parent: int, child: int, ts: int) -> None:
        with self._lock:
            pentry = self._table.get(parent)
            entry = self._table.get(child)
            if entry is not None and entry.exited_at is None and entry.read_ns > ts:
                # Read from /proc after this fork: keep what was read, note the real parent.
                entry.info = replace(entry.info, ppid=parent)
                return
        pinfo = pentry.info if pentry is not None else self.who(parent)
        # A fork runs its parent's image, in its parent's cgroup, under its parent's name.
        info = ProcInfo(
            pid=child,
            ppid=parent,
            exe=pinfo.exe if pinfo else None,
            cgroup=pinfo.cgroup if pinfo else None,
            comm=pinfo.comm if pinfo else None,
            markers=pinfo.markers if pinfo else (),
            run_from=pinfo.run_from if pinfo else (),
        )
        with self._lock:
            self._table[child] = _Entry(info, 0)

    def _on_exec(self, pid: int, ts: int) -> None:
        with self._lock:
            entry = self._table.get(pid)
            if entry is not None and entry.read_ns > ts:
                return  # /proc was read after this exec already
        read_ns = time.monotonic_ns()
        exe, cgroup, stat, markers = _exe(pid), cgroup_of(pid), _stat(pid), _markers(pid)
        run_from = _run_from(pid)
        with self._lock:
            entry = self._table.get(pid)
            old = entry.info if entry is not None else None
            info = ProcInfo(
                pid=pid,
                ppid=old.ppid if old is not None else (stat[0] if stat else None),
                # Gone already: the new image is unknown (the old one is not it).
                exe=exe,
                # Exec does not move a process between cgroups.
                cgroup=cgroup if cgroup is not None else (old.cgroup if old else None),
                comm=stat[1] if stat else None,
                # Gone already: its environment is its parent's, unless the exec changed it.
                markers=markers if stat is not None else (old.markers if old else ()),
                run_from=run_from,
            )
            # Alive again if marked exited: an exec from a non-leader thread reports the
            # old leader's exit first. Found gone (or a zombie): nothing live was read.
            alive = stat is not None and not stat[2]
            self._table[pid] = _Entry(info, read_ns if alive else 0)

    def _on_exit(self, pid: int, parent: int, ts: int) -> None:
        now = time.monotonic()
        with self._lock:
            entry = self._table.get(pid)
            if entry is None:
                # Never seen alive: what is left is its parent (0 on old kernels).
                info = ProcInfo(pid, parent or None, None, None, None, exited=True)
                self._table[pid] = _Entry(info, 0, now)
            elif entry.read_ns > ts and not entry.info.exited:
                return  # read alive from /proc after this exit: the pid was reused
            elif entry.exited_at is None:
                entry.info = replace(entry.info, exited=True)
                entry.exited_at = now
