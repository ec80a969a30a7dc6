"""The run's reaper: ends the run's processes when the harness dies (SIGKILL included).

A small process of its own session reads the harness's list of pids from a pipe and, at the
pipe's end-of-file (the kernel closes it whatever killed the harness), stops and SIGKILLs
each of those still alive and everything below them. It outlives the harness for that
alone. It covers CRIU restores too, which re-parent to init and so escape any parent-death
signal of the launcher, and a child the harness forked but did not live to name.

Also the /proc readings the engine names processes by (a pid and its start time).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.data import env_markers
from tasks.data.errors import CkptPocError

REPO_ROOT = Path(__file__).resolve().parents[3]
REAPER_GRACE_S = 5.0  # how long the reaper keeps killing what reappears (a restore finishing)


class ProcessError(CkptPocError):
    """A workload process could not be started or found."""


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, ...]; None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with the pid, names it uniquely,
    so a pid reused by another process is never taken for it. None if gone or a zombie."""
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of stat; fields[0] is field 3


def child_pids(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            return [int(p) for p in fh.read().split()]
    except FileNotFoundError:
        return []


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, the children of each of its threads included."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in threads:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", encoding="ascii") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except OSError:
                continue
            found.extend(kids)
            stack.extend(kids)
    return found


def _status_values(pid: int, key: str) -> list[str] | None:
    """The values of one line of /proc/PID/status (``key`` with its colon); None if gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith(key):
                    return line.split()[1:]
    except OSError:
        pass
    return None


def _is_pid_namespace_init(pid: int) -> bool:
    """Pid 1 of its own PID namespace: what every workload copy (launched or restored) is."""
    ids = _status_values(pid, "NSpid:") or []
    return len(ids) > 1 and ids[-1] == "1"


def boot_ticks() -> int:
    """Now, in the clock ticks of /proc/PID/stat's start time (less one: a process started
    from now on never reads as earlier)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK")) - 1


@dataclass(frozen=True)
class _Candidate:
    """A live process the reaper may end for an expectation: when it started and its exact
    command line (empty while its execve is under way)."""

    ticks: int
    cmdline: bytes


def _real_uid(pid: int) -> int | None:
    """The process's real user (not /proc/PID's owner, which is root for a non-dumpable
    process such as a CRIU with file capabilities); None if it is gone."""
    uids = _status_values(pid, "Uid:")
    return int(uids[0]) if uids else None


def _candidates(not_before: int, session: int, uid: int) -> dict[int, _Candidate]:
    """Live processes started at or after ``not_before`` ticks, in ``session`` and owned
    by ``uid``: only these can be a child the dead harness forked (a child keeps its
    parent's session and user until it calls setsid or setuid, and ours do neither before
    their exec). Another user's, or another session's, same command line is never taken."""
    found: dict[int, _Candidate] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        fields = _stat_fields(pid)
        if not fields or fields[0] in ("Z", "X") or int(fields[3]) != session:
            continue
        ticks = int(fields[19])
        if ticks < not_before:
            continue
        if _real_uid(pid) != uid:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                found[pid] = _Candidate(ticks, fh.read())
        except OSError:
            continue
    return found


SPAWN_ENV = env_markers.SPAWN  # names one spawn of one reaper


def spawn_token(reaper_pid: int, spawn_id: int | str) -> str:
    """SPAWN_ENV's value for one spawn: the harness sets it, the reaper looks for it."""
    return f"{reaper_pid}.{spawn_id}"


def _carries_token(pid: int, token: bytes) -> bool:
    """The process's environment names this spawn (inherited through unshare, setsid and
    exec): the same command line started by another harness does not. An environment that
    cannot be read (a non-dumpable process of another owner) is not taken as ours."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return token in b"\0" + fh.read()
    except OSError:
        return False


@dataclass
class _Expectation:
    """A process the harness is starting: its exact command line, not started before
    ``not_before``; ``misses`` counts the scans in a row that saw no sign of it."""

    cmdline: bytes
    not_before: int
    token: bytes  # SPAWN_ENV's entry in its environment, between NULs
    misses: int = 0


# An expectation is dropped only after this many scans in a row saw neither it nor a child
# that may still become it: one scan can fall inside an execve and read nothing at all.
EXPECT_MISSES = 2


def _stop(pid: int, ticks: int) -> bool:
    """SIGSTOP ``pid`` if it is still the process started at ``ticks`` (checked through a
    pidfd, so a reused pid is never signalled); False if it is gone."""
    try:
        fd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfds (a kernel before 5.3): the start time checked just before
        fd = None
    try:
        if start_ticks(pid) != ticks:
            return False
        if fd is None:
            os.kill(pid, signal.SIGSTOP)
        else:
            signal.pidfd_send_signal(fd, signal.SIGSTOP)
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def _with_descendants(victims: dict[int, int], pid: int, ticks: int) -> None:
    """Add ``pid`` (started at ``ticks``) and every live process below it to ``victims``,
    each stopped first: a process stopped cannot fork, so no child of the tree is born
    between this walk and the kill to escape it (`unshare --fork`'s child leaves the session
    and, its parent killed, is nobody's descendant)."""
    if not _stop(pid, ticks):
        return
    victims[pid] = ticks
    while True:
        new = {}
        for kid in descendants(pid):
            kid_ticks = None if kid in victims else start_ticks(kid)
            if kid_ticks is not None and _stop(kid, kid_ticks):
                new[kid] = kid_ticks
        if not new:
            return
        victims.update(new)  # walked again: a kid may have forked before it was stopped


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (the children first)."""
    for victim in [*descendants(pid), pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(victim, signal.SIGKILL)


@dataclass
class _Orders:
    """What the harness told the reaper, as it stood when the harness went."""

    tracked: dict[int, int] = field(default_factory=dict)  # pid → start ticks
    pidfiles: dict[str, int] = field(default_factory=dict)  # path → not-before ticks
    expected: dict[str, _Expectation] = field(default_factory=dict)  # spawn id → its child
    harness_cmdline: bytes = b"\0"  # no command line is that: nothing reads as it unnamed


def _read_orders(lines: Iterable[bytes]) -> _Orders:
    """Follow the harness's commands, one a line, until the pipe's end: ``track PID TICKS``
    / ``forget PID`` (a process of the run, named by pid and start time), ``pidfile PATH
    TICKS`` / ``unpidfile PATH`` (a CRIU restore in flight: the pid it will write there, a
    PID namespace's init started after TICKS), ``expect ID TICKS HEX`` / ``unexpect ID`` (a
    process being started, not yet tracked: its exact command line, hex-encoded, started
    after TICKS), ``harness HEX`` (the harness's own command line: a child before its exec
    reads as it; named on the pipe, since the reaper may start after the harness is gone)."""
    orders = _Orders()
    for raw in lines:  # ends at EOF: the harness closed the pipe, or died
        words = raw.decode("utf-8", "replace").rstrip("\n").split(" ")
        with contextlib.suppress(ValueError, IndexError):
            if words[0] == "track":
                orders.tracked[int(words[1])] = int(words[2])
            elif words[0] == "forget":
                orders.tracked.pop(int(words[1]), None)
            elif words[0] == "pidfile":
                orders.pidfiles[" ".join(words[1:-1])] = int(words[-1])
            elif words[0] == "unpidfile":
                orders.pidfiles.pop(" ".join(words[1:]), None)
            elif words[0] == "expect":
                token = f"\0{SPAWN_ENV}={spawn_token(os.getpid(), words[1])}\0".encode()
                wanted = _Expectation(bytes.fromhex(words[3]), int(words[2]), token)
                orders.expected[words[1]] = wanted
            elif words[0] == "unexpect":
                orders.expected.pop(words[1], None)
            elif words[0] == "harness":
                orders.harness_cmdline = bytes.fromhex(words[1])
    return orders


def _look_for_expected(orders: _Orders, victims: dict[int, int], session: int, uid: int) -> None:
    """The harness died between a fork and its `track`: find each expected child (this
    spawn's command line and token, in the harness's session and user) and stop its tree.
    Until its exec the child reads as the harness (inside the execve, as nothing), so while
    such a child lives the expectation is kept and looked for again."""
    expected = orders.expected
    oldest = min((e.not_before for e in expected.values()), default=0)
    candidates = _candidates(oldest, session, uid) if expected else {}
    for key, wanted in list(expected.items()):
        found = False
        may_become = False
        for pid, seen in candidates.items():
            if seen.ticks < wanted.not_before:
                continue
            if seen.cmdline == wanted.cmdline:
                if _carries_token(pid, wanted.token):
                    found = True
                    _with_descendants(victims, pid, seen.ticks)
            elif seen.cmdline in (orders.harness_cmdline, b""):
                may_become = True
        wanted.misses = 0 if found or may_become else wanted.misses + 1
        if wanted.misses >= EXPECT_MISSES:
            del expected[key]  # ended, or never started


def _victims(orders: _Orders, session: int, uid: int) -> dict[int, int]:
    """One scan: every live process of the run (pid → start ticks), each stopped."""
    victims: dict[int, int] = {}
    _look_for_expected(orders, victims, session, uid)
    for pid, ticks in orders.tracked.items():
        if start_ticks(pid) != ticks:
            continue  # gone, or the pid now names another process: never touched
        _with_descendants(victims, pid, ticks)  # and what the run's own process started
    for path, not_before in orders.pidfiles.items():
        try:
            pid = int(Path(path).read_text().strip())
        except (OSError, ValueError):
            continue
        ticks = start_ticks(pid)
        if (
            ticks is not None
            and ticks >= not_before
            and _real_uid(pid) == uid
            and _is_pid_namespace_init(pid)
        ):
            _with_descendants(victims, pid, ticks)
    return victims


def _reap_when_harness_dies(log_path: str, session: int) -> None:
    """The reaper's main: follow the harness's commands on stdin; at its end, kill what is
    the run's, again as it reappears (a restore finishing), for up to REAPER_GRACE_S.
    Stdlib only: it runs as ``python -I -S``, so it starts fast and imports nothing else."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the harness's to handle
    uid = os.getuid()  # the harness's: the reaper is its child and never changes user
    orders = _read_orders(sys.stdin.buffer)
    killed: list[str] = []
    deadline = time.monotonic() + REAPER_GRACE_S
    while True:
        victims = _victims(orders, session, uid)
        if not victims and not orders.expected:
            break
        for pid, ticks in victims.items():
            if start_ticks(pid) == ticks:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(str(pid))
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if killed:
        with contextlib.suppress(OSError), open(log_path, "a", encoding="utf-8") as fh:
            fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} killed {' '.join(killed)}\n")


class RunReaper:
    """The harness's side of the reaper: tells it which processes are the run's.

    Lines are written whole under a lock, so threads never interleave them (an ``expect``
    line, a command line in hex, may pass PIPE_BUF). The pipe's write end is close-on-exec:
    no workload or CRIU holds it, so its end-of-file means the harness is gone.
    """

    def __init__(self, log: Path) -> None:
        read_end, self._fd = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); "
                    "from tasks.engine.clusters.reaper import _reap_when_harness_dies as reap; "
                    f"reap({str(log)!r}, session={os.getsid(0)})",
                ],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # a signal to the harness's process group spares it
            )
        except BaseException:
            os.close(self._fd)
            raise
        finally:
            os.close(read_end)
        self._lock = threading.Lock()
        self._closed = False
        self._spawns = itertools.count()  # each spawn's own expectation, same argv or not
        # The pipe closes when this object goes, so an abandoned reaper exits (killing
        # whatever of the run is still alive: the run is over).
        self._finalizer = weakref.finalize(self, os.close, self._fd)
        try:
            with open("/proc/self/cmdline", "rb") as fh:
                self._send(f"harness {fh.read().hex()}")
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _send(self, line: str) -> None:
        with self._lock:
            if self._closed:
                raise ProcessError("the run's reaper is closed")
            data = memoryview((line + "\n").encode())
            try:
                while data:  # a write a signal interrupts can be partial
                    data = data[os.write(self._fd, data) :]
            except BrokenPipeError:
                raise ProcessError(
                    f"the run's reaper (pid {self._proc.pid}) is gone: processes started "
                    "now would outlive a killed harness"
                ) from None

    def track(self, pid: int) -> None:
        """End ``pid`` if the harness dies while it runs (nothing, if it is already gone)."""
        ticks = start_ticks(pid)
        if ticks is not None:
            self._send(f"track {pid} {ticks}")

    def spawn(self, argv: list[str], pidfile: Path | None = None, **popen: Any) -> subprocess.Popen:
        """``subprocess.Popen(argv, **popen)``, tracked. The reaper hears of it before the
        fork (by its exact command line, in the harness's session), so a harness killed
        between the fork and the ``track`` still has it ended. With ``pidfile`` (a CRIU
        restore), the pid written there is ended too, until ``forget_pidfile``."""
        if popen.get("start_new_session") or popen.get("process_group") is not None:
            # The reaper finds an untracked child by the harness's session: it must keep it.
            raise ValueError("a spawned process stays in the harness's session and group")
        spawn_id = next(self._spawns)
        given = popen.pop("env", None)
        env = dict(os.environ if given is None else given)
        env[SPAWN_ENV] = spawn_token(self._proc.pid, spawn_id)  # not another harness's
        not_before = boot_ticks()
        cmdline = b"".join(os.fsencode(word) + b"\0" for word in argv)
        self._send(f"expect {spawn_id} {not_before} {cmdline.hex()}")
        if pidfile is not None:
            self._send(f"pidfile {pidfile} {not_before}")
        try:
            proc = subprocess.Popen(argv, env=env, **popen)
        except (OSError, subprocess.SubprocessError):
            with contextlib.suppress(ProcessError):  # never started: nothing to look for
                self._send(f"unexpect {spawn_id}")
            raise
        # Anything else (an interrupt inside Popen, after its fork) keeps the expectation: a
        # child may run, tracked nowhere, and the reaper still ends it with the run.
        try:
            self.track(proc.pid)
        except BaseException:  # the reaper is gone: nothing would end it, so end it now
            kill_tree(proc.pid)
            proc.wait()
            raise
        # Only once tracked by pid: an interrupt before this leaves the expectation, and the
        # reaper still ends the child when the harness goes.
        with contextlib.suppress(ProcessError):
            self._send(f"unexpect {spawn_id}")
        return proc

    def forget(self, pid: int) -> None:
        with contextlib.suppress(ProcessError):  # called in cleanup: never raises
            self._send(f"forget {pid}")

    def forget_pidfile(self, pidfile: Path) -> None:
        with contextlib.suppress(ProcessError):
            self._send(f"unpidfile {pidfile}")

    def close(self, timeout: float = 10.0) -> None:
        """End the reaper (it kills what it still tracks first, as if the harness died)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._finalizer()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=timeout)
