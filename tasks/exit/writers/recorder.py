"""The writer recorder: who changed what on an install node, from the before_install snapshot
to the after_uninstall recheck.

A test node is never quiet (monitoring agents, cron jobs, package timers, other admins'
shells, the scheduler's prolog), and the exit snapshots alone cannot say who wrote a file
that persists. This process watches the file systems the snapshots cover with fanotify
(tasks/exit/writers/fanotify.py) and follows process lineage as it happens
(tasks/exit/writers/lineage.py), so each change is tied to the process that made it: its
executable, cgroup (a Slurm job's names the job) and whether it or an ancestor is the
PoC's. A writer it cannot resolve is recorded as ``unresolved``, never guessed.

Writes are aggregated per (path, writer) — first and last time, count, what happened —
so a weeks-long PoC stays small. Its gaps (fanotify or lineage unavailable, a file system it
could not mark, events lost to a queue overflow, the recorder not running) are rows: a change
inside a gap can never be called the node's own. The log is written atomically to
``out`` every ``flush_s`` and at the end (SIGTERM), with the time of its last flush: a
recorder killed outright leaves a log whose end is a gap.

    python -m tasks.exit.writers.recorder SPEC.json

SPEC: {"node", "out", "paths" (what the snapshots watch), "skip" (folders never recorded:
the PoC's data folders, /proc, /sys), "poc_folders" (an executable there is the PoC's),
"poc_pids" (the harness's processes), "installed_globs" and "manifests" (the install's
executables and units: tasks/exit/writers/installed.py), "flush_s"}.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tasks.exit.collectors.processes import under
from tasks.exit.writers.fanotify import FanotifyGroup, FanotifyUnavailable, FileEvent
from tasks.exit.writers.installed import InstalledSet
from tasks.exit.writers.lineage import Lineage, LineageUnavailable, ProcInfo, read_proc

FLUSH_S = 5.0
EXECS_KEPT = 65536  # pids whose latest exec is remembered
EXEC_FILES = 3  # the files of a pid's latest execs kept: a script, its interpreter
LINEAGE_TRIES, LINEAGE_WAIT_S = 5, 0.005  # a writer's ancestry not known yet: ask again
LOG_NAME = "writers.json"


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


@dataclass(frozen=True)
class Writer:
    """Who made a write: its executable and cgroup, and whose it is (``side``) with why."""

    exe: str | None
    cgroup: str | None
    side: str  # poc | node | unresolved (tasks.data.datasets.WRITER_SIDES)
    why: str

    @property
    def key(self) -> tuple[str | None, str | None, str]:
        return (self.exe, self.cgroup, self.side)


def is_loader(path: str) -> bool:
    """The ELF interpreter an exec opens after the executable (ld-linux…so)."""
    name = os.path.basename(path)
    return name.startswith("ld-") and ".so" in name


def writer_of(
    chain: list[ProcInfo],
    poc_pids: frozenset[int],
    poc_folders: tuple[str, ...],
    installed: InstalledSet | None = None,
) -> Writer:
    """Whose a write is, from its writer's ancestry (the writer first): the PoC's when it or
    an ancestor is one of the harness's processes, carries a PoC marker, runs an executable
    from the PoC's folders, or runs an executable or in a unit the install created or
    changed (``installed``: a daemon the install enabled has no PoC ancestry); the node's
    when its whole known ancestry is none of those; unresolved when the writer itself could
    not be read."""
    if not chain or (chain[0].exe is None and not chain[0].markers):
        pid = chain[0].pid if chain else "?"
        return Writer(None, None, "unresolved", f"pid {pid} gone before it could be read")
    first = chain[0]
    for proc in chain:
        why = None
        if proc.pid in poc_pids:
            why = f"the harness's process {proc.pid}"
        elif proc.markers:
            why = f"PoC marker {', '.join(proc.markers)}"
        elif ran := next((w for w in (proc.exe, *proc.run_from) if under(w, poc_folders)), None):
            why = f"runs {ran} from the PoC's folders"
        elif installed is not None:
            runs = (installed.owns_file(w) for w in (proc.exe, *proc.run_from))
            why = next((f"runs {w}" for w in runs if w), None) or installed.owns_unit(proc.cgroup)
        if why is not None:
            who = "itself" if proc is first else f"its ancestor {proc.exe} (pid {proc.pid})"
            return Writer(first.exe, first.cgroup, "poc", f"{who}: {why}")
    if first.exe is None:
        return Writer(None, first.cgroup, "unresolved", f"pid {first.pid}: executable unread")
    if chain[-1].pid != 1:  # an ancestor unknown: "no PoC ancestry" would be a guess
        gone = chain[-1]
        why = f"pid {first.pid} ({first.exe}): ancestry unknown past pid {gone.pid}"
        return Writer(first.exe, first.cgroup, "unresolved", why)
    exes = " < ".join(p.exe or f"pid {p.pid}" for p in chain[:4])
    return Writer(first.exe, first.cgroup, "node", f"pid {first.pid}, no PoC ancestry: {exes}")


@dataclass
class Aggregate:
    first_at: str
    last_at: str
    count: int = 0
    what: set[str] = field(default_factory=set)
    pid: int = 0  # the first writer's pid
    why: str = ""


class WriterRecorder:
    """Records writes under ``spec['paths']`` until ``stop`` is set (module docstring)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.node = str(spec["node"])
        self.out = Path(spec["out"])
        self.paths = [str(p) for p in spec["paths"]]
        self.skip = tuple(str(p) for p in spec.get("skip", ()))
        self.poc_folders = tuple(str(p) for p in spec.get("poc_folders", ()))
        self.poc_pids = frozenset({os.getpid(), *map(int, spec.get("poc_pids", ()))})
        self.flush_s = float(spec.get("flush_s", FLUSH_S))
        self.installed = InstalledSet(
            tuple(spec.get("installed_globs", ())), tuple(spec.get("manifests", ()))
        )
        self.started_at = _now()
        self.rows: dict[tuple[str, tuple[str | None, str | None, str]], Aggregate] = {}
        self.writers: dict[tuple[str | None, str | None, str], Writer] = {}
        self.gaps: list[dict[str, Any]] = []
        self.marked: list[str] = []
        self.events = 0
        self._lineage: Lineage | None = None
        self._lost_seen = 0
        # pid → the files its latest execs opened, last last: a script, then its interpreter
        self._execs: dict[int, tuple[str, ...]] = {}

    def gap(self, reason: str, t_from: str | None = None, t_to: str | None = None) -> None:
        """A stretch whose changes this recorder cannot attribute (None: to the end)."""
        self.gaps.append({"t_from": t_from or _now(), "t_to": t_to, "reason": reason})

    def run(self, stop: threading.Event) -> None:
        try:
            self._lineage = Lineage().start()
        except LineageUnavailable as exc:
            # Writers still resolve from /proc while they live; short-lived ones do not.
            self.gap(
                f"process lineage unavailable ({exc}): a writer gone by its read is unresolved"
            )
        try:
            group = FanotifyGroup(self.paths)
        except FanotifyUnavailable as exc:
            self.gap(f"fanotify unavailable: {exc}")
            self.flush()
            stop.wait()
            self._end()
            return
        self.marked = group.marked
        for refused in group.refused:
            self.gap(f"file system not marked: {refused}")
        self.flush()
        next_flush = time.monotonic() + self.flush_s
        try:
            while not stop.is_set():
                if select.select([group.fd], [], [], 0.2)[0]:
                    events, overflow = group.read()
                    if overflow:
                        at = _now()
                        self.gap("fanotify queue overflowed: events lost", at, at)
                    for event in events:
                        self._take(event)
                self._check_lineage()
                if time.monotonic() >= next_flush:
                    if not self.out.parent.exists():
                        break  # its PoC's folder is gone (removed, or a test's): nobody reads it
                    self.flush()
                    next_flush = time.monotonic() + self.flush_s
        finally:
            group.close()
            self._end()

    def _end(self) -> None:
        if self._lineage is not None:
            self._lineage.stop()
            self._check_lineage()
        self.flush(stopped=True)

    def _check_lineage(self) -> None:
        lineage = self._lineage
        if lineage is not None and lineage.lost > self._lost_seen:
            at = _now()
            lost = lineage.lost - self._lost_seen
            self._lost_seen = lineage.lost
            self.gap(f"{lost} process event(s) lost: writers of that moment may be misread", at, at)

    def _chain(self, pid: int) -> list[ProcInfo]:
        if self._lineage is not None:
            return self._lineage.ancestry(pid)
        chain, seen = [], set()
        while pid > 0 and pid not in seen and (info := read_proc(pid)) is not None:
            chain.append(info)
            seen.add(pid)
            pid = info.ppid or 0
        return chain

    def _take(self, event: FileEvent) -> None:
        if event.pid == os.getpid():
            return  # its own log
        if event.is_exec:
            if event.path is not None and not is_loader(event.path):
                seen = self._execs.pop(event.pid, ())
                self._execs[event.pid] = (*seen, event.path)[-EXEC_FILES:]
                if len(self._execs) > EXECS_KEPT:
                    del self._execs[next(iter(self._execs))]
            return
        path = event.path if event.path is not None else f"(unresolved)/{event.name}"
        if under(event.path, self.skip):
            return
        self.events += 1
        execs = self._execs.get(event.pid, ())
        exec_path = execs[-1] if execs else None
        chain = self._chain(event.pid)
        for _ in range(LINEAGE_TRIES):  # the connector's thread may not have read it yet
            complete = bool(chain) and chain[-1].pid == 1
            if complete and (exec_path is None or chain[0].exe in (exec_path, None)):
                break
            time.sleep(LINEAGE_WAIT_S)
            chain = self._chain(event.pid)
        if exec_path is not None and not chain:
            chain = [ProcInfo(event.pid, None, None, None, None, True)]
        chain = [self._with_execs(proc, writer=i == 0) for i, proc in enumerate(chain)]
        self.installed.refresh()  # a stat per manifest: an install may have just written it
        writer = writer_of(chain, self.poc_pids, self.poc_folders, self.installed)
        key = (path, writer.key)
        at = _now()
        agg = self.rows.get(key)
        if agg is None:
            agg = self.rows[key] = Aggregate(at, at, pid=event.pid, why=writer.why)
            self.writers[writer.key] = writer
        agg.last_at = at
        agg.count += 1
        agg.what.add(event.what)

    def _with_execs(self, proc: ProcInfo, writer: bool) -> ProcInfo:
        """``proc`` with what fanotify saw it exec, queued before its writes: the writer's
        image when it was gone before /proc could be read, or known only as its parent's
        fork (whose argv and environment were not its own after the exec: dropped); for any
        process of the chain, a script it ran (opened for exec before its interpreter) where
        /proc was read too late to say."""
        execs = self._execs.get(proc.pid, ())
        if not execs:
            return proc
        exe, earlier = execs[-1], execs[:-1]
        if not writer:  # an ancestor: only what it ran is added, its facts stay
            return replace(proc, run_from=tuple(dict.fromkeys((*proc.run_from, *earlier))))
        if proc.exe is None:
            return replace(proc, exe=exe, run_from=(*proc.run_from, *earlier))
        if proc.exe != exe:
            return replace(proc, exe=exe, run_from=earlier, markers=())
        return replace(proc, run_from=tuple(dict.fromkeys((*proc.run_from, *earlier))))

    # a dict: the log document written as JSON
    def log(self, stopped: bool) -> dict[str, Any]:
        rows = [
            {
                "path": path,
                "writer_exe": exe,
                "writer_cgroup": cgroup,
                "side": side,
                "why": agg.why,
                "pid": agg.pid,
                "first_at": agg.first_at,
                "last_at": agg.last_at,
                "count": agg.count,
                "what": "+".join(sorted(agg.what)),
            }
            for (path, (exe, cgroup, side)), agg in self.rows.items()
        ]
        return {
            "node": self.node,
            "pid": os.getpid(),
            "started_at": self.started_at,
            "flushed_at": _now(),
            "stopped": stopped,
            "marked": self.marked,
            "events": self.events,
            "rows": rows,
            "gaps": self.gaps,
        }

    def flush(self, stopped: bool = False) -> None:
        if not self.out.parent.exists():
            return
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / f".{LOG_NAME}.tmp"
        tmp.write_text(json.dumps(self.log(stopped)))
        os.replace(tmp, self.out / LOG_NAME)


def main(argv: list[str] | None = None) -> int:
    spec = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    WriterRecorder(spec).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
