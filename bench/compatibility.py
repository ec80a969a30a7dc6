"""Compatibility benchmark: per application of the range, CRIU's checkpoint cycle beside the
application's own checkpoint, side by side in one run.

    uv run python bench/compatibility.py                       # every workload, 3 repeats
    uv run python bench/compatibility.py --apps lammps-melt,redis --repeats 5
    uv run python bench/compatibility.py --quick               # the shipped examples, 1 repeat

The applications are ``plans/range.yaml``'s workloads (tasks/data/plan_workload.py), each
started as the compatibility stage starts a copy (tasks/experiments/compatibility_copy.py:
its folder, port, ``prepare`` commands and env) on the local cluster's slot. Per repeat, on
two fresh copies:

* **CRIU**: the copy runs until its own first checkpoint is complete (so both arms hold the
  same state) and logs one more step (a service: until it answers); then one cycle through
  the compatibility stage's own code (``dump_and_end``: the dump ends the copy, as a fault
  would; ``restore_copy``): CRIU's *Frozen time*, dump s, restore s (``criu restore``
  returned), image bytes, and restore → work again (a new progress step / the service
  answers). Stop → resume = dump s + restore → work s.
* **own**: the application's own checkpoint. A file (``app_checkpoint.path``): from the
  moment the file that becomes it is created in its folder (a temporary name, renamed) until
  it is complete under its name (renamed into place, or closed after writing), seen by
  inotify; its bytes. Redis: a ``SAVE`` command's round trip; dump.rdb's bytes. Then the copy
  is killed (SIGKILL) and launched again with ``resume_args`` (Redis: the same command, which
  loads dump.rdb): launch → the first progress step computed past the checkpoint (a program
  that logs every K steps first prints the step it starts from: a line past that one; Redis:
  PING answers PONG, no longer LOADING, and DBSIZE is what it was). Stop → resume = write s
  + resume s.
  A workload with no own checkpoint (digits-serve) gets a fresh launch → ready instead.

Ratios are CRIU / own (below 1: CRIU smaller or faster). A failure of either arm is that
row's cause, never a crash of the run. Images are deleted after each repeat; logs stay under
``.run/bench/compatibility-<time>/``; the record is ``.run/bench/compatibility-<time>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import glob
import os
import platform
import resource
import select
import shutil
import socket
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import code_version, self_peak_mib, write_record

from tasks.data.fingerprint import collect_fingerprint, tool_version_of
from tasks.data.plan import Workload, load_plan
from tasks.data.runctx import make_run_context
from tasks.engine.checkpointers.criu import CriuCheckpointer, CriuError, find_criu
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.local.cluster import LocalCluster
from tasks.engine.clusters.process import WorkloadProcess
from tasks.engine.probes import LogProgressProbe, StepSeen, _Inotify, last_step_before
from tasks.engine.ready import wait_ready
from tasks.experiments.compatibility import is_service
from tasks.experiments.compatibility_copy import Copy, make_copy, run_prepare
from tasks.experiments.compatibility_cycle import (
    CycleRecord,
    dump_and_end,
    restore_copy,
    tree_of,
    wait_pids_gone,
)

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".run" / "bench"
PLAN = REPO / "plans" / "range.yaml"
QUICK_APPS = ["digits-train", "digits-serve"]
MIB = 1 << 20
POLL_S = 0.002  # ready and Redis PING polls
RSS_POLL_S = 0.005  # the CRIU-process RSS sampler
# After a service answered, before its dump: it closes that connection first (CRIU then sees
# its listening socket only; the compatibility stage's QUERY_SETTLE_S).
SETTLE_S = 0.05
# <sys/inotify.h>: what a checkpoint file's writer does in its folder.
IN_MODIFY, IN_CLOSE_WRITE, IN_OPEN = 0x2, 0x8, 0x20
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE = 0x40, 0x80, 0x100
WATCH_MASK = IN_MODIFY | IN_CLOSE_WRITE | IN_OPEN | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE


class Failed(Exception):
    """One arm of one repeat could not be measured; the message is the row's cause."""


# --- watching the application's own checkpoint ------------------------------------------------


class CheckpointWatch:
    """inotify on the checkpoint's folder, read by a thread blocked in select (µs latency,
    no polling): when a file named ``name`` is complete (renamed into place, or closed after
    writing), how long since the file it came from was first created, opened or written."""

    def __init__(self, folder: Path, name: str) -> None:
        self.name = os.fsencode(name)
        self._ino = _Inotify()
        self._ino.add_watch(folder, WATCH_MASK)
        self._first: dict[bytes, float] = {}  # name -> first create/open/modify seen
        self._moved_from: float | None = None  # when the file just renamed was first seen
        self.done: list[tuple[float, float]] = []  # (started, completed) monotonic seconds
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckpt-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._ino.fd], [], [], 0.05)
            if not ready:
                continue
            now = time.monotonic()
            for _wd, mask, name in self._ino.read():
                if mask & (IN_CREATE | IN_OPEN | IN_MODIFY):
                    self._first.setdefault(name, now)
                started = None
                if mask & IN_MOVED_FROM:  # IN_MOVED_TO of the same rename comes next
                    self._moved_from = self._first.pop(name, None)
                elif mask & IN_MOVED_TO and name == self.name:
                    started = self._moved_from
                elif mask & IN_CLOSE_WRITE and name == self.name:
                    started = self._first.pop(name, None)  # written in place
                if started is not None:
                    with self._cond:
                        self.done.append((started, now))
                        self._cond.notify_all()

    def wait(self, timeout: float, alive: Callable[[], bool]) -> tuple[float, float] | None:
        """The first complete checkpoint (started, completed); None on timeout or death."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self.done:
                if time.monotonic() > deadline or not alive():
                    return None
                self._cond.wait(0.05)
            return self.done[0]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._ino.close()


# --- Redis: its own SAVE, and readiness, over its wire protocol ---------------------------------


def resp(port: int, *args: str, timeout: float = 60) -> bytes:
    """One Redis command on a fresh connection (closed before any dump: CRIU then sees no
    established TCP connection, as the plan's options for Redis assume); its first reply line."""
    wire = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(wire.encode())
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    return reply.strip()


def is_redis(w: Workload) -> bool:
    return bool(w.command) and Path(w.command[0]).name == "redis-server"


def redis_up(port: int, proc: WorkloadProcess, timeout: float) -> bool:
    """PING answers PONG (not -LOADING: the data set is in memory)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.alive():
        with contextlib.suppress(OSError):
            if resp(port, "PING", timeout=1) == b"+PONG":
                return True
        time.sleep(POLL_S)
    return False


# --- the run's shared state --------------------------------------------------------------------


@dataclass
class Bench:
    cluster: LocalCluster
    recorder: EventRecorder
    run_dir: Path
    slot: str
    timeout_s: float
    criu_peak: dict[str, float] = field(default_factory=dict)  # app -> sampled CRIU RSS MiB
    current: str = ""

    def start(self, copy: Copy, tag: str, extra: list[str] | None = None) -> WorkloadProcess:
        argv = [*copy.argv, *(extra or [])]
        return self.cluster.start(self.slot, "bench", argv, copy.env, tag=tag)

    def end(self, proc: WorkloadProcess | None) -> None:
        if proc is not None and proc.pid in self.cluster.tracked:
            pids = tree_of(proc)
            with contextlib.suppress(Exception):
                self.cluster.kill(proc)
            self.cluster.wait_gone(proc)
            wait_pids_gone(pids)


def sample_criu_rss(bench: Bench, stop: threading.Event) -> None:
    """The summed RSS of this process's `criu` children (dump or restore, and the tasks a
    restore forks before they become the workload), every RSS_POLL_S, kept per app."""
    import psutil

    me = psutil.Process()
    while not stop.wait(RSS_POLL_S):
        total = 0
        with contextlib.suppress(psutil.Error):
            for p in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if p.name() == "criu":
                        total += p.memory_info().rss
        if total and bench.current:
            key = bench.current
            bench.criu_peak[key] = max(bench.criu_peak.get(key, 0.0), total / MIB)


def probe_for(bench: Bench, w: Workload, proc: WorkloadProcess) -> LogProgressProbe | None:
    if w.progress_probe is None or w.progress_probe.log_regex is None or is_service(w):
        return None
    regex = w.progress_probe.log_regex
    return LogProgressProbe(proc.log, regex, bench.recorder, f"bench-{w.name}", "bench").start()


def wait_step(
    probe: LogProgressProbe, proc: WorkloadProcess, ok: Callable[[StepSeen], bool], timeout: float
) -> StepSeen | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = probe.wait_for(ok, 0.05)
        if seen is not None or not proc.alive():
            return seen or probe.wait_for(ok, 0.2)
    return None


def wait_service(bench: Bench, copy: Copy, proc: WorkloadProcess) -> bool:
    if copy.ready_probe is not None:
        trial = f"bench-{copy.workload.name}"
        return wait_ready(
            copy.ready_probe,
            bench.recorder,
            trial,
            "bench",
            timeout=bench.timeout_s,
            poll_s=POLL_S,
            alive=proc.alive,
            log=proc.log,
        ).ready
    if is_redis(copy.workload) and copy.port is not None:
        return redis_up(copy.port, proc, bench.timeout_s)
    raise Failed("a service with neither a ready_probe url nor Redis's PING")


def checkpoint_path(copy: Copy) -> Path | None:
    app = copy.workload.app_checkpoint
    return Path(copy.fill(app.path)) if app is not None and app.path else None


def new_copy(bench: Bench, w: Workload, index: int, name: str) -> Copy:
    prepared = bench.run_dir / "prepared" / w.name  # {prepared}: shared by the run's copies
    copy = make_copy(w, f"workloads.{index}", name, bench.run_dir, bench.cluster.workdir, prepared)
    run_prepare(copy, bench.timeout_s)
    return copy


# --- the two arms ------------------------------------------------------------------------------


# long: one CRIU cycle in order (start, wait for the same state as the own arm, dump, restore,
# back at work), with its cleanup
def criu_arm(bench: Bench, w: Workload, index: int, rep: int) -> dict[str, Any]:
    copy = new_copy(bench, w, index, f"criu-{rep}")
    target = checkpoint_path(copy)
    watch = CheckpointWatch(target.parent, target.name) if target else None
    proc = bench.start(copy, f"{w.name}-criu-{rep}")
    probe = probe_for(bench, w, proc)
    criu = CriuCheckpointer(
        copy.copy_dir / "criu",
        1,
        bench.recorder,
        f"bench-{w.name}",
        "bench",
        timeout_s=min(bench.timeout_s, 600),
        dump_options=w.criu.dump,
        restore_options=w.criu.restore,
        harness_options=False,  # as the compatibility stage: CRIU with the plan's options only
    )
    new: WorkloadProcess | None = None
    try:
        if watch is not None and watch.wait(bench.timeout_s, proc.alive) is None:
            raise Failed(f"its own first checkpoint {target} never completed")
        if probe is not None:
            last = probe.last.step if probe.last else -1
            if wait_step(probe, proc, lambda s: s.step > last, bench.timeout_s) is None:
                raise Failed(f"no progress step after step {last}")
        elif not wait_service(bench, copy, proc):
            raise Failed("the service never answered")
        else:
            time.sleep(SETTLE_S)
        record = CycleRecord(rep, "steady")
        point = dump_and_end(criu, bench.cluster, proc, record, None)
        if point is None:
            raise Failed(f"dump failed: {record.cause}" + _wants(record))
        out: dict[str, Any] = {
            "freeze_s": record.freeze_s,
            "dump_s": record.dump_s,
            "image_bytes": record.image_bytes,
        }
        if probe is not None and point.held_log_bytes is not None:
            out["frozen_step"] = last_step_before(proc.log, point.held_log_bytes, probe.pattern)
        after = proc.log.stat().st_size
        t0 = time.monotonic()
        new = restore_copy(criu, bench.cluster, bench.slot, point, proc.log, record)
        if new is None:
            raise Failed(f"restore failed: {record.cause}" + _wants(record))
        out["restore_s"] = record.restore_s
        if probe is not None:
            # A step past the frozen one: a line it was frozen in the middle of completes at
            # once, and is no work done after the restore (the own arm waits the same way).
            frozen = out.get("frozen_step")
            past = -1 if frozen is None else frozen
            seen = wait_step(
                probe, new, lambda s: s.offset > after and s.step > past, bench.timeout_s
            )
            if seen is None:
                raise Failed(f"restored, then no progress step past {frozen}")
            out["resumed_step"] = seen.step
        elif not wait_service(bench, copy, new):
            raise Failed("restored, then the service never answered")
        out["restore_to_work_s"] = time.monotonic() - t0
        out["stop_to_resume_s"] = out["dump_s"] + out["restore_to_work_s"]
        return out
    except CriuError as exc:
        raise Failed(f"CRIU: {exc.cause or str(exc).splitlines()[0]}") from None
    finally:
        if watch is not None:
            watch.close()
        if probe is not None:
            probe.stop()
        bench.end(new)
        bench.end(proc)
        criu.close()
        for img in (copy.copy_dir / "criu").glob("ckpt-*/*.img"):
            img.unlink()


def _wants(record: CycleRecord) -> str:
    return f" (CRIU asks for {record.wants_option})" if record.wants_option else ""


def own_redis(bench: Bench, w: Workload, copy: Copy, rep: int) -> dict[str, Any]:
    """SAVE's round trip, dump.rdb's bytes; killed, relaunched (loads dump.rdb) → PONG."""
    assert copy.port is not None
    proc = bench.start(copy, f"{w.name}-own-{rep}")
    again: WorkloadProcess | None = None
    try:
        if not redis_up(copy.port, proc, bench.timeout_s):
            raise Failed("redis-server never answered PING")
        keys = resp(copy.port, "DBSIZE")
        t0 = time.monotonic()
        said = resp(copy.port, "SAVE", timeout=bench.timeout_s)
        write_s = time.monotonic() - t0
        if said != b"+OK":
            raise Failed(f"SAVE answered {said!r}")
        rdb = copy.copy_dir / "dump.rdb"
        out: dict[str, Any] = {"write_s": write_s, "bytes": rdb.stat().st_size, "how": "SAVE"}
        bench.end(proc)
        t0 = time.monotonic()
        again = bench.start(copy, f"{w.name}-own-{rep}-resumed")
        if not redis_up(copy.port, again, bench.timeout_s):
            raise Failed("relaunched, redis-server never answered PING")
        out["resume_s"] = time.monotonic() - t0
        if (now := resp(copy.port, "DBSIZE")) != keys:
            raise Failed(f"relaunched with DBSIZE {now!r}, saved with {keys!r}")
        out["stop_to_resume_s"] = out["write_s"] + out["resume_s"]
        return out
    finally:
        bench.end(again)
        bench.end(proc)


def own_file(bench: Bench, w: Workload, copy: Copy, target: Path, rep: int) -> dict[str, Any]:
    """Its checkpoint file written (inotify), killed, relaunched with resume_args → a step
    past the checkpoint."""
    assert w.app_checkpoint is not None
    watch = CheckpointWatch(target.parent, target.name)
    proc = bench.start(copy, f"{w.name}-own-{rep}")
    probe = probe_for(bench, w, proc)
    again: WorkloadProcess | None = None
    probe2: LogProgressProbe | None = None
    try:
        done = watch.wait(bench.timeout_s, proc.alive)
        if done is None:
            raise Failed(f"its own checkpoint {target.name} never completed")
        held = probe.last.step if probe is not None and probe.last else None
        out: dict[str, Any] = {"write_s": done[1] - done[0], "bytes": target.stat().st_size}
        out |= {"how": f"{target.name} written", "held_step": held}
        bench.end(proc)
        t0 = time.monotonic()
        again = bench.start(copy, f"{w.name}-own-{rep}-resumed", w.app_checkpoint.resume_args)
        probe2 = probe_for(bench, w, again)
        if probe2 is None or held is None:
            raise Failed("no progress step to resume past")
        first = wait_step(probe2, again, lambda s: True, bench.timeout_s)
        if first is None:
            raise Failed(f"relaunched with {w.app_checkpoint.resume_args}: no progress step")
        out["first_line_s"] = time.monotonic() - t0
        if first.step < held:  # it started afresh, not from its checkpoint
            raise Failed(f"relaunched from step {first.step}, not from its checkpoint ({held})")
        # A step computed after the launch: one that logs every step (digits, sklearn) has
        # computed any step past ``held``; one that logs every K (LAMMPS's thermo, mdrun -v)
        # first prints the step it starts from, so only a line past that one counts.
        steps = [x.step for x in probe.seen[-2:]] if probe is not None else []
        per_step = len(steps) == 2 and steps[1] - steps[0] == 1
        past = held if per_step else max(held, first.step)
        seen = wait_step(probe2, again, lambda s: s.step > past, bench.timeout_s)
        if seen is None:
            raise Failed(f"relaunched with {w.app_checkpoint.resume_args}: no step past {past}")
        out["resume_s"] = time.monotonic() - t0
        out |= {"resumed_step": seen.step, "first_step": first.step, "logs_every_step": per_step}
        out["stop_to_resume_s"] = out["write_s"] + out["resume_s"]
        return out
    finally:
        watch.close()
        for p in (probe, probe2):
            if p is not None:
                p.stop()
        bench.end(again)
        bench.end(proc)


def own_fresh(bench: Bench, w: Workload, copy: Copy, rep: int) -> dict[str, Any]:
    """No own checkpoint: what it has instead is a fresh launch (to ready)."""
    t0 = time.monotonic()
    proc = bench.start(copy, f"{w.name}-own-{rep}")
    try:
        if not is_service(w) or not wait_service(bench, copy, proc):
            raise Failed("no own checkpoint, and no ready service to time a fresh start by")
        resume_s = time.monotonic() - t0
        return {"how": "fresh start", "resume_s": resume_s, "stop_to_resume_s": resume_s}
    finally:
        bench.end(proc)


def own_arm(bench: Bench, w: Workload, index: int, rep: int) -> dict[str, Any]:
    copy = new_copy(bench, w, index, f"own-{rep}")
    if is_redis(w):
        return own_redis(bench, w, copy, rep)
    target = checkpoint_path(copy)
    if target is not None:
        return own_file(bench, w, copy, target, rep)
    return own_fresh(bench, w, copy, rep)


def measured(arm: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """An arm's numbers, or its cause (a failure is a row, never a crash of the run)."""
    t0 = time.monotonic()
    try:
        out = arm(*args)
    except Failed as exc:
        out = {"error": str(exc)}
    except Exception as exc:  # bad input (BadInput), a copy that would not start, ...
        out = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        out["traceback"] = traceback.format_exc(limit=4)
    out["wall_s"] = time.monotonic() - t0
    return out


def mpi_leftovers(before: set[str]) -> list[str]:
    """What Open MPI left on the node since ``before`` (session folders, vader segments):
    removed, and said (tests/integration/test_range_sweep.py does the same)."""
    now = set(glob.glob("/tmp/ompi.*/*")) | set(glob.glob("/dev/shm/vader_segment.*"))
    left = sorted(now - before)
    for path in left:
        if Path(path).is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            Path(path).unlink(missing_ok=True)
    return left


# --- the table ---------------------------------------------------------------------------------

CRIU_KEYS = ["freeze_s", "dump_s", "restore_s", "restore_to_work_s", "image_bytes"]
OWN_KEYS = ["write_s", "resume_s", "bytes"]
STOP_KEY = "stop_to_resume_s"


def summary(runs: list[dict[str, Any]], keys: list[str]) -> dict[str, Any]:
    """Median and spread (max − min) of each key over the runs that measured it."""
    out: dict[str, Any] = {"n": len([r for r in runs if "error" not in r])}
    for k in keys:
        values = [r[k] for r in runs if r.get(k) is not None and "error" not in r]
        if values:
            out[k] = {"median": statistics.median(values), "spread": max(values) - min(values)}
    return out


def ratio(a: dict[str, Any], ka: str, b: dict[str, Any], kb: str) -> float | None:
    x, y = a.get(ka, {}).get("median"), b.get(kb, {}).get("median")
    return x / y if x is not None and y else None


def _cell(value: float | None, spec: str, width: int) -> str:
    return f"{'—' if value is None else format(value, spec):>{width}}"


COLS: list[tuple[str, str, str, str, float, int]] = [
    # (arm, key, header, format, scale, width)
    ("criu", "freeze_s", "frozen s", ".3f", 1, 8),
    ("criu", "dump_s", "dump s", ".3f", 1, 7),
    ("criu", "restore_s", "restore s", ".3f", 1, 9),
    ("criu", "restore_to_work_s", "→work s", ".3f", 1, 7),
    ("criu", "image_bytes", "image MiB", ",.1f", MIB, 9),
    ("own", "write_s", "own write ms", ".2f", 1e-3, 12),
    ("own", "resume_s", "own resume s", ".3f", 1, 12),
    ("own", "bytes", "own MiB", ",.2f", MIB, 8),
]


def print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'application':>14} {'':>6} " + " ".join(f"{h:>{w}}" for *_, h, _, _, w in COLS)
    head += f" {'bytes C/O':>9} {'stop→resume C/O':>15} {'criu RSS MiB':>12} {'ok C, O':>9}"
    print("CRIU's cycle beside the application's own checkpoint (median, then spread = max − min)")
    print(head)
    print("-" * len(head))
    for row in rows:
        for what in ("median", "spread"):
            cells = []
            for arm, key, _h, spec, scale, w in COLS:
                stat = row[f"{arm}_summary"].get(key)
                cells.append(_cell(stat[what] / scale if stat else None, spec, w))
            name = row["app"] if what == "median" else ""
            label = f"{what} " if what == "median" else what
            line = f"{name:>14} {label:>6} " + " ".join(cells)
            if what == "median":
                bytes_r, stop_r = row["ratio_bytes"], row["ratio_stop_to_resume"]
                line += f" {_cell(bytes_r, '.2f', 8)}x" if bytes_r else f" {'—':>9}"
                line += f" {_cell(stop_r, '.2f', 14)}x" if stop_r else f" {'—':>15}"
                line += f" {_cell(row['criu_peak_rss_mib'], ',.0f', 12)}"
                n = len(row["criu"])
                ok = f"{row['criu_summary']['n']}/{n}, {row['own_summary']['n']}/{n}"
                line += f" {ok:>9}"
            print(line)
    print(
        "  frozen s: CRIU's own 'Frozen time'; dump s: `criu dump` (ends the copy); restore s:\n"
        "  until `criu restore -d` returned; →work s: restore call → a new progress step (a\n"
        "  service: it answers); image: CRIU's image bytes. own write ms: its checkpoint file\n"
        "  from creation to complete under its name (inotify), or Redis SAVE's round trip;\n"
        "  own resume s: relaunch with its resume args → a progress step past the checkpoint\n"
        "  (Redis: PONG with the same DBSIZE; digits-serve, no own checkpoint: fresh start →\n"
        "  ready). C/O: CRIU / own, of the medians (image bytes / own bytes; stop→resume =\n"
        "  dump + →work against write + resume). criu RSS: the CRIU processes' summed RSS,\n"
        f"  sampled every {RSS_POLL_S * 1000:.0f} ms (peak; a short spike can fall between).\n"
        "  ok C, O: repeats measured / run, CRIU and own (a failed one's cause is below)."
    )


# --- main --------------------------------------------------------------------------------------


def _apps(text: str) -> list[str]:
    apps = [a.strip() for a in text.split(",") if a.strip()]
    if not apps:
        raise argparse.ArgumentTypeError("give at least one workload name")
    return apps


# long: the run in order (arguments, plan, the two arms per app and repeat, table, record)
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--apps", type=_apps, help="workload names of plans/range.yaml (default all)")
    ap.add_argument("--repeats", type=int, help="repeats per app and arm (default 3; --quick 1)")
    ap.add_argument("--quick", action="store_true", help=f"{','.join(QUICK_APPS)}, 1 repeat")
    ap.add_argument("--timeout", type=float, default=120, help="one wait, seconds")
    ap.add_argument("--out", type=Path, default=CACHE, help="folder for the record and logs")
    args = ap.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    if repeats < 1:
        ap.error("--repeats must be >= 1")

    stamp = dt.datetime.now()
    out_dir: Path = args.out.resolve()
    work = out_dir / f"compatibility-{stamp:%Y%m%dT%H%M%S}"
    work.mkdir(parents=True)
    plan = load_plan(PLAN).model_copy(update={"data_dir": str(work / "data")})
    names = [w.name for w in plan.workloads]
    apps = args.apps or (QUICK_APPS if args.quick else names)
    if unknown := sorted(set(apps) - set(names)):
        ap.error(f"no workload {', '.join(unknown)} in {PLAN.name} (it has {', '.join(names)})")
    criu = find_criu()
    env = {
        "time": stamp.isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "criu": f"{criu} ({tool_version_of(collect_fingerprint(), 'criu')})",
        "code": code_version("tasks", "examples", "bench", "plans"),
        "plan": str(PLAN.relative_to(REPO)),
        "work": str(work),
    }
    print(
        f"compatibility benchmark  {stamp:%Y-%m-%d %H:%M}  cpus={env['cpus']} "
        f"mem={env['mem_gib']:.0f} GiB kernel={env['kernel']} code={env['code']}"
    )
    print(f"criu: {env['criu']}; plan {env['plan']}; apps {', '.join(apps)}; {repeats} repeat(s)")
    recorder = EventRecorder(make_run_context(plan, PLAN))
    cluster = LocalCluster(list(plan.cluster.nodes), work / "logs", REPO)
    bench = Bench(cluster, recorder, work, plan.cluster.nodes[0], args.timeout)
    stop = threading.Event()
    sampler = threading.Thread(target=sample_criu_rss, args=(bench, stop), daemon=True)
    sampler.start()
    rows: list[dict[str, Any]] = []
    left: list[int] = []
    t_start = time.perf_counter()
    try:
        for w in plan.workloads:
            if w.name not in apps:
                continue
            index = names.index(w.name)
            before = set(glob.glob("/tmp/ompi.*/*")) | set(glob.glob("/dev/shm/vader_segment.*"))
            row: dict[str, Any] = {"app": w.name, "criu": [], "own": []}
            mpi_left: list[str] = []
            for rep in range(1, repeats + 1):
                bench.current = w.name
                c = measured(criu_arm, bench, w, index, rep)
                bench.current = ""
                # Every copy's mpirun is pid 1 in its namespace: a killed one's session folder
                # (/tmp/ompi.<host>.<uid>/pid.1) and segments break the next copy's start
                # (gmx_mpi segfaulted; a dump met a ghost file there), so each arm starts clean.
                mpi_left += mpi_leftovers(before)
                o = measured(own_arm, bench, w, index, rep)
                mpi_left += mpi_leftovers(before)
                row["criu"].append(c)
                row["own"].append(o)
                print(f"  {w.name} #{rep}: criu " + _brief(c) + "; own " + _brief(o), flush=True)
            row["mpi_left"] = mpi_left
            row["criu_summary"] = summary(row["criu"], [*CRIU_KEYS, STOP_KEY])
            row["own_summary"] = summary(row["own"], [*OWN_KEYS, STOP_KEY])
            row["ratio_bytes"] = ratio(
                row["criu_summary"], "image_bytes", row["own_summary"], "bytes"
            )
            row["ratio_stop_to_resume"] = ratio(
                row["criu_summary"], STOP_KEY, row["own_summary"], STOP_KEY
            )
            row["criu_peak_rss_mib"] = bench.criu_peak.get(w.name)
            rows.append(row)
    finally:
        stop.set()
        sampler.join(timeout=5)
        left = cluster.stop_all()
        cluster.close()
        recorder.flush()
    wall = time.perf_counter() - t_start

    print()
    print_table(rows)
    print()
    for row in rows:
        for arm in ("criu", "own"):
            for i, r in enumerate(row[arm], 1):
                if "error" in r:
                    print(f"  {row['app']} {arm} #{i}: {r['error']}")
        how = {r.get("how") for r in row["own"] if r.get("how")}
        if how:
            print(f"  {row['app']} own: {', '.join(sorted(how))}")
        if row["mpi_left"]:
            print(f"  {row['app']}: Open MPI left (removed): {', '.join(row['mpi_left'])}")
    peak = self_peak_mib()
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"bench peak RSS (ru_maxrss of this process): {peak:,.0f} MiB")
    print(
        f"children's peak RSS (ru_maxrss, the largest waited-for child: CRIU, launchers and\n"
        f"  what they waited for; a child starts with this process's RSS): {children:,.0f} MiB"
    )
    print(f"wall time {wall:.0f}s; cluster.stop_all() left {left} running")
    record = write_record(
        out_dir,
        "compatibility",
        stamp,
        {
            "env": env,
            "args": {**vars(args), "repeats": repeats, "apps": apps},
            "rows": rows,
            "bench_peak_rss_mib": peak,
            "children_peak_rss_mib": children,
            "wall_s": wall,
            "stop_all_left": left,
        },
    )
    print(f"record: {_shown(record)}; logs under {_shown(work / 'logs')}")
    return 1 if left else 0


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _brief(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"FAILED ({r['error'][:100]})"
    parts = [f"{k}={r[k]:.3f}" for k in ("dump_s", "write_s", "resume_s") if r.get(k) is not None]
    parts += [f"{STOP_KEY}={r[STOP_KEY]:.3f}"] if r.get(STOP_KEY) is not None else []
    return " ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
