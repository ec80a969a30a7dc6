"""CRIU checkpoints of a running workload: periodic full dumps, restore of the last complete one.

Each checkpoint is a new folder `ckpt-NNNNN`; it counts only once CRIU exited 0 and the
harness wrote its `COMPLETE` record (atomically), so a dump cut short is never restored.
The last `keep` complete checkpoints are kept. Every dump records `checkpoint_start` and
`checkpoint_end` (image bytes, dump seconds, CRIU's freezing and frozen times, and the log
bytes the frozen workload had written: what the checkpoint holds).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tasks.clock import Event, EventRecorder
from tasks.clusters.local import LocalCluster, WorkloadProcess
from tasks.errors import CkptPocError

REPO_ROOT = Path(__file__).resolve().parents[2]

ACTION_SCRIPT = REPO_ROOT / "scripts" / "criu-action-script"
CACHED_BUILD = REPO_ROOT / ".tools" / "criu" / "bin" / "criu"
COMPLETE = "COMPLETE.json"
_STAT = re.compile(
    r"^(Freezing time|Frozen time|Memory dump time|Memory write time):\s*(\d+)\s*us", re.M
)


class CriuError(CkptPocError):
    """CRIU failed; the message carries the tail of its log."""


def find_criu() -> str:
    """The CRIU binary: $CKPT_POC_CRIU, else the project's build, else `criu` on PATH."""
    for candidate in (os.environ.get("CKPT_POC_CRIU"), str(CACHED_BUILD), shutil.which("criu")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise CriuError(
        "CRIU not found: run scripts/install-criu (it builds CRIU 4.x into .tools/criu), "
        "or set CKPT_POC_CRIU to a criu binary whose `criu check` passes"
    )


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first found, depth first)."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children", encoding="ascii") as fh:
                kids = [int(k) for k in fh.read().split()]
        except FileNotFoundError:
            continue
        found.extend(kids)
        stack.extend(kids)
    return found


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

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        try:
            record = json.loads((path / COMPLETE).read_text())
            return cls(**{**record, "path": Path(record["path"])})
        except (OSError, ValueError, TypeError, KeyError):
            return None


class CriuCheckpointer:
    """Checkpoints one workload copy (the managed arm) into ``root``."""

    def __init__(
        self,
        root: Path,
        keep: int,
        recorder: EventRecorder,
        trial_id: str,
        arm: str = "managed",
        binary: str | None = None,
        timeout_s: float = 600,
    ) -> None:
        self.root = root
        self.keep = keep
        self.timeout_s = timeout_s  # one CRIU command; past it, CRIU and its children die
        self.binary = binary or find_criu()
        self._recorder, self._trial, self._arm = recorder, trial_id, arm
        self._lock = threading.Lock()  # one CRIU operation at a time
        root.mkdir(parents=True, exist_ok=True)
        self._next = 1 + max((self._index(p) for p in root.glob("ckpt-*")), default=0)

    def record(self, event: str, **detail: object) -> Event:
        return self._recorder.record(self._trial, self._arm, event, **detail)

    @staticmethod
    def _index(path: Path) -> int:
        try:
            return int(path.name.split("-", 1)[1])
        except (IndexError, ValueError):
            return 0

    def _run(
        self, argv: list[str], env: dict[str, str] | None = None, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run CRIU; past the timeout, kill it and every process it spawned (a restore from
        damaged images can spin forever in CRIU's restorer) and raise CriuError."""
        timeout = timeout or self.timeout_s
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in [*_descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.communicate()
            raise CriuError(
                f"criu {argv[1]} did not finish within {timeout:.0f} s: killed"
            ) from None
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def dump(self, proc: WorkloadProcess) -> Checkpoint:
        """One full dump, leaving the workload running; raises CriuError on failure."""
        with self._lock:
            index, self._next = self._next, self._next + 1
            folder = self.root / f"ckpt-{index:05d}"
            folder.mkdir()
            held = folder / "held-log-bytes"
            start = self.record("checkpoint_start", index=index, pid=proc.pid)
            t0 = time.monotonic()
            done = self._run(
                [
                    self.binary,
                    "dump",
                    "-t",
                    str(proc.pid),
                    "-D",
                    str(folder),
                    "--leave-running",
                    "--tcp-close",
                    "--skip-in-flight",
                    "--display-stats",
                    "--action-script",
                    str(ACTION_SCRIPT),
                    "-o",
                    "dump.log",
                ],
                env={"CKPT_POC_HELD_LOG": str(proc.log), "CKPT_POC_HELD_OUT": str(held)},
            )
            dump_s = time.monotonic() - t0
            if done.returncode != 0:
                tail = _tail(folder / "dump.log")
                self.record(
                    "checkpoint_failed",
                    index=index,
                    rc=done.returncode,
                    log_tail=tail[-2000:],
                )
                shutil.rmtree(folder, ignore_errors=True)
                raise CriuError(f"criu dump of pid {proc.pid} exited {done.returncode}:\n{tail}")
            stats = {k: int(v) for k, v in _STAT.findall(done.stdout + done.stderr)}
            ckpt = Checkpoint(
                index=index,
                path=folder,
                image_bytes=sum(f.stat().st_size for f in folder.glob("*.img")),
                dump_s=dump_s,
                freezing_us=stats.get("Freezing time"),
                frozen_us=stats.get("Frozen time"),
                held_log_bytes=int(held.read_text()) if held.exists() else None,
                pid=proc.pid,
            )
            record = {**asdict(ckpt), "path": str(folder)}
            tmp = folder / f".{COMPLETE}.tmp"
            tmp.write_text(json.dumps(record))
            os.replace(tmp, folder / COMPLETE)  # the checkpoint counts from here on
            self.record(
                "checkpoint_end",
                index=index,
                image_bytes=ckpt.image_bytes,
                dump_s=dump_s,
                freezing_us=ckpt.freezing_us,
                frozen_us=ckpt.frozen_us,
                held_log_bytes=ckpt.held_log_bytes,
                since_start_s=(time.monotonic_ns() - start.t_mono_ns) / 1e9,
            )
            self._prune()
            return ckpt

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

    def restore_attached(
        self, checkpoint: Checkpoint, timeout: float = 120
    ) -> tuple[subprocess.Popen, int]:
        """Restore in the foreground: CRIU stays the restored tree's parent until it exits,
        so a scheduler that kills the job's processes (Slurm's process group) still reaches
        the restored workload. Returns (the CRIU process, the restored workload's pid)."""
        with self._lock:
            pidfile, log = self._restore_paths()
            self.record("restore_start", index=checkpoint.index)
            proc = subprocess.Popen(
                [
                    self.binary,
                    "restore",
                    "-D",
                    str(checkpoint.path),
                    "--tcp-close",
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
                    self.record("restored", index=checkpoint.index, pid=pid)
                    return proc, pid
                time.sleep(0.002)
            if proc.poll() is None:
                proc.kill()
            rc = proc.wait()
            tail = _tail(log)
            self.record("restore_failed", index=checkpoint.index, rc=rc, log_tail=tail[-2000:])
            raise CriuError(
                f"criu restore of checkpoint {checkpoint.path} exited {rc} "
                f"before the workload ran:\n{tail}"
            )

    def restore(
        self, cluster: LocalCluster, slot: str, checkpoint: Checkpoint | None = None
    ) -> WorkloadProcess:
        """Restore the last complete checkpoint (or the one given), detached, fresh pidfile."""
        ckpt = checkpoint or self.last_complete()
        if ckpt is None:
            raise CriuError(f"no complete checkpoint under {self.root} to restore")
        with self._lock:
            pidfile, log = self._restore_paths()
            self.record("restore_start", index=ckpt.index)
            done = self._run(
                [
                    self.binary,
                    "restore",
                    "-D",
                    str(ckpt.path),
                    "-d",
                    "--tcp-close",
                    "--pidfile",
                    str(pidfile),
                    "-o",
                    str(log),
                ],
            )
            if done.returncode != 0 or not pidfile.exists():
                tail = _tail(log)
                self.record(
                    "restore_failed",
                    index=ckpt.index,
                    rc=done.returncode,
                    log_tail=tail[-2000:],
                )
                raise CriuError(
                    f"criu restore of checkpoint {ckpt.path} exited {done.returncode}:\n{tail}"
                )
            pid = int(pidfile.read_text().strip())
            self.record("restored", index=ckpt.index, pid=pid)
            return cluster.adopt(slot, self._arm, pid)


class PeriodicCheckpoints:
    """Dump every ``interval_s`` on a schedule; a tick that comes while a dump still runs is
    recorded as `checkpoint_skipped`, never queued behind it."""

    def __init__(
        self, checkpointer: CriuCheckpointer, proc: WorkloadProcess, interval_s: float
    ) -> None:
        self.checkpointer, self.proc, self.interval_s = checkpointer, proc, interval_s
        self.errors: list[CriuError] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="checkpoints", daemon=True)

    def start(self) -> PeriodicCheckpoints:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _run(self) -> None:
        origin = time.monotonic()
        tick = 1
        while not self._stop.wait(max(0.0, origin + tick * self.interval_s - time.monotonic())):
            if not self.proc.alive():
                return
            try:
                self.checkpointer.dump(self.proc)
            except CriuError as exc:
                self.errors.append(exc)
            # Ticks that fell due while that dump ran are skipped, and recorded as such.
            due = int((time.monotonic() - origin) // self.interval_s)
            if due > tick:
                self.checkpointer.record(
                    "checkpoint_skipped",
                    ticks=due - tick,
                    reason="previous dump still running",
                )
            tick = due + 1
