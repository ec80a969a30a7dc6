"""Checkpoint cost benchmark: what a CRIU dump and restore of a real workload costs, next to
the raw disk it writes to and reads from, and next to starting the workload afresh.

    uv run python bench/checkpoint_cost.py                  # 64 MiB, 512 MiB, 2 GiB; 3 runs each
    uv run python bench/checkpoint_cost.py --sizes 64 --server-sizes 64 --repeats 1  # ~10 s

All in one run, on the local cluster's slot with the CRIU that ``scripts/install-criu``
provides (``tasks.engine.checkpointers.criu.CriuCheckpointer``, the same code path as the engine):

* training (``examples.train_digits --state-mb M``), per state size and run: a fresh process;
  once it prints step 3, ``criu dump --leave-running`` (wall seconds, CRIU's frozen time,
  image bytes), then the image files fsynced (the dirty data CRIU left behind); the same
  number of bytes written to a file in the image folder (buffered, then fsync; and with
  O_DIRECT, read back with O_DIRECT); the original killed; the page cache dropped (when
  permitted) and that file read back (raw read), the page cache dropped again and the
  checkpoint restored ("cold"); that process killed, and the raw read and the restore
  again with the file or the images read once just before, untimed ("warm"). Restore time
  runs from the restore call until the restored process is alive and has printed a new
  ``step=`` line (seen by a 2 ms log poll); the time until ``criu restore`` itself
  returned (process restored and detached, alive) is recorded beside it.
* serving (``examples.serve_digits --init-steps N --state-mb M``): native launch-to-ready
  (process start until ``/ready`` answers 200), cold and warm, against restore-to-ready
  (restore call until ``/ready`` 200) from a dump of the ready server, cold and warm.

Raw disk, beside each dump: the image's byte count written to a new file in the image
folder through the page cache in 1 MiB write()s (seconds until the last write() returned,
and until fsync returned) and with O_DIRECT in 16 MiB requests (no page cache: what the
disk itself does), then read back: buffered, cold (page cache dropped) and warm, and with
O_DIRECT.

Every process is started, tracked and ended through
``tasks.engine.clusters.local.cluster.LocalCluster``;
``cluster.stop_all()`` must return ``[]`` at the end (checked in ``finally``), or the run
exits 1. Images live under ``.run/bench/checkpoint-cost-<time>/`` and are deleted after each
run; the logs stay. Everything measured goes to ``.run/bench/checkpoint-cost-<time>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import mmap
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import code_version, proc_mib, self_peak_mib, write_record

from tasks.data.plan import ReadyProbe, load_plan
from tasks.data.runctx import make_run_context
from tasks.engine.checkpointers.criu import Checkpoint, CriuCheckpointer, find_criu
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.local.cluster import LocalCluster
from tasks.engine.clusters.process import WorkloadProcess
from tasks.engine.probes import LogProgressProbe, last_step_before
from tasks.engine.ready import wait_ready

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".run" / "bench"
PLAN = REPO / "plans" / "demo.yaml"
SLOT = "local-a"
STEP_RE = r"^step=(\d+) "
MIB = 1 << 20
GB = 1e9  # throughput in decimal GB/s
CHUNK = 16 * MIB  # O_DIRECT request size (and the buffer)
# Buffered write()/read() size. 1 MiB, not more: on this VM (kernel 6.18, ext4) write()s of
# 2 MiB or more into fresh page cache run at ~0.4 GB/s against 4-6 GB/s for 1 MiB ones
# (`dd bs=1M` vs `bs=2M`..`16M`), and CRIU writes its images in pipe-sized pieces.
BUFFERED_CHUNK = 1 * MIB
IMAGE_OVERHEAD_MIB = 96  # interpreter, NumPy and libraries on top of the ballast (estimate)
DISK_FACTOR = 3  # skip a size when free disk < 3x what it writes at once
DIRECT_ALIGN = 4096  # O_DIRECT sizes and buffers: multiples of the block size


class BenchError(RuntimeError):
    """A measurement could not be taken (the message says which and why)."""


# --- small helpers ----------------------------------------------------------------------------


def rss_mib(pid: int) -> float | None:
    return proc_mib(f"/proc/{pid}/status", "VmRSS")


def mem_available_mib() -> float:
    return proc_mib("/proc/meminfo", "MemAvailable") or float("nan")


def mount_of(path: Path) -> str:
    """'device on mountpoint type fstype' for the file system holding ``path``."""
    best = ("?", "/", "?")
    with contextlib.suppress(OSError), open("/proc/mounts", encoding="ascii") as fh:
        for line in fh:
            dev, mnt, fstype, *_ = line.split()
            if str(path).startswith(mnt.rstrip("/") + "/") and len(mnt) >= len(best[1]):
                best = (dev, mnt, fstype)
    return f"{best[0]} on {best[1]} type {best[2]}"


def drop_caches() -> bool:
    """sync, then drop the (guest) kernel's page cache; False when not permitted."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as fh:
            fh.write("3\n")
    except OSError:
        return False
    return True


def fsync_folder(folder: Path) -> float:
    """fsync every file in ``folder`` and the folder itself; seconds taken."""
    t = time.perf_counter()
    for f in sorted(folder.iterdir()):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t


def raw_write(path: Path, nbytes: int, buf: mmap.mmap) -> dict[str, float]:
    """Write ``nbytes`` (incompressible) to a new file: seconds until the last write()
    returned (page cache) and until fsync returned (on disk)."""
    mv = memoryview(buf)[:BUFFERED_CHUNK]
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, mv[: min(left, len(mv))])
        written = time.perf_counter()
        os.fsync(fd)
    finally:
        os.close(fd)
    done = time.perf_counter()
    return {"raw_write_s": written - t, "raw_write_fsync_s": done - t}


def raw_read(path: Path, buf: mmap.mmap) -> tuple[int, float]:
    """Read ``path`` to the end through the page cache; (bytes, seconds)."""
    mv = memoryview(buf)[:BUFFERED_CHUNK]
    total = 0
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(mv):
            total += n
    return total, time.perf_counter() - t


def direct_io(path: Path, nbytes: int, buf: mmap.mmap) -> dict[str, Any]:
    """Write ``nbytes`` (rounded up to the block size) with O_DIRECT and fsync, then read
    it back with O_DIRECT, and delete it: the disk without the page cache. Only an error
    message when the file system refuses O_DIRECT."""
    n = -(-nbytes // DIRECT_ALIGN) * DIRECT_ALIGN
    mv = memoryview(buf)
    try:
        t = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
        try:
            left = n
            while left > 0:
                left -= os.write(fd, mv[: min(left, len(mv))])
            os.fsync(fd)
        finally:
            os.close(fd)
        write_s = time.perf_counter() - t
        total = 0
        t = time.perf_counter()
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            while k := os.readv(fd, [mv]):
                total += k
        finally:
            os.close(fd)
        read_s = time.perf_counter() - t
    except OSError as exc:
        return {"direct_error": str(exc)}
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if total != n:
        raise BenchError(f"O_DIRECT read got {total} bytes of {n}")
    return {"direct_bytes": n, "direct_write_fsync_s": write_s, "direct_read_s": read_s}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"(no log at {path})"


def gbps(nbytes: float, seconds: float | None) -> float:
    return nbytes / seconds / GB if seconds else float("nan")


def median(values: list[float | None]) -> float:
    vals = [v for v in values if v is not None and v == v]
    return statistics.median(vals) if vals else float("nan")


# --- the harness ------------------------------------------------------------------------------


@dataclass
class Bench:
    cluster: LocalCluster
    recorder: EventRecorder
    criu: str
    work: Path
    buf: mmap.mmap  # page-aligned, for O_DIRECT too
    modes: list[str]  # restore/read cache states measured: ["cold", "warm"] or ["warm"]
    step_sleep: float
    poll_s: float
    init_steps: int

    def end(self, proc: WorkloadProcess) -> None:
        """Kill one of our processes and wait until it is gone; then stop tracking it, so
        ``stop_all`` never signals a pid that has since been reused by someone else."""
        self.cluster.kill(proc)
        if not self.cluster.wait_gone(proc, timeout=30):
            raise BenchError(f"pid {proc.pid} ({proc.arm}) still alive 30 s after SIGKILL")
        self.cluster.tracked.pop(proc.pid, None)

    def checkpointer(self, arm: str) -> CriuCheckpointer:
        return CriuCheckpointer(
            self.work / arm,
            keep=1,
            recorder=self.recorder,
            trial_id=f"cost-{arm}",
            arm=arm,
            binary=self.criu,
        )

    def prepare(self, mode: str, warm: list[Path] | None = None) -> dict[str, Any]:
        """Set the stage for one timed step: "cold" drops the page cache, "warm" reads the
        ``warm`` files once (untimed) so they are in it."""
        dropped = drop_caches() if mode == "cold" else False
        warmed = 0
        if mode == "warm":
            for f in warm or []:
                warmed += raw_read(f, self.buf)[0]
        return {"cache_dropped": dropped, "prewarmed_bytes": warmed}


def delete_images(ckpt: Checkpoint) -> None:
    for f in [*ckpt.path.glob("*.img"), *ckpt.path.glob("raw-*.bin")]:
        f.unlink()


def restore_train(
    b: Bench, ckpt: CriuCheckpointer, c: Checkpoint, log: Path, arm: str
) -> dict[str, Any]:
    """Restore ``c``; seconds until criu restore returned and until a new step line."""
    killed_at = log.stat().st_size
    probe = LogProgressProbe(
        log, STEP_RE, b.recorder, f"cost-{arm}", arm, poll_s=b.poll_s, record_every_step=False
    ).start()
    try:
        probe.wait_for(lambda s: True, timeout=10)  # caught up with the log before the call
        t0 = time.monotonic_ns()
        restored = ckpt.restore(b.cluster, SLOT, c)
        t_call = time.monotonic_ns()
        alive_at_return = restored.alive()
        seen = probe.wait_for(lambda s: s.offset > killed_at, timeout=120)
    finally:
        probe.stop()
    try:
        if seen is None:
            raise BenchError(
                f"restored {arm} (pid {restored.pid}, alive={restored.alive()}) printed no "
                f"step within 120 s; log tail:\n{log_tail(log)}"
            )
        if not restored.alive():
            raise BenchError(f"restored {arm} printed step {seen.step} and then died")
        first_new = min(
            int(line.split()[0].split("=")[1])
            for line in log.read_bytes()[killed_at:].decode(errors="replace").splitlines()
            if line.startswith("step=")
        )
    finally:
        b.end(restored)
    return {
        "restore_call_s": (t_call - t0) / 1e9,
        "restore_s": (seen.t_mono_ns - t0) / 1e9,
        "alive_at_return": alive_at_return,
        "first_new_step": first_new,
    }


def train_run(b: Bench, mb: int, rep: int) -> dict[str, Any]:
    arm = f"train-{mb}-r{rep}"
    ckpt = b.checkpointer(arm)
    argv = [
        sys.executable,
        "-m",
        "examples.train_digits",
        "--steps",
        "100000",
        "--state-mb",
        str(mb),
        "--step-sleep",
        str(b.step_sleep),
    ]
    out: dict[str, Any] = {"state_mb": mb, "repeat": rep}
    t0 = time.monotonic_ns()
    proc = b.cluster.start(SLOT, arm, argv)
    c: Checkpoint | None = None
    try:
        probe = LogProgressProbe(
            proc.log, STEP_RE, b.recorder, f"cost-{arm}", arm, record_every_step=False
        ).start()
        try:
            seen = probe.wait_for(lambda s: s.step >= 3, timeout=300)
        finally:
            probe.stop()
        if seen is None:
            raise BenchError(f"{arm} printed no step 3 within 300 s:\n{log_tail(proc.log)}")
        out["start_to_step3_s"] = (seen.t_mono_ns - t0) / 1e9
        out["workload_rss_mib"] = rss_mib(proc.pid)

        c = ckpt.dump(proc)
        out.update(
            image_bytes=c.image_bytes,
            dump_s=c.dump_s,
            freezing_s=c.freezing_us / 1e6 if c.freezing_us is not None else None,
            frozen_s=c.frozen_us / 1e6 if c.frozen_us is not None else None,
        )
        out["held_step"] = (
            last_step_before(proc.log, c.held_log_bytes, STEP_RE) if c.held_log_bytes else None
        )
        out["image_fsync_s"] = fsync_folder(c.path)
        raw = c.path / "raw-disk.bin"
        out.update(raw_write(raw, c.image_bytes, b.buf))
        out.update(direct_io(c.path / "raw-direct.bin", c.image_bytes, b.buf))
        b.end(proc)

        images = sorted(c.path.glob("*.img"))
        out["restores"] = {}
        for mode in b.modes:
            prep_read = b.prepare(mode, [raw])
            nbytes, read_s = raw_read(raw, b.buf)
            if nbytes != c.image_bytes:
                raise BenchError(f"raw read got {nbytes} bytes of {c.image_bytes}")
            prep_restore = b.prepare(mode, images)
            r = restore_train(b, ckpt, c, proc.log, arm)
            r.update(raw_read_s=read_s, prep_read=prep_read, prep_restore=prep_restore)
            out["restores"][mode] = r
    finally:
        if proc.pid in b.cluster.tracked and proc.alive():
            b.end(proc)
        if c is not None:
            delete_images(c)
    return out


def serve_run(b: Bench, mb: int, rep: int) -> dict[str, Any]:
    arm = f"serve-{mb}-r{rep}"
    trial = f"cost-{arm}"
    ckpt = b.checkpointer(arm)
    port = free_port()
    url = f"http://127.0.0.1:{port}/ready"
    argv = [
        sys.executable,
        "-m",
        "examples.serve_digits",
        "--port",
        str(port),
        "--init-steps",
        str(b.init_steps),
        "--state-mb",
        str(mb),
    ]
    out: dict[str, Any] = {"state_mb": mb, "repeat": rep, "init_steps": b.init_steps}

    def to_ready(start: Callable[[], WorkloadProcess]) -> tuple[WorkloadProcess, float, float]:
        """(process, seconds from the call to /ready 200, seconds the call itself took)."""
        t0 = time.monotonic_ns()
        proc = start()
        t_call = time.monotonic_ns()
        ok = wait_ready(
            ReadyProbe(url=url), b.recorder, trial, arm,
            timeout=180, poll_s=b.poll_s, alive=proc.alive,
        ).ready  # fmt: skip
        if not ok:
            alive = proc.alive()
            with contextlib.suppress(BenchError):
                b.end(proc)
            raise BenchError(
                f"{arm} (pid {proc.pid}, alive={alive}) not ready within 180 s:\n"
                f"{log_tail(proc.log)}"
            )
        ready = b.recorder.events(trial, arm, "ready")[-1].t_mono_ns
        return proc, (ready - t0) / 1e9, (t_call - t0) / 1e9

    c: Checkpoint | None = None
    try:
        out["native"], out["restore"] = {}, {}
        # Native launches: cold (page cache dropped) first, then warm; the warm one is dumped.
        for mode in b.modes:
            prep = b.prepare(mode)
            proc, secs, _ = to_ready(lambda: b.cluster.start(SLOT, arm, argv))
            out["native"][mode] = {"ready_s": secs, **prep}
            if mode != "warm":
                b.end(proc)
        out["workload_rss_mib"] = rss_mib(proc.pid)
        c = ckpt.dump(proc)
        out.update(
            image_bytes=c.image_bytes,
            dump_s=c.dump_s,
            frozen_s=c.frozen_us / 1e6 if c.frozen_us is not None else None,
        )
        fsync_folder(c.path)
        b.end(proc)
        images = sorted(c.path.glob("*.img"))
        for mode in b.modes:
            prep = b.prepare(mode, images)
            restored, secs, call = to_ready(lambda: ckpt.restore(b.cluster, SLOT, c))
            b.end(restored)
            out["restore"][mode] = {"ready_s": secs, "restore_call_s": call, **prep}
    finally:
        if c is not None:
            delete_images(c)
    return out


# --- report -----------------------------------------------------------------------------------


def _f(v: float | None, spec: str, width: int) -> str:
    if v is None or v != v:
        return f"{'-':>{width}}"
    return f"{v:>{width}{spec}}"


def train_rows(run: dict[str, Any]) -> dict[str, float | None]:
    n = run["image_bytes"]
    direct = run.get("direct_bytes")
    row: dict[str, float | None] = {
        "image_mib": n / MIB,
        "dump_s": run["dump_s"],
        "frozen_s": run["frozen_s"],
        "dump_gbps": gbps(n, run["dump_s"]),
        "image_fsync_s": run["image_fsync_s"],
        "dump_fsync_gbps": gbps(n, run["dump_s"] + run["image_fsync_s"]),
        "raw_write_gbps": gbps(n, run["raw_write_s"]),
        "raw_write_fsync_gbps": gbps(n, run["raw_write_fsync_s"]),
        "direct_write_gbps": gbps(direct, run["direct_write_fsync_s"]) if direct else None,
        "direct_read_gbps": gbps(direct, run["direct_read_s"]) if direct else None,
    }
    row["ratio_buffered"] = row["dump_gbps"] / row["raw_write_gbps"]
    row["ratio_fsync"] = row["dump_fsync_gbps"] / row["raw_write_fsync_gbps"]
    row["ratio_direct"] = (
        row["dump_fsync_gbps"] / row["direct_write_gbps"] if row["direct_write_gbps"] else None
    )
    for mode, r in run["restores"].items():
        restore_gbps = gbps(n, r["restore_s"])
        read_gbps = gbps(n, r["raw_read_s"])
        row[f"{mode}_call_s"] = r["restore_call_s"]
        row[f"{mode}_restore_s"] = r["restore_s"]
        row[f"{mode}_restore_gbps"] = restore_gbps
        row[f"{mode}_read_gbps"] = read_gbps
        row[f"{mode}_ratio"] = restore_gbps / read_gbps
        direct_read = row["direct_read_gbps"]
        row[f"{mode}_ratio_direct"] = restore_gbps / direct_read if direct_read else None
    return row


Col = tuple[str, str, str, int]  # (row key, header, format, width); format "…x": a ratio


def _table(title: str, labels: list[tuple[str, int]], cols: list[Col], lines: list) -> None:
    """Print a table: each line is (label..., row dict), one label per ``labels`` column."""
    print(title)
    head = " ".join([*(f"{h:>{w}}" for h, w in labels), *(f"{h:>{w}}" for _, h, _, w in cols)])
    print(head)
    print("-" * len(head))
    for *names, row in lines:
        cells = [f"{n:>{w}}" for n, (_, w) in zip(names, labels, strict=True)]
        for key, _, spec, w in cols:
            if spec.endswith("x"):
                cells.append(_f(row.get(key), spec[:-1], w - 1) + "x")
            else:
                cells.append(_f(row.get(key), spec, w))
        print(" ".join(cells))


def print_train(runs: list[dict[str, Any]], modes: list[str]) -> dict[str, dict[str, float]]:
    rows = {id(r): train_rows(r) for r in runs}
    medians: dict[str, dict[str, float]] = {}
    lines: list[tuple[str, str, dict[str, Any]]] = []
    for mb in sorted({r["state_mb"] for r in runs}):
        mine = [r for r in runs if r["state_mb"] == mb]
        lines += [(f"{mb}M", f"#{r['repeat']}", rows[id(r)]) for r in mine]
        med = {k: median([rows[id(r)].get(k) for r in mine]) for k in rows[id(mine[0])]}
        medians[str(mb)] = med
        lines.append((f"{mb}M", "median", med))
    labels = [("state", 6), ("run", 6)]

    _table(
        "CRIU dump",
        labels,
        [
            ("image_mib", "image MiB", ",.0f", 9),
            ("dump_s", "dump s", ".3f", 7),
            ("frozen_s", "frozen s", ".3f", 8),
            ("dump_gbps", "dump GB/s", ".2f", 9),
            ("image_fsync_s", "+fsync s", ".3f", 8),
            ("dump_fsync_gbps", "dump+fsync GB/s", ".2f", 15),
        ],
        lines,
    )
    print(
        "  dump s: `criu dump --leave-running` wall time (the workload keeps running);\n"
        "  frozen s: CRIU's own 'Frozen time' (the workload stopped; inside dump s).\n"
        "  +fsync s: fsync of the image files right after the dump (CRIU does not sync\n"
        "  them: this is what it left dirty in the page cache); dump+fsync = both."
    )
    print()
    _table(
        "Raw write of the same bytes in the same folder, and CRIU / raw",
        labels,
        [
            ("raw_write_gbps", "buffered GB/s", ".2f", 13),
            ("raw_write_fsync_gbps", "+fsync GB/s", ".2f", 11),
            ("direct_write_gbps", "O_DIRECT GB/s", ".2f", 13),
            ("ratio_buffered", "dump/buf", ".2fx", 8),
            ("ratio_fsync", "dump+fs/buf+fs", ".2fx", 14),
            ("ratio_direct", "dump+fs/direct", ".2fx", 14),
        ],
        lines,
    )
    print(
        "  buffered: until the last write() returned (into the page cache, as CRIU writes);\n"
        "  +fsync: until fsync returned; O_DIRECT: write + fsync past the page cache.\n"
        "  dump/buf: dump GB/s / buffered GB/s; dump+fs/buf+fs: dump+fsync GB/s / +fsync\n"
        "  GB/s; dump+fs/direct: dump+fsync GB/s / O_DIRECT GB/s. Above 1: CRIU faster.\n"
        "  GB/s = image bytes / seconds (1 GB = 1e9 bytes)."
    )
    print()
    restore_lines = [
        (label, run, mode, {k.removeprefix(f"{mode}_"): v for k, v in row.items()})
        for label, run, row in lines
        for mode in modes
    ]
    _table(
        "CRIU restore vs raw read of the same bytes",
        [*labels, ("cache", 5)],
        [
            ("call_s", "criu call s", ".3f", 11),
            ("restore_s", "to step s", ".3f", 9),
            ("restore_gbps", "restore GB/s", ".2f", 12),
            ("read_gbps", "raw read GB/s", ".2f", 13),
            ("ratio", "CRIU/raw", ".2fx", 8),
            ("direct_read_gbps", "O_DIRECT rd GB/s", ".2f", 16),
            ("ratio_direct", "CRIU/direct", ".2fx", 11),
        ],
        restore_lines,
    )
    poll_ms = round(runs[0]["poll_s"] * 1000) if runs else 0
    print(
        "  to step s: from the restore call until the restored process is alive and has\n"
        f"  printed a new step line (log polled every {poll_ms} ms; it may first finish the\n"
        "  step sleep it was frozen in). criu call s: until `criu restore -d` returned (the\n"
        "  process restored, detached and alive). restore GB/s = image bytes / to step s.\n"
        "  raw read: through the page cache; cold: the page cache dropped before the raw read\n"
        "  and again before the restore; warm: the file (raw) or the images (restore) read\n"
        "  once, untimed, just before. O_DIRECT rd: past the page cache (one per run).\n"
        "  median: the median of each column over the runs (ratios: median of the ratios)."
    )
    return medians


def print_serve(runs: list[dict[str, Any]], modes: list[str]) -> dict[str, dict[str, float]]:
    def row_of(r: dict[str, Any]) -> dict[str, float]:
        row = {"image_mib": r["image_bytes"] / MIB, "dump_s": r["dump_s"]}
        for m in modes:
            row[f"native_{m}_s"] = r["native"][m]["ready_s"]
            row[f"restore_{m}_s"] = r["restore"][m]["ready_s"]
            row[f"ratio_{m}"] = row[f"native_{m}_s"] / row[f"restore_{m}_s"]
        return row

    medians: dict[str, dict[str, float]] = {}
    lines: list[tuple[str, str, dict[str, Any]]] = []
    for mb in sorted({r["state_mb"] for r in runs}):
        mine = [r for r in runs if r["state_mb"] == mb]
        rows = [row_of(r) for r in mine]
        lines += [(f"{mb}M", f"#{r['repeat']}", row) for r, row in zip(mine, rows, strict=True)]
        med = {k: median([row[k] for row in rows]) for k in rows[0]}
        medians[str(mb)] = med
        lines.append((f"{mb}M", "median", med))
    cols: list[Col] = [("image_mib", "image MiB", ",.0f", 9), ("dump_s", "dump s", ".3f", 7)]
    for m in modes:
        cols += [
            (f"native_{m}_s", f"native {m} s", ".3f", 13),
            (f"restore_{m}_s", f"restore {m} s", ".3f", 14),
            (f"ratio_{m}", "nat/rst", ".2fx", 7),
        ]
    _table(
        "Server: native launch-to-ready vs restore-to-ready (/ready 200)",
        [("state", 6), ("run", 6)],
        cols,
        lines,
    )
    init = runs[0]["init_steps"] if runs else "?"
    print(
        f"  native: from starting `serve_digits --init-steps {init}` until /ready answers 200\n"
        "  (interpreter start, imports, ballast, training, warm-up); restore: from the restore\n"
        "  call until the restored server's /ready answers 200; both polled at the same\n"
        "  interval. cold: the page cache dropped just before; warm: right after a cold one\n"
        "  (native) or with the images read once, untimed, just before (restore).\n"
        "  nat/rst: native s / restore s (above 1: restoring is faster)."
    )
    return medians


# --- main -------------------------------------------------------------------------------------


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of MiB: {text!r}") from None
    if not sizes or min(sizes) < 0:
        raise argparse.ArgumentTypeError("sizes must be >= 0 MiB")
    return sizes


def room_for(mb: int, work: Path) -> str | None:
    """None when there is room for a run of ``mb`` MiB, else why not."""
    need = 2 * (mb + IMAGE_OVERHEAD_MIB) * MIB  # the images and the raw copy at once
    free = shutil.disk_usage(work).free
    if free < DISK_FACTOR * need:
        return (
            f"skipped {mb} MiB: {free / 2**30:.1f} GiB free on {work}, needs "
            f"{DISK_FACTOR} x {need / 2**30:.1f} GiB (images + raw copy)"
        )
    # The workload, and the images and the raw copy in the page cache.
    need_mib = 3 * (mb + IMAGE_OVERHEAD_MIB) + 1024
    avail = mem_available_mib()
    if avail < need_mib:
        return f"skipped {mb} MiB: {avail:,.0f} MiB memory available, needs {need_mib:,}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=_sizes, default=[64, 512, 2048], help="training MiB list")
    ap.add_argument("--server-sizes", type=_sizes, default=[64, 512], help="server --state-mb list")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--init-steps", type=int, default=300, help="server --init-steps")
    ap.add_argument("--step-sleep", type=float, default=0.02, help="training --step-sleep")
    ap.add_argument("--poll-ms", type=float, default=2.0, help="log and /ready poll interval")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")

    stamp = dt.datetime.now()
    work = CACHE / f"checkpoint-cost-{stamp:%Y%m%dT%H%M%S}"
    work.mkdir(parents=True)
    criu = find_criu()
    criu_version = subprocess.run(
        [criu, "--version"], capture_output=True, text=True, check=False
    ).stdout.split("\n")[0]
    can_drop = drop_caches()
    modes = ["cold", "warm"] if can_drop else ["warm"]
    env = {
        "time": stamp.isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "criu": f"{criu} ({criu_version})",
        "code": code_version("tasks", "examples"),
        "work": str(work),
        "filesystem": mount_of(work),
        "drop_caches_permitted": can_drop,
    }
    print(
        f"checkpoint cost benchmark  {stamp:%Y-%m-%d %H:%M}  cpus={env['cpus']} "
        f"mem={env['mem_gib']:.0f} GiB kernel={env['kernel']} code={env['code']}"
    )
    print(f"criu: {env['criu']}")
    print(f"images and raw file under {work.relative_to(REPO)} ({env['filesystem']})")
    print(
        "page cache: "
        + (
            "dropped before each cold measurement (echo 3 > /proc/sys/vm/drop_caches; the\n"
            "  guest's cache only: a virtual disk may still be cached by the host)"
            if can_drop
            else "NOT dropped (/proc/sys/vm/drop_caches not writable): every read is warm"
        )
    )
    print(
        f"training: train_digits --steps 100000 --state-mb M --step-sleep {args.step_sleep}, "
        f"M in {args.sizes} MiB; server: serve_digits --init-steps {args.init_steps}, "
        f"--state-mb in {args.server_sizes}; {args.repeats} run(s) each\n"
    )

    buf = mmap.mmap(-1, CHUNK)  # page-aligned (O_DIRECT), incompressible
    buf.write(os.urandom(CHUNK))
    plan = load_plan(PLAN).model_copy(update={"data_dir": str(work / "data")})
    recorder = EventRecorder(make_run_context(plan, PLAN))
    cluster = LocalCluster(nodes=list(plan.cluster.nodes), run_dir=work / "logs", workdir=REPO)
    bench = Bench(
        cluster=cluster,
        recorder=recorder,
        criu=criu,
        work=work,
        buf=buf,
        modes=modes,
        step_sleep=args.step_sleep,
        poll_s=args.poll_ms / 1000,
        init_steps=args.init_steps,
    )
    train: list[dict[str, Any]] = []
    serve: list[dict[str, Any]] = []
    skipped: list[str] = []
    error: str | None = None
    left: list[int] = []
    t_start = time.perf_counter()
    try:
        for mb in args.sizes:
            if why := room_for(mb, work):
                print(why)
                skipped.append(why)
                continue
            for rep in range(1, args.repeats + 1):
                print(f"  train {mb} MiB run {rep} ...", end="", flush=True)
                run = train_run(bench, mb, rep)
                run["poll_s"] = bench.poll_s
                train.append(run)
                cold = run["restores"].get("cold") or run["restores"]["warm"]
                print(
                    f" image {run['image_bytes'] / MIB:,.0f} MiB, dump {run['dump_s']:.2f}s, "
                    f"restore {cold['restore_s']:.2f}s ({modes[0]})",
                    flush=True,
                )
        for mb in args.server_sizes:
            if why := room_for(mb, work):
                print(why)
                skipped.append(why)
                continue
            for rep in range(1, args.repeats + 1):
                print(f"  serve {mb} MiB run {rep} ...", end="", flush=True)
                run = serve_run(bench, mb, rep)
                serve.append(run)
                m = modes[0]
                print(
                    f" native {run['native'][m]['ready_s']:.2f}s, "
                    f"restore {run['restore'][m]['ready_s']:.2f}s ({m})",
                    flush=True,
                )
    except Exception as exc:  # report it with what was measured; the finally stops all
        error = f"{type(exc).__name__}: {exc}"
        print(f"\nFAIL: {error}", file=sys.stderr)
    finally:
        left = cluster.stop_all()
        for folder in work.glob("*/ckpt-*"):  # whatever a failure left behind
            for f in [*folder.glob("*.img"), *folder.glob("raw-*.bin")]:
                f.unlink()
    wall = time.perf_counter() - t_start

    print()
    train_medians = print_train(train, modes) if train else {}
    if train:
        print()
    serve_medians = print_serve(serve, modes) if serve else {}
    peak = self_peak_mib()
    print()
    for why in skipped:
        print(why)
    resumed = [
        (r["state_mb"], r["repeat"], mode, r["held_step"], x["first_new_step"])
        for r in train
        for mode, x in r["restores"].items()
    ]
    off = [x for x in resumed if x[3] is None or x[4] != x[3] + 1]
    if resumed:
        print(
            f"restored training resumed at the dumped step + 1 in {len(resumed) - len(off)} of "
            f"{len(resumed)} restores"
            + (f"; not in (MiB, run, cache, held, first): {off}" if off else "")
        )
    print(f"harness peak RSS (ru_maxrss of this process): {peak:,.0f} MiB")
    print(f"wall time {wall:.0f}s; cluster.stop_all() left {left} running")
    record = write_record(
        CACHE,
        "checkpoint-cost",
        stamp,
        {
            "env": env,
            "args": {**vars(args)},
            "io": {"buffered_chunk": BUFFERED_CHUNK, "direct_chunk": CHUNK},
            "modes": modes,
            "train": train,
            "train_medians": train_medians,
            "serve": serve,
            "serve_medians": serve_medians,
            "skipped": skipped,
            "harness_peak_rss_mib": peak,
            "wall_s": wall,
            "stop_all_left": left,
            "error": error,
        },
    )
    print(f"record: {record.relative_to(REPO)}; logs under {(work / 'logs').relative_to(REPO)}")
    if left:
        print(f"FAIL: processes left running: {left}", file=sys.stderr)
        return 1
    return 1 if error else 0


if __name__ == "__main__":
    raise SystemExit(main())
