"""The local cluster: the plan's nodes are named slots on this machine.

Each workload copy starts from an argv list in its own PID namespace and session
(`unshare --pid --fork setsid ARGV`), so a CRIU restore never collides with a
lingering PID, with stdout and stderr appended to a log in the run folder. Every process the
engine starts or restores is tracked by pid and ended by pid when the run ends or fails.

When the harness itself dies (SIGKILL included), a reaper ends the run's processes: a small
process of its own session that reads the harness's list of pids from a pipe and, at the
pipe's end-of-file (the kernel closes it whatever killed the harness), SIGKILLs each of
those still alive. It outlives the harness for that alone. It covers CRIU restores too,
which re-parent to init and so escape any parent-death signal of the launcher.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tasks.data.errors import BlastRadiusError, CkptPocError
from tasks.engine.interpreter import resolve_workload_argv, workload_env

if TYPE_CHECKING:  # pydantic loads only where a plan is read: a Slurm job's wrapper starts fast
    from tasks.data.plan import Plan

REPO_ROOT = Path(__file__).resolve().parents[3]
# No --kill-child (a parent-death signal on the workload): CRIU dumps and restores it, and a
# restored copy would then die as soon as `criu restore -d` exits. The reaper ends copies.
LAUNCHER = ["unshare", "--pid", "--fork", "setsid"]
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


def _is_pid_namespace_init(pid: int) -> bool:
    """Pid 1 of its own PID namespace: what every workload copy (launched or restored) is."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    return len(ids) > 1 and ids[-1] == "1"
    except OSError:
        pass
    return False


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
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


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


SPAWN_ENV = "CKPT_POC_SPAWN"  # names one spawn of one reaper: REAPER_PID.SPAWN_ID


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
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfds (a kernel before 5.3): the start time checked just before
        if start_ticks(pid) != ticks:
            return False
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGSTOP)
        return True
    try:
        if start_ticks(pid) != ticks:
            return False
        signal.pidfd_send_signal(fd, signal.SIGSTOP)
        return True
    except OSError:
        return False
    finally:
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


def _reap_when_harness_dies(log_path: str, session: int) -> None:
    """The reaper's main: follow the harness's commands on stdin; at its end, kill.

    Commands, one a line: ``track PID TICKS`` / ``forget PID`` (a process of the run, named
    by pid and start time), ``pidfile PATH TICKS`` / ``unpidfile PATH`` (a CRIU restore in
    flight: the pid it will write there, a PID namespace's init started after TICKS),
    ``expect ID TICKS HEX`` / ``unexpect ID`` (a process being started, not yet tracked:
    its exact command line, hex-encoded, started after TICKS, in the harness's ``session``),
    ``harness HEX`` (the harness's own command line: a child before its exec reads as it).
    The harness names itself on the pipe: the reaper may start after the harness is gone.
    Stdlib only: it runs as ``python -I -S``, so it starts fast and imports nothing else.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is the harness's to handle
    uid = os.getuid()  # the harness's: the reaper is its child and never changes user
    tracked: dict[int, int] = {}
    pidfiles: dict[str, int] = {}
    expected: dict[str, _Expectation] = {}
    harness_cmdline = b"\0"  # no command line is that: nothing reads as the harness unnamed
    for raw in sys.stdin.buffer:  # ends at EOF: the harness closed the pipe, or died
        words = raw.decode("utf-8", "replace").rstrip("\n").split(" ")
        with contextlib.suppress(ValueError, IndexError):
            if words[0] == "track":
                tracked[int(words[1])] = int(words[2])
            elif words[0] == "forget":
                tracked.pop(int(words[1]), None)
            elif words[0] == "pidfile":
                pidfiles[" ".join(words[1:-1])] = int(words[-1])
            elif words[0] == "unpidfile":
                pidfiles.pop(" ".join(words[1:]), None)
            elif words[0] == "expect":
                token = f"\0{SPAWN_ENV}={os.getpid()}.{words[1]}\0".encode()
                expected[words[1]] = _Expectation(bytes.fromhex(words[3]), int(words[2]), token)
            elif words[0] == "unexpect":
                expected.pop(words[1], None)
            elif words[0] == "harness":
                harness_cmdline = bytes.fromhex(words[1])
    killed: list[str] = []
    deadline = time.monotonic() + REAPER_GRACE_S
    while True:
        victims: dict[int, int] = {}
        # The harness died between a fork and its `track`. Until its exec the child reads as
        # the harness (and, inside the execve, as nothing), so while such a child lives the
        # expectation is kept and looked for again.
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
                elif seen.cmdline in (harness_cmdline, b""):
                    may_become = True
            wanted.misses = 0 if found or may_become else wanted.misses + 1
            if wanted.misses >= EXPECT_MISSES:
                del expected[key]  # ended, or never started
        for pid, ticks in tracked.items():
            if start_ticks(pid) != ticks:
                continue  # gone, or the pid now names another process: never touched
            _with_descendants(victims, pid, ticks)  # and what the run's own process started
        for path, not_before in pidfiles.items():
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
        if not victims and not expected:
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
                    "from tasks.engine.clusters.local import _reap_when_harness_dies as reap; "
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
        env = dict(popen.pop("env", None) or os.environ)
        env[SPAWN_ENV] = f"{self._proc.pid}.{spawn_id}"  # this spawn's, not another harness's
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


@dataclass
class WorkloadProcess:
    """One running copy: the workload's own pid (host view), its slot, arm and log."""

    slot: str
    arm: str
    pid: int
    log: Path
    launcher: subprocess.Popen | None = None  # the `unshare` parent, when we started it
    reaper: RunReaper | None = None  # what ends the copy (and its CRIU) if the harness dies

    def alive(self) -> bool:
        return pid_alive(self.pid)


@dataclass
class LocalCluster:
    """Named slots on this machine; everything it starts is tracked and ended by pid."""

    kind: ClassVar[str] = "local"
    nodes: list[str]
    run_dir: Path
    workdir: Path  # where workload commands run (their relative paths resolve here)
    tracked: dict[int, WorkloadProcess] = field(default_factory=dict)
    workload: str = ""  # the plan's workload name, for the samplers' attribution
    _reaper: RunReaper | None = field(default=None, init=False, repr=False)

    @classmethod
    def for_plan(cls, plan: Plan, run_dir: Path, workdir: Path) -> LocalCluster:
        return cls(list(plan.cluster.nodes), run_dir, workdir, workload=plan.workload.name)

    @property
    def reaper(self) -> RunReaper:
        """The run's reaper, started before the run's first process."""
        if self._reaper is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._reaper = RunReaper(self.run_dir / "reaper.log")
        return self._reaper

    def _check_slot(self, slot: str) -> None:
        if slot not in self.nodes:
            raise BlastRadiusError(f"slot {slot!r} is not one of the plan's nodes {self.nodes}")

    def labels(self, slot: str, arm: str, tag: str) -> dict[str, str]:
        """Environment that names the copy: the samplers read it from /proc/<pid>/environ to
        tie CPU and GPU use to the PoC job, and CRIU restores it with the process."""
        return {
            "CKPT_POC_NODE": slot,
            "CKPT_POC_ARM": arm,
            "CKPT_POC_JOB": f"{self.run_dir.name}/{slot}-{arm}{'-' + tag if tag else ''}",
            "CKPT_POC_TRIAL": tag,
            "CKPT_POC_WORKLOAD": self.workload,
        }

    def log_path(self, slot: str, arm: str, tag: str = "") -> Path:
        return self.run_dir / f"{slot}-{arm}{'-' + tag if tag else ''}.log"

    def start(
        self,
        slot: str,
        arm: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        timeout: float = 10.0,
        tag: str = "",
    ) -> WorkloadProcess:
        """Start ``argv`` in a new PID namespace and session on ``slot``; ``tag`` names
        its log apart from other copies of the same arm (one log per trial)."""
        self._check_slot(slot)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        reaper = self.reaper
        log = self.log_path(slot, arm, tag)
        with open(log, "ab") as out:  # append mode: CRIU restores it whatever it grew to
            launcher = reaper.spawn(
                [*LAUNCHER, *resolve_workload_argv(argv)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env={**workload_env(), **self.labels(slot, arm, tag), **(env or {})},
                cwd=self.workdir,
            )
        try:
            deadline = time.monotonic() + timeout
            while not (kids := child_pids(launcher.pid)):
                if launcher.poll() is not None or time.monotonic() > deadline:
                    raise ProcessError(f"could not start {argv[0]!r} on {slot}: see {log}")
                time.sleep(0.002)
            reaper.track(kids[0])
        except BaseException:
            for pid in [*child_pids(launcher.pid), launcher.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            launcher.wait()
            reaper.forget(launcher.pid)
            raise
        proc = WorkloadProcess(slot, arm, kids[0], log, launcher, reaper)
        self.tracked[proc.pid] = proc
        return proc

    def adopt(self, slot: str, arm: str, pid: int, tag: str = "") -> WorkloadProcess:
        """Track a process the engine did not fork (a CRIU restore re-parents to init)."""
        self._check_slot(slot)
        proc = WorkloadProcess(slot, arm, pid, self.log_path(slot, arm, tag), reaper=self.reaper)
        self.tracked[pid] = proc
        self.reaper.track(pid)
        return proc

    def kill(self, proc: WorkloadProcess, sig: int = signal.SIGKILL) -> None:
        """Signal one of this run's own processes (and nothing else)."""
        if proc.pid not in self.tracked:
            raise BlastRadiusError(f"pid {proc.pid} is not a process this run started")
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)

    def wait_gone(self, proc: WorkloadProcess, timeout: float = 10.0) -> bool:
        """Wait until the process is gone; a gone process is no longer tracked (its pid may
        be reused by another process, which must never be signalled)."""
        deadline = time.monotonic() + timeout
        while proc.alive() and time.monotonic() < deadline:
            if proc.launcher is not None:
                proc.launcher.poll()  # reap our own child so it cannot linger as a zombie
            time.sleep(0.005)
        if proc.launcher is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.launcher.wait(timeout=max(0.0, deadline - time.monotonic()))
        gone = not proc.alive()
        if gone:
            self.tracked.pop(proc.pid, None)
            if proc.reaper is not None:
                proc.reaper.forget(proc.pid)
                if proc.launcher is not None and proc.launcher.returncode is not None:
                    proc.reaper.forget(proc.launcher.pid)
        return gone

    def stop_all(self, timeout: float = 10.0) -> list[int]:
        """End every tracked process that is still alive, by pid (SIGKILL: a namespace's
        pid 1 ignores SIGTERM); return the pids still alive afterwards (empty: all gone)."""
        for proc in list(self.tracked.values()):
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        return [p.pid for p in list(self.tracked.values()) if not self.wait_gone(p, timeout)]

    def close(self) -> None:
        """The run is over: end the reaper (after ``stop_all``, it finds nothing to kill)."""
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None
