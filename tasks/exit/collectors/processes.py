"""``processes``: what runs (exe, argv, uid; counted), kernel threads and the snapshot's own
family left out. The process table read here is shared with the ``sockets`` kind."""

from __future__ import annotations

import os
from typing import Any

from tasks.exit.collectors.base import Collector, Observation, ProcessInfo, ProcessTable

_PF_KTHREAD = 0x00200000
# The kinds that read the process table: `collect` reads it once, before any kind, for all.
READS_PROCESS_TABLE = frozenset({"processes", "sockets"})
# How the srun job runs the collector (`python -m tasks.exit.snapshots collect`): its command
# is our own wherever it shows.
COLLECTOR_MODULE = "tasks.exit.snapshots"


def _proc_ids() -> list[int]:
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def _read_proc(pid: int) -> ProcessInfo | None:
    """exe, argv, uid, ppid and whether it is a kernel thread; None if it went away."""
    base = f"/proc/{pid}"
    try:
        with open(f"{base}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
        with open(f"{base}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0")[:-1]]
        with open(f"{base}/status") as fh:
            uid = next((ln.split()[1] for ln in fh if ln.startswith("Uid:")), "?")
    except (FileNotFoundError, ProcessLookupError):
        return None
    rest = raw[raw.rfind(")") + 2 :].split()
    ppid, flags = int(rest[1]), int(rest[6])
    try:
        exe = os.readlink(f"{base}/exe")
    except OSError:
        exe = ""
    return {
        "pid": pid,
        "ppid": ppid,
        "kthread": bool(flags & _PF_KTHREAD) or pid == 2 or ppid == 2,
        "argv": argv,
        "exe": exe.removesuffix(" (deleted)"),
        "uid": uid,
    }


def read_processes() -> ProcessTable:
    """This kernel's process table (always this machine's /proc, whatever the root)."""
    procs = {}
    for pid in _proc_ids():
        info = _read_proc(pid)
        if info is not None:
            procs[pid] = info
    return procs


def process_table(obs: Observation) -> ProcessTable:
    """The table `collect` read for this observation, or a fresh one."""
    return obs.processes if obs.processes is not None else read_processes()


def _is_collector(argv: list[str]) -> bool:
    return any(
        a == COLLECTOR_MODULE and argv[i + 1 : i + 2] == ["collect"] for i, a in enumerate(argv)
    )


def own_family(procs: ProcessTable) -> set[int]:
    """The snapshotting process, what it started and what started it (below PID 1): the
    PoC's own tooling, which is never the same process twice."""
    own = {os.getpid()}
    # The collector's command wherever it shows: on Slurm the `srun … python -m
    # tasks.exit.snapshots collect` that started this job may run on the very node observed.
    own |= {p for p, info in procs.items() if _is_collector(info["argv"])}
    pid = os.getppid()
    while pid > 1 and pid in procs:
        own.add(pid)
        pid = procs[pid]["ppid"]
    changed = True
    while changed:
        changed = False
        for info in procs.values():
            if info["ppid"] in own and info["pid"] not in own:
                own.add(info["pid"])
                changed = True
    return own


def _command(info: ProcessInfo, limit: int) -> str:
    args = " ".join(info["argv"][1:])
    return f"{info['exe'] or (info['argv'][:1] or ['?'])[0]} {args}".strip()[:limit]


def process_key(info: ProcessInfo, procs: ProcessTable) -> str:
    """``exe argv``, and for a process that is not itself a daemon (its parent is not PID 1)
    `` (under TOP)``: the command of its ancestor just below PID 1. Stable across runs (no
    pid), and it tells a daemon an install left from a command of someone's login session,
    which a plan can allow by its TOP (e.g. ``* (under /usr/sbin/sshd*``)."""
    top = info
    seen = set()
    while top["ppid"] > 1 and top["ppid"] in procs and top["pid"] not in seen:
        seen.add(top["pid"])
        top = procs[top["ppid"]]
    if top is info:
        return _command(info, 500)
    return f"{_command(info, 340)} (under {_command(top, 150)})"


def collect_processes(col: Collector, obs: Observation) -> None:
    procs = process_table(obs)
    own = own_family(procs)
    counted: dict[str, dict[str, Any]] = {}
    for info in procs.values():
        if info["kthread"] or info["pid"] in own or (not info["argv"] and not info["exe"]):
            continue  # kernel threads, our own family, zombies
        entry = counted.setdefault(process_key(info, procs), {"uids": set(), "count": 0})
        entry["uids"].add(info["uid"])
        entry["count"] += 1
    for key, entry in counted.items():
        col.add("processes", key, {"uid": ",".join(sorted(entry["uids"])), "count": entry["count"]})
    col.excluded("processes:self", "the snapshotting process, its parents and its children")
