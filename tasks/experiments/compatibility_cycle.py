"""One checkpoint → kill → restore cycle of a running workload, aimed at a moment.

The moments (``CYCLE_MOMENTS``), and how each is found:

- ``app-checkpoint``: the workload writing its own checkpoint. The harness reads the
  copy's open files (``/proc/PID/fd`` of every process of the copy, every 0.5 ms) from the
  step before a checkpoint step on; as soon as a file in the checkpoint's folder named like
  it (``ckpt.npz`` → ``.ckpt.npz.tmp`` too) is open for writing, it stops the copy there
  (SIGSTOP: CRIU's own start-up takes longer than a small write), dumps it stopped,
  restores it stopped and continues it (SIGCONT). Whether the dump holds the open file is
  read from CRIU's own image (``files.img`` names every file the frozen tree held open):
  ``caught``; a checkpoint step that went by with no such file seen is ``caught: no``.
- ``io``: the workload writing. Its processes' write counters (``/proc/PID/io`` wchar) are
  read every 0.5 ms; the dump starts at the first increase (``caught``: one was seen).
- ``periodic``: what the managed arm's periodic checkpoints do. At the target step the copy
  is dumped with ``--leave-running``, runs on for ``RUN_ON_S`` (writing on into its own
  files), and then a fault kills it; the restore is from that earlier dump. The files the
  copy writes have grown since: the checkpoint kept them and puts them back
  (tasks/engine/checkpointers/open_files.py), else CRIU refuses (range.md's "bad size").
- ``steady``: at the target step, whatever it is doing (``caught`` is null).

Every other dump ends the workload (no ``--leave-running``: what a fault does). Before the
restore every dumped process must have left /proc (a zombie's PID makes ``criu restore`` fail
with "File exists", range.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tasks.data.datasets import CYCLE_MOMENTS
from tasks.engine.checkpointers.criu import Checkpoint, CriuCheckpointer, CriuError
from tasks.engine.clusters.process import MachineSlots, WorkloadProcess
from tasks.engine.clusters.reaper import descendants
from tasks.engine.paths import mount_fstype
from tasks.experiments.checkpoints import dump_phases

POLL_S = 0.0005
RUN_ON_S = 0.5  # a periodic cycle: how long the copy runs on between its dump and the fault
PIDS_GONE_S = 10.0  # what a killed, dumped tree may take to leave /proc


@dataclass
class CycleRecord:
    """One cycle as the dataset and the result hold it."""

    cycle: int
    moment: str
    target_step: int | None = None
    caught: bool | None = None
    step: int | None = None
    dump: str | None = None  # ok | failed (None: never tried)
    freeze_s: float | None = None
    dump_s: float | None = None
    dump_memdump_s: float | None = None
    dump_memwrite_s: float | None = None
    dump_pages_scanned: int | None = None
    dump_pages_written: int | None = None
    image_bytes: int | None = None
    images_dir: str | None = None
    images_fs: str | None = None
    restore: str = "not tried"
    restore_s: float | None = None
    restore_fork_s: float | None = None
    resumed_step: int | None = None
    query: str | None = None
    cause: str | None = None
    wants_option: str | None = None
    criu_log: str | None = None

    @property
    def ok(self) -> bool:
        return self.dump == "ok" and self.restore == "ok"


def moment_of(cycle: int, has_app_checkpoint: bool) -> str:
    """The moments in turn (cycle 1 first at the application's own checkpoint, when it has
    one), so that any three cycles cover each."""
    moments = CYCLE_MOMENTS if has_app_checkpoint else CYCLE_MOMENTS[1:]
    return moments[(cycle - 1) % len(moments)]


def tree_of(proc: WorkloadProcess) -> list[int]:
    return [proc.pid, *descendants(proc.pid)]


def _wchar(pids: list[int]) -> int:
    """Bytes the processes have written so far (/proc/PID/io wchar). Read from /proc, not
    psutil: polled every POLL_S (0.5 ms), where psutil costs 2.3x the CPU (127 vs 54 µs for
    4 pids) and its open_files 2.8x (763 vs 271 µs, longer than the poll itself)."""
    total = 0
    for pid in pids:
        with (
            contextlib.suppress(OSError, ValueError, StopIteration),
            open(f"/proc/{pid}/io", encoding="ascii") as fh,
        ):
            total += next(int(ln.split()[1]) for ln in fh if ln.startswith("wchar:"))
    return total


def _names_like(name: str) -> Callable[[str], bool]:
    stem = name.rsplit(".", 1)[0]
    return lambda other: name in other or (len(stem) >= 3 and stem in other)


def open_for_write(pids: list[int], folder: Path, name: str) -> Path | None:
    """A file in ``folder`` named like ``name`` that one of ``pids`` holds open to write."""
    like = _names_like(name)
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = Path(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
            if target.parent != folder or not like(target.name):
                continue
            flags = 0
            with (
                contextlib.suppress(OSError, ValueError, StopIteration),
                open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii") as fh,
            ):
                flags = next(int(ln.split()[1], 8) for ln in fh if ln.startswith("flags:"))
            if flags & 0o3:  # O_WRONLY or O_RDWR
                return target
    return None


def wait_for_moment(
    moment: str,
    proc: WorkloadProcess,
    checkpoint_file: Path | None,
    give_up: Callable[[], bool],
) -> tuple[bool | None, Path | None]:
    """Block until ``moment`` (or ``give_up()``); (seen, the open checkpoint file)."""
    if moment in ("steady", "periodic"):  # at the target step, whatever it is doing
        return None, None
    last = _wchar(tree_of(proc))
    while proc.alive() and not give_up():
        pids = tree_of(proc)
        if moment == "app-checkpoint" and checkpoint_file is not None:
            found = open_for_write(pids, checkpoint_file.parent, checkpoint_file.name)
            if found is not None:
                return True, found
        elif moment == "io":
            now = _wchar(pids)
            if now > last:
                return True, None
            last = now
        time.sleep(POLL_S)
    return False, None


def image_holds(checkpoint: Checkpoint, path: Path) -> bool | None:
    """Whether CRIU's image names ``path`` among the files the frozen tree held open (None:
    no files.img to read)."""
    image = checkpoint.path / "files.img"
    try:
        return os.fsencode(str(path)) in image.read_bytes()
    except OSError:
        return None


def wait_pids_gone(pids: list[int], timeout: float = PIDS_GONE_S) -> list[int]:
    """Wait until no pid of ``pids`` is in /proc (zombies included); those still there."""
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if os.path.exists(f"/proc/{p}")]
        if left:
            time.sleep(0.005)
    return left


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _drop_launcher(proc: WorkloadProcess) -> None:
    """End the copy's `unshare` launcher (the copy runs on without it, as a restored copy
    does): killed with its child, it would write `unshare: sigprocmask unblock failed` into
    the copy's log after the dump, a line the workload never wrote."""
    launcher = proc.launcher
    if launcher is not None and launcher.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            launcher.kill()
        launcher.wait()


def dump_and_end(
    criu: CriuCheckpointer,
    cluster: MachineSlots,
    proc: WorkloadProcess,
    record: CycleRecord,
    found: Path | None,
) -> Checkpoint | None:
    """Dump (CRIU ends the copy once dumped); fill the record's dump half. None: the dump
    failed, and the copy runs on (CRIU lets a tree it could not dump go)."""
    pids = tree_of(proc)
    _drop_launcher(proc)
    if found is not None:  # stopped inside its own checkpoint write, dumped stopped
        signal_all(pids, signal.SIGSTOP)
    try:
        point = criu.dump(proc, leave_running=False)
    except CriuError as exc:
        _dump_failed(record, exc)
        if found is not None:
            signal_all(pids, signal.SIGCONT)
        return None
    _dumped(record, point)
    if record.moment == "app-checkpoint" and found is not None:
        record.caught = image_holds(point, found)
    _end(cluster, proc, pids, record)
    return point


def dump_run_on_and_end(
    criu: CriuCheckpointer,
    cluster: MachineSlots,
    proc: WorkloadProcess,
    record: CycleRecord,
    log: Path,
) -> Checkpoint | None:
    """A periodic checkpoint and a later fault: dump left running, run on ``RUN_ON_S``,
    kill. The log is cut back to what the dump held: the lines written after it are work the
    fault lost, which the restored copy writes again (else a fidelity check of the log would
    see them twice). None: the dump failed, and the copy runs on."""
    pids = tree_of(proc)
    _drop_launcher(proc)
    try:
        point = criu.dump(proc, leave_running=True)
    except CriuError as exc:
        _dump_failed(record, exc)
        return None
    _dumped(record, point)
    time.sleep(RUN_ON_S)
    _end(cluster, proc, pids, record)
    if point.held_log_bytes is not None:
        os.truncate(log, point.held_log_bytes)
    return point


def _dump_failed(record: CycleRecord, exc: CriuError) -> None:
    record.dump = "failed"
    record.cause = exc.cause or str(exc).splitlines()[0]
    record.wants_option = exc.wants
    record.criu_log = str(exc.log) if exc.log else None


def _dumped(record: CycleRecord, point: Checkpoint) -> None:
    record.dump = "ok"
    record.dump_s = point.dump_s
    record.freeze_s = point.frozen_us / 1e6 if point.frozen_us is not None else None
    for column, value in dump_phases(dataclasses.asdict(point)).items():
        setattr(record, column, value)
    record.image_bytes = point.image_bytes + point.kept_bytes  # what a restore needs
    record.images_dir, record.images_fs = str(point.path.parent), mount_fstype(point.path)


def _end(
    cluster: MachineSlots, proc: WorkloadProcess, pids: list[int], record: CycleRecord
) -> None:
    """Kill what is left of the dumped tree and wait until its pids are free again."""
    with contextlib.suppress(Exception):
        cluster.kill(proc)  # CRIU ended it already, or the fault does here
    cluster.wait_gone(proc, timeout=PIDS_GONE_S)
    left = wait_pids_gone(pids)
    if left:
        record.cause = f"dumped processes {left} still in /proc after {PIDS_GONE_S:.0f} s"


def restore_copy(
    criu: CriuCheckpointer,
    cluster: MachineSlots,
    slot: str,
    point: Checkpoint,
    log: Path,
    record: CycleRecord,
    stopped: bool = False,
) -> WorkloadProcess | None:
    """Restore ``point`` (``stopped``: it was dumped stopped, and is continued); fill the
    record's restore half (None: it failed)."""
    t0 = time.monotonic()
    try:
        proc = criu.restore(cluster, slot, point)
    except CriuError as exc:
        record.restore = "failed"
        record.cause = exc.cause or str(exc).splitlines()[0]
        record.wants_option = exc.wants
        record.criu_log = str(exc.log) if exc.log else None
        return None
    record.restore_s = time.monotonic() - t0
    fork_us = criu.last_restore_stats.get("Forking time")
    record.restore_fork_s = fork_us / 1e6 if fork_us is not None else None
    proc.log = log  # the restored copy writes on into the same log (its fd was restored)
    if stopped:  # dumped stopped, restored stopped: it goes on from inside its write
        signal_all(tree_of(proc), signal.SIGCONT)
    return proc
