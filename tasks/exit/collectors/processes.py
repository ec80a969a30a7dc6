"""``processes``: what runs, as its executable and a keyed hash of its argument vector (never
the argv in clear, never the environment), with the facts the exit diff attributes it by:
whether it or an ancestor is the PoC's, which top process it runs under, whether its
executable was deleted. Kernel threads and the snapshot's own process tree are left out. The
process table read here is shared with the ``sockets`` kind.

A process is the PoC's (its ``poc`` markers, its own or an ancestor's) when:

- its environment names one of the variables the PoC starts its copies, wrapper and
  uninstall with (``POC_ENV_MARKERS``: only the names are read, never a value), or it runs in
  a Slurm job the PoC named (``ckpt-poc-*``). Environments are inherited and CRIU restores
  them, so a daemon that double-forked away from its parent still carries them;
- its executable, its argv[0] or an interpreter's script lies under the PoC's folders (the
  checkout, the install prefix root, the data folder), or it works in the data folder (the
  run folders).
"""

from __future__ import annotations

import fnmatch
import os
from typing import Any, TypedDict

import psutil

from tasks.data.env_markers import JOB, MANAGED, MANIFEST, WRAPPER_POC
from tasks.data.errors import CkptPocError
from tasks.exit.collectors.base import Collector, Observation, ProcessInfo, ProcessTable

_PF_KTHREAD = 0x00200000
# The kinds that read the process table: `collect` reads it once, before any kind, for all.
READS_PROCESS_TABLE = frozenset({"processes", "sockets"})
# How the srun job runs the collector (`python -m tasks.exit.snapshots collect`): its command
# is our own wherever it shows.
COLLECTOR_MODULE = "tasks.exit.snapshots"
# Set by the PoC on what it starts: the local cluster's copies (CKPT_POC_JOB), the managed-job
# wrapper (CKPT_POC_WRAPPER_POC), an opted-in Slurm job (CKPT_POC_MANAGED), the uninstall
# (CKPT_POC_MANIFEST). Not the pseudonym key: an admin may export that in a login shell.
POC_ENV_MARKERS = (JOB, WRAPPER_POC, MANAGED, MANIFEST)
POC_SLURM_JOB_PREFIX = "ckpt-poc"
# argv[0] names an interpreter: the script it runs (argv[1]) says whose the process is.
_INTERPRETERS = ("python*", "bash", "sh", "dash", "perl*", "env")


def _proc_ids() -> list[int]:
    return psutil.pids()  # every pid in /proc, sorted


def env_markers(base: str) -> list[str]:
    """The PoC marker variables in the process's environment: names only, values unread
    (save a Slurm job's name, checked against the PoC's prefix and dropped)."""
    try:
        with open(f"{base}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return []
    found = []
    for item in raw.split(b"\0"):
        name, _, value = item.partition(b"=")
        text = name.decode(errors="replace")
        if text in POC_ENV_MARKERS:
            found.append(f"env:{text}")
        elif text == "SLURM_JOB_NAME" and value.startswith(POC_SLURM_JOB_PREFIX.encode()):
            found.append("slurm-job:ckpt-poc")
    return sorted(set(found))


def _read_proc(pid: int) -> ProcessInfo | None:
    """exe, argv, uid, ppid, cwd, PoC env markers and whether it is a kernel thread; None
    if it went away."""
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
    comm = raw[raw.find("(") + 1 : raw.rfind(")")]
    rest = raw[raw.rfind(")") + 2 :].split()
    ppid, flags = int(rest[1]), int(rest[6])
    try:
        exe = os.readlink(f"{base}/exe")
    except OSError:
        exe = ""
    try:
        cwd = os.readlink(f"{base}/cwd")
    except OSError:
        cwd = ""
    return {
        "pid": pid,
        "ppid": ppid,
        "kthread": bool(flags & _PF_KTHREAD) or pid == 2 or ppid == 2,
        "argv": argv,
        "exe": exe.removesuffix(" (deleted)"),
        "exe_deleted": exe.endswith(" (deleted)"),
        "comm": comm,
        "uid": uid,
        "cwd": cwd,
        "env_markers": env_markers(base),
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


def own_tree(procs: ProcessTable) -> set[int]:
    """The snapshot's own process tree: the snapshotting process (and, on Slurm, the
    ``srun … tasks.exit.snapshots collect`` that started it) and their descendants. Its
    ancestors and their other children are observed: an admin's program in another session
    under the same sshd is the node's, and must be seen."""
    own = {os.getpid()} | {p for p, info in procs.items() if _is_collector(info["argv"])}
    changed = True
    while changed:
        changed = False
        for info in procs.values():
            if info["ppid"] in own and info["pid"] not in own:
                own.add(info["pid"])
                changed = True
    return own


def under(path: str | None, folders: tuple[str, ...]) -> bool:
    """Whether ``path`` is one of ``folders`` or lies beneath one."""
    return bool(path) and any(
        path == f or path.startswith(f.rstrip("/") + "/")  # type: ignore[union-attr]
        for f in folders
    )


def _own_markers(info: ProcessInfo, obs: Observation) -> list[str]:
    """This process's own PoC markers (not its ancestors')."""
    found = list(info.get("env_markers", []))
    folders = (*obs.poc_paths, *obs.data_dirs)
    argv = info["argv"]
    run_from = [info["exe"], *argv[:1]]
    if argv and any(fnmatch.fnmatchcase(os.path.basename(argv[0]), p) for p in _INTERPRETERS):
        run_from += [a for a in argv[1:2] if not a.startswith("-")]
    if any(under(p, folders) for p in run_from):
        found.append("runs-from:poc-folder")
    if under(info.get("cwd", ""), tuple(obs.data_dirs)):
        found.append("cwd:data-folder")
    return found


def poc_markers(pid: int, procs: ProcessTable, obs: Observation) -> list[str]:
    """The PoC markers of ``pid`` and of its ancestors (``ancestor:…``), sorted."""
    found = set(_own_markers(procs[pid], obs))
    seen = {pid}
    parent = procs[pid]["ppid"]
    while parent > 1 and parent in procs and parent not in seen:
        seen.add(parent)
        found |= {f"ancestor:{m}" for m in _own_markers(procs[parent], obs)}
        parent = procs[parent]["ppid"]
    return sorted(found)


def _name(info: ProcessInfo) -> str:
    """The executable's path; a process whose exe cannot be read shows its kernel name."""
    return info["exe"] or f"[{info.get('comm') or '?'}]"


def argv_token(info: ProcessInfo, obs: Observation) -> str:
    if obs.pseudonymiser is None:
        raise CkptPocError("processes: no pseudonymisation key to hash the argv with")
    return obs.pseudonymiser.token("argv", "\0".join(info["argv"]))


def process_key(info: ProcessInfo, obs: Observation) -> str:
    """``EXE argv:HASH``: stable across runs (no pid), the argv only as its keyed hash."""
    return f"{_name(info)} {argv_token(info, obs)}"


def _top(info: ProcessInfo, procs: ProcessTable) -> ProcessInfo:
    """The ancestor just below PID 1 (the process itself for a daemon)."""
    top, seen = info, set()
    while top["ppid"] > 1 and top["ppid"] in procs and top["pid"] not in seen:
        seen.add(top["pid"])
        top = procs[top["ppid"]]
    return top


class ProcessFacts(TypedDict, total=False):
    """What the exit diff attributes a process by, merged into its item's JSON value: its
    executable's name, its PoC markers (if any), whether its executable was deleted."""

    exe: str
    poc: list[str]
    exe_deleted: bool


def process_facts(pid: int, procs: ProcessTable, obs: Observation) -> ProcessFacts:
    """What the exit diff attributes a process by: exe, PoC markers, deleted exe."""
    info = procs[pid]
    facts: ProcessFacts = {"exe": _name(info)}
    markers = poc_markers(pid, procs, obs)
    if markers:
        facts["poc"] = markers
    if info.get("exe_deleted"):
        facts["exe_deleted"] = True
    return facts


def _allowed_by(info: ProcessInfo, obs: Observation) -> list[str]:
    """The plan's argv globs this process's argv matches (matched here, in memory)."""
    text = " ".join(info["argv"])
    return [g for g in obs.argv_rules if fnmatch.fnmatchcase(text, g)]


def collect_processes(col: Collector, obs: Observation) -> None:
    procs = process_table(obs)
    own = own_tree(procs)
    counted: dict[str, dict[str, Any]] = {}
    for pid, info in procs.items():
        if info["kthread"] or pid in own or (not info["argv"] and not info["exe"]):
            continue  # kernel threads, our own tree, zombies
        entry = counted.setdefault(
            process_key(info, obs),
            {"uids": set(), "count": 0, "poc": set(), "deleted": False, "allowed": set()},
        )
        facts = process_facts(pid, procs, obs)
        entry["uids"].add(info["uid"])
        entry["count"] += 1
        entry["poc"] |= set(facts.get("poc", []))
        entry["deleted"] |= bool(facts.get("exe_deleted"))
        entry["allowed"] |= set(_allowed_by(info, obs))
        entry["exe"] = facts["exe"]
        entry["under"] = _name(_top(info, procs))
    for key, entry in counted.items():
        value: dict[str, Any] = {
            "exe": entry["exe"],
            "uid": ",".join(sorted(entry["uids"])),
            "count": entry["count"],
            "under": entry["under"],
        }
        if entry["poc"]:
            value["poc"] = sorted(entry["poc"])
        if entry["deleted"]:
            value["exe_deleted"] = True
        if entry["allowed"]:
            value["argv_allowed"] = sorted(entry["allowed"])
        col.add("processes", key, value)
    col.excluded("processes:self", "the snapshot's own process tree (it and its descendants)")
    if obs.pseudonymiser is not None:
        col.excluded(
            "processes:argv",
            "argv stored only as a keyed HMAC-SHA256 (the pseudonymisation key "
            f"{obs.pseudonymiser.token('key-id', b'')}); the environment is never stored",
        )
