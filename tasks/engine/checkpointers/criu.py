"""CRIU checkpoints of a running workload: periodic full dumps, restore of the last complete one.

Each checkpoint is a new folder `ckpt-NNNNN`; it counts only once CRIU exited 0 and the
harness wrote its `COMPLETE` record (atomically), so a dump cut short is never restored.
The last `keep` complete checkpoints are kept. Every dump records `checkpoint_start` and
`checkpoint_end` (image bytes, dump seconds, CRIU's freezing and frozen times, and the log
bytes the frozen workload had written: what the checkpoint holds).

Each checkpointer holds a shared `flock` on `<root>/.owners.lock` while it lives; the kernel
drops it when its process ends, however it ends. A checkpointer that finds no other holder
(an exclusive lock succeeds) removes what killed owners left: folders without `COMPLETE`
and complete ones beyond `keep`. `clean_dead_roots` does the same for every root under a
folder (the runs of a PoC), so the next run cleans up after a killed one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import subprocess
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tasks.data import env_markers, settings_bare
from tasks.data.arms import MANAGED
from tasks.data.errors import CkptPocError
from tasks.data.events import Ev
from tasks.data.fingerprint import criu_binary
from tasks.engine.checkpointers import open_files
from tasks.engine.checkpointers.criu_failure import criu_failure_cause
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.process import ProcessSlots, WorkloadProcess
from tasks.engine.clusters.reaper import RunReaper, kill_tree
from tasks.engine.paths import mount_fstype

REPO_ROOT = Path(__file__).resolve().parents[3]

ACTION_SCRIPT = REPO_ROOT / "scripts" / "criu-action-script"
COMPLETE = "COMPLETE.json"
OWNERS_LOCK = ".owners.lock"  # flock-ed (shared) by every live checkpointer of the root
# The harness's own options: connections closed at restore, in-flight ones skipped; left
# out when a workload keeps its TCP connections (--tcp-established excludes them).
_HARNESS_DUMP = ("--tcp-close", "--skip-in-flight")
_HARNESS_RESTORE = ("--tcp-close",)
# CRIU's own statistics (`--display-stats`): "Frozen time: 38764 us", "Memory pages
# written: 13928 (0x3668)" after a dump; "Restore time", "Forking time", "Pages restored".
_STAT = re.compile(r"^([A-Z][A-Za-z ]+?):\s*(\d+)(?:\s*us|\s*\(0x[0-9a-f]+\))?\s*$", re.M)


# A Checkpoint's fields from CRIU's dump statistics, by the name CRIU prints.
DUMP_STATS = {
    "memdump_us": "Memory dump time",
    "memwrite_us": "Memory write time",
    "pages_scanned": "Memory pages scanned",
    "pages_written": "Memory pages written",
}


def criu_stats(output: str) -> dict[str, int]:
    """CRIU's ``--display-stats`` lines, by their name (µs for times, counts for pages)."""
    return {name: int(value) for name, value in _STAT.findall(output)}


class CriuError(CkptPocError):
    """CRIU failed; the message carries the tail of its log.

    ``cause``: CRIU's own error line that says why (None: it gave none, e.g. a timeout);
    ``wants``: the option CRIU's error names (``--tcp-established``), if it names one;
    ``log``: CRIU's log; ``rc``: its exit status (None: it did not exit on its own);
    ``workload_exited``: the workload reached its own end while CRIU dumped it."""

    def __init__(
        self,
        message: str,
        *,
        log: Path | None = None,
        rc: int | None = None,
        cause: str | None = None,
        wants: str | None = None,
    ) -> None:
        super().__init__(message)
        self.log, self.rc, self.cause, self.wants = log, rc, cause, wants
        self.workload_exited = False


def _failed(message: str, log: Path, rc: int | None) -> CriuError:
    cause, wants = criu_failure_cause(log)
    return CriuError(message, log=log, rc=rc, cause=cause, wants=wants)


def find_criu() -> str:
    """The CRIU binary: $CKPT_POC_CRIU, else the project's build, else `criu` on PATH."""
    found = criu_binary()
    if found is not None:
        return found
    raise CriuError(
        "CRIU not found: run scripts/install-criu (it builds CRIU 4.x into .tools/criu), "
        f"or set {settings_bare.env_name('criu')} to a criu binary whose `criu check` passes"
    )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text[-lines:])


@dataclass(frozen=True)
class Checkpoint:
    index: int
    path: Path
    image_bytes: int
    dump_s: float
    freezing_us: int | None
    frozen_us: int | None
    held_log_bytes: int | None  # bytes of the workload log written when it was frozen
    pid: int
    kept_bytes: int = 0  # files kept beside the images (open_files.py), put back at restore
    # CRIU's own split of the dump: collecting the pages, writing them; and how many.
    memdump_us: int | None = None
    memwrite_us: int | None = None
    pages_scanned: int | None = None
    pages_written: int | None = None

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        try:
            record = json.loads((path / COMPLETE).read_text())
            return cls(**{**record, "path": Path(record["path"])})
        except (OSError, ValueError, TypeError, KeyError):
            return None


def _try_flock(fd: int, how: int) -> bool:
    """Take a flock without waiting; False if another open file holds a conflicting one."""
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


def remove_stale_checkpoints(
    root: Path, keep: int | None, protect: Iterable[Path] = ()
) -> list[Path]:
    """Remove folders without a COMPLETE record, and complete ones beyond the newest
    ``keep`` (None: keep them all). Only call it holding ``root`` exclusively: a live
    owner's dump in progress has no COMPLETE record yet either."""
    spared = {Path(p).resolve() for p in protect}
    folders = sorted(p for p in root.glob("ckpt-*") if p.is_dir())
    complete = [p for p in folders if Checkpoint.load(p) is not None]
    stale = [p for p in folders if p not in complete]
    if keep is not None:
        stale += complete[: max(0, len(complete) - keep)]
    removed = []
    for folder in sorted(stale):
        if folder.resolve() not in spared:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


# The events whose rows carry where the images are and on what file system.
IMAGES_EVENTS = frozenset({Ev.CHECKPOINT_END, Ev.CHECKPOINT_FAILED, Ev.RESTORED, Ev.RESTORE_FAILED})


def clean_dead_roots(*parents: Path, depth: int = 3) -> list[Path]:
    """In every checkpoint root up to ``depth`` levels under each of ``parents`` whose
    owners are all gone, remove what they left (with the ``keep`` the last owner wrote). A
    root a live process holds, or whose lock cannot be taken here, is not touched."""
    removed: list[Path] = []
    locks = [
        lock
        for parent in parents
        for d in range(1, depth + 1)
        for lock in parent.glob("*/" * d + OWNERS_LOCK)
    ]
    for lock in locks:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not _try_flock(fd, fcntl.LOCK_EX):
                continue
            try:
                keep = int(json.loads(os.pread(fd, 4096, 0) or b"{}").get("keep"))
            except (ValueError, TypeError):
                keep = None  # not known: complete checkpoints stay
            removed += remove_stale_checkpoints(lock.parent, keep)
        except OSError:
            continue  # e.g. ENOLCK on a filesystem without locks: cannot tell, leave it
        finally:
            os.close(fd)
    return removed


class CriuCheckpointer:
    """Checkpoints one workload copy (the managed arm) into ``root``.

    ``protect``: checkpoint folders the start-up cleanup must leave even if stale (the one
    a restore is about to use)."""

    def __init__(
        self,
        root: Path,
        keep: int,
        recorder: EventRecorder,
        trial_id: str,
        arm: str = MANAGED,
        binary: str | None = None,
        timeout_s: float = 600,
        protect: Iterable[Path] = (),
        dump_options: Sequence[str] = (),
        restore_options: Sequence[str] = (),
        harness_options: bool = True,
    ) -> None:
        self.root = root
        self.images_fs = mount_fstype(root)  # a folder not made yet: its deepest parent's
        self.keep = keep
        # The workload's own CRIU options (plan: workload.criu, allow-listed there), after
        # the harness's: --tcp-close and --skip-in-flight unless ``harness_options`` is off
        # (the compatibility stage tries CRIU as the plan gives it) or the workload holds
        # its TCP connections (--tcp-established: the two exclude each other).
        self._harness_options = harness_options
        self.add_options(dump_options, restore_options)
        self.timeout_s = timeout_s  # one CRIU command; past it, CRIU and its children die
        self.binary = binary or find_criu()
        self.keep_files_max = settings_bare.keep_files_max()  # a leave-running dump's copies
        self._recorder, self._trial, self._arm = recorder, trial_id, arm
        self._lock = threading.Lock()  # one CRIU operation at a time
        self.last_restore_stats: dict[str, int] = {}  # CRIU's own, of the last restore
        root.mkdir(parents=True, exist_ok=True)
        self.removed_stale = self._hold_root(protect)
        self._next = 1 + max((self._index(p) for p in root.glob("ckpt-*")), default=0)

    def add_options(self, dump: Sequence[str], restore: Sequence[str]) -> None:
        """Add the workload's own options, after the harness's (allow-listed by the plan)."""
        self._own = (
            [*getattr(self, "_own", ([], []))[0], *dump],
            [*getattr(self, "_own", ([], []))[1], *restore],
        )
        own_dump, own_restore = self._own
        harness = self._harness_options
        keeps = "--tcp-established" in own_dump
        self.dump_options = [*(_HARNESS_DUMP if harness and not keeps else ()), *own_dump]
        keeps = "--tcp-established" in own_restore
        self.restore_options = [*(_HARNESS_RESTORE if harness and not keeps else ()), *own_restore]

    def _hold_root(self, protect: Iterable[Path]) -> list[Path]:
        """Hold the root (shared) for this checkpointer's life; if no one else holds it,
        first remove what dead owners left. Returns the folders removed."""
        fd = os.open(self.root / OWNERS_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        removed: list[Path] = []
        try:
            if _try_flock(fd, fcntl.LOCK_EX):
                removed = remove_stale_checkpoints(self.root, self.keep, protect)
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps({"keep": self.keep}).encode(), 0)  # for the next run
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while another start-up cleans
        except OSError:
            os.close(fd)  # no locks on this filesystem: cannot tell who lives, clean nothing
            return removed
        self._owner_fd = fd
        self._release = weakref.finalize(self, os.close, fd)
        return removed

    def close(self) -> None:
        """Let go of the root (as the end of this process would)."""
        if hasattr(self, "_release"):
            self._release()

    def record(self, event: str, **detail: object) -> Event:
        if event in IMAGES_EVENTS:  # where the images were written or read, on every row
            detail = {"images": str(self.root), "images_fs": self.images_fs, **detail}
        return self._recorder.record(self._trial, self._arm, event, **detail)

    @staticmethod
    def _index(path: Path) -> int:
        try:
            return int(path.name.split("-", 1)[1])
        except (IndexError, ValueError):
            return 0

    def _run(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        reaper: RunReaper | None = None,
        pidfile: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run CRIU; past the timeout, kill it and every process it spawned (a restore from
        damaged images can spin forever in CRIU's restorer) and raise CriuError.

        With ``reaper``, CRIU (and the pid a restore writes to ``pidfile``) dies with the
        harness: a restore the harness did not live to adopt is not left running."""
        timeout = timeout or self.timeout_s
        popen: dict[str, Any] = dict(
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        if reaper is not None:
            proc = reaper.spawn(argv, pidfile=pidfile, **popen)
        else:
            proc = subprocess.Popen(argv, **popen)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.communicate()
            raise CriuError(
                f"criu {argv[1]} did not finish within {timeout:.0f} s: killed"
            ) from None
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
        finally:
            if reaper is not None:
                reaper.forget(proc.pid)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def dump(
        self, proc: WorkloadProcess, *, leave_running: bool = True, timeout: float | None = None
    ) -> Checkpoint:
        """One full dump, leaving the workload running (``leave_running``; else CRIU ends it
        once dumped, as a fault would); raises CriuError on failure, or once ``timeout``
        seconds went by (a notice's deadline: CRIU is killed, the dump counts for nothing)."""
        with self._lock:
            index, self._next = self._next, self._next + 1
            folder = self.root / f"ckpt-{index:05d}"
            folder.mkdir()
            held = folder / "held-log-bytes"
            # Left running, it goes on writing: keep what CRIU will check at restore.
            kept = open_files.action_env(proc.pid, folder, self.keep_files_max)
            start = self.record(
                Ev.CHECKPOINT_START, index=index, pid=proc.pid, leave_running=leave_running
            )
            t0 = time.monotonic()
            done = self._run_dump(
                folder,
                [
                    self.binary,
                    "dump",
                    "-t",
                    str(proc.pid),
                    "-D",
                    str(folder),
                    *(["--leave-running"] if leave_running else []),
                    *self.dump_options,
                    "--display-stats",
                    "--action-script",
                    str(ACTION_SCRIPT),
                    "-o",
                    "dump.log",
                ],
                env={
                    env_markers.HELD_LOG: str(proc.log),
                    env_markers.HELD_OUT: str(held),
                    **(kept if leave_running else {}),
                },
                reaper=proc.reaper,
                timeout=timeout,
            )
            dump_s = time.monotonic() - t0
            if done.returncode != 0:
                raise self._dump_failed(proc, index, folder, done.returncode)
            stats = criu_stats(done.stdout + done.stderr)
            ckpt = Checkpoint(
                index=index,
                path=folder,
                image_bytes=sum(f.stat().st_size for f in folder.glob("*.img")),
                dump_s=dump_s,
                freezing_us=stats.get("Freezing time"),
                frozen_us=stats.get("Frozen time"),
                held_log_bytes=int(held.read_text()) if held.exists() else None,
                pid=proc.pid,
                kept_bytes=open_files.kept_bytes(folder),
                **{field: stats.get(name) for field, name in DUMP_STATS.items()},
            )
            record = {**asdict(ckpt), "path": str(folder)}
            tmp = folder / f".{COMPLETE}.tmp"
            tmp.write_text(json.dumps(record))
            os.replace(tmp, folder / COMPLETE)  # the checkpoint counts from here on
            self.record(
                Ev.CHECKPOINT_END,
                index=index,
                image_bytes=ckpt.image_bytes,
                dump_s=dump_s,
                freezing_us=ckpt.freezing_us,
                frozen_us=ckpt.frozen_us,
                held_log_bytes=ckpt.held_log_bytes,
                kept_bytes=ckpt.kept_bytes,
                **{field: getattr(ckpt, field) for field in DUMP_STATS},
                since_start_s=(time.monotonic_ns() - start.t_mono_ns) / 1e9,
            )
            self._prune()
            return ckpt

    def _run_dump(self, folder: Path, argv: list[str], **kw: Any) -> subprocess.CompletedProcess:
        """CRIU's dump; one that ran out of time leaves no folder behind (nothing to restore)."""
        try:
            return self._run(argv, **kw)
        except CriuError as exc:
            self.record(Ev.CHECKPOINT_FAILED, index=self._index(folder), rc=None, log_tail=str(exc))
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def _dump_failed(self, proc: WorkloadProcess, index: int, folder: Path, rc: int) -> CriuError:
        """Record a failed dump, keep its log, drop its folder; the error to raise."""
        tail = _tail(folder / "dump.log")
        exited = _gone_soon(proc)
        self.record(
            Ev.CHECKPOINT_FAILED,
            index=index,
            rc=rc,
            log_tail=tail[-2000:],
            # A workload that reached its end while CRIU dumped it: the failure is kept, and
            # said to be that, not the checkpointer's.
            workload_exited=exited,
        )
        kept = self.root / f"dump-failed-{index:05d}.log"  # a result points at it
        with contextlib.suppress(OSError):
            os.replace(folder / "dump.log", kept)
        shutil.rmtree(folder, ignore_errors=True)
        error = _failed(f"criu dump of pid {proc.pid} exited {rc}:\n{tail}", kept, rc)
        error.workload_exited = exited
        return error

    def complete(self) -> list[Checkpoint]:
        found = (Checkpoint.load(p) for p in sorted(self.root.glob("ckpt-*")))
        return [c for c in found if c is not None]

    def last_complete(self) -> Checkpoint | None:
        return self.last_complete_under(self.root)

    @staticmethod
    def last_complete_under(root: Path) -> Checkpoint | None:
        """The newest complete checkpoint in ``root`` (read from disk: another process, such
        as a Slurm job, may be the one taking them)."""
        found = (Checkpoint.load(p) for p in sorted(root.glob("ckpt-*")))
        done = [c for c in found if c is not None]
        return done[-1] if done else None

    def _prune(self) -> None:
        done = self.complete()
        for old in done[: max(0, len(done) - self.keep)]:
            shutil.rmtree(old.path, ignore_errors=True)

    def _restore_paths(self) -> tuple[Path, Path]:
        """A fresh (pidfile, log) pair for the next restore under this root."""
        n = 1 + len(list(self.root.glob("restore-*.log")))
        return self.root / f"restore-{n:05d}.pid", self.root / f"restore-{n:05d}.log"

    def _put_back(self, checkpoint: Checkpoint) -> None:
        """The files kept at the dump, written back before CRIU checks their sizes."""
        try:
            files, size = open_files.put_back(checkpoint.path)
        except OSError as exc:
            self.record(Ev.RESTORE_FAILED, index=checkpoint.index, rc=None, log_tail=str(exc))
            raise CriuError(
                f"could not put back the files checkpoint {checkpoint.path} kept: {exc}",
                cause=f"put back kept files: {exc}",
            ) from exc
        if files:
            self.record(Ev.FILES_PUT_BACK, index=checkpoint.index, files=files, bytes=size)

    def restore_attached(
        self, checkpoint: Checkpoint, timeout: float = 120
    ) -> tuple[subprocess.Popen, int]:
        """Restore in the foreground: CRIU stays the restored tree's parent until it exits,
        so a scheduler that kills the job's processes (Slurm's process group) still reaches
        the restored workload. Returns (the CRIU process, the restored workload's pid)."""
        with self._lock:
            pidfile, log = self._restore_paths()
            self.record(Ev.RESTORE_START, index=checkpoint.index)
            self._put_back(checkpoint)
            proc = subprocess.Popen(
                [
                    self.binary,
                    "restore",
                    "-D",
                    str(checkpoint.path),
                    *self.restore_options,
                    "--pidfile",
                    str(pidfile),
                    "-o",
                    str(log),
                ],
                stdin=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                if pidfile.exists() and pidfile.read_text().strip():
                    pid = int(pidfile.read_text().strip())
                    self.record(Ev.RESTORED, index=checkpoint.index, pid=pid)
                    return proc, pid
                time.sleep(0.002)
            if proc.poll() is None:
                proc.kill()
            rc = proc.wait()
            tail = _tail(log)
            self.record(Ev.RESTORE_FAILED, index=checkpoint.index, rc=rc, log_tail=tail[-2000:])
            raise _failed(
                f"criu restore of checkpoint {checkpoint.path} exited {rc} "
                f"before the workload ran:\n{tail}",
                log,
                rc,
            )

    def restore(
        self, cluster: ProcessSlots, slot: str, checkpoint: Checkpoint | None = None
    ) -> WorkloadProcess:
        """Restore the last complete checkpoint (or the one given), detached, fresh pidfile."""
        ckpt = checkpoint or self.last_complete()
        if ckpt is None:
            raise CriuError(f"no complete checkpoint under {self.root} to restore")
        with self._lock:
            pidfile, log = self._restore_paths()
            self.record(Ev.RESTORE_START, index=ckpt.index)
            try:
                self._put_back(ckpt)
                done = self._run(
                    [
                        self.binary,
                        "restore",
                        "-D",
                        str(ckpt.path),
                        "-d",
                        *self.restore_options,
                        "--display-stats",
                        "--pidfile",
                        str(pidfile),
                        "-o",
                        str(log),
                    ],
                    reaper=cluster.reaper,
                    pidfile=pidfile,
                )
                if done.returncode != 0 or not pidfile.exists():
                    tail = _tail(log)
                    self.record(
                        Ev.RESTORE_FAILED,
                        index=ckpt.index,
                        rc=done.returncode,
                        log_tail=tail[-2000:],
                    )
                    raise _failed(
                        f"criu restore of checkpoint {ckpt.path} exited {done.returncode}:\n{tail}",
                        log,
                        done.returncode,
                    )
                pid = int(pidfile.read_text().strip())
                stats = criu_stats((done.stdout or "") + (done.stderr or ""))
                self.last_restore_stats = stats
                self.record(
                    Ev.RESTORED,
                    index=ckpt.index,
                    pid=pid,
                    restore_us=stats.get("Restore time"),
                    forking_us=stats.get("Forking time"),
                    pages_restored=stats.get("Pages restored"),
                )
                return cluster.adopt(slot, self._arm, pid)
            finally:
                cluster.reaper.forget_pidfile(pidfile)  # adopted (tracked by pid), or failed


def _gone_soon(proc: WorkloadProcess, within_s: float = 1.0) -> bool:
    """Whether the process is gone, or goes within ``within_s`` (one that was exiting)."""
    deadline = time.monotonic() + within_s
    while proc.alive():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True
