"""Node snapshots (DESIGN §1.8): what a node looks like, item by item, read-only.

`collect` observes THIS machine and returns one ``{kind, key, value}`` dict per item for
each kind the plan's ``exit.watch`` names. Collecting never writes anything (no cache, no
temp file, no tool that installs its own database): it reads files and /proc and runs a
few read-only commands (systemctl list-units, ldconfig -p, scontrol show, kubectl get).
Whatever cannot be read is an ``error`` row (key: what, value: why) and makes the snapshot
partial; what is left out on purpose (volatile sysctls, the plan's data folder, active
unit states without systemd) is an ``excluded`` row, so the snapshot says what it is not.

`take_snapshot` runs the collector for one plan node — locally, or inside a Slurm job
pinned to that node with `srun` (`python -m tasks.exit.snapshots collect ... --json`, no SSH) —
stamps the rows and writes the ``snapshots`` dataset; the caller commits the run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.data.datasets import SNAPSHOTS, read_dataset, write_dataset
from tasks.data.errors import BlastRadiusError, CkptPocError
from tasks.data.plan import Plan, Watch
from tasks.data.runctx import REPO_ROOT, RunContext

CHUNK = 1 << 20
CMD_TIMEOUT_S = 60
SRUN_TIMEOUT_S = 600
NEVER_WALKED = ("/proc", "/sys")  # virtual: their "files" are the kernel's live state

# Sysctls whose value changes by itself, second to second, on an idle node: counters,
# random values, current usage. Found by taking two snapshots a second apart on a Debian
# VM and on the test's Slurm node and listing what differed; the rest stays watched.
VOLATILE_SYSCTLS = (
    "kernel.random.*",  # entropy, boot_id, uuid: random by design
    "kernel.ns_last_pid",  # the last pid handed out
    "kernel.pty.nr",  # open pseudo-terminals: follows logins and tools
    "kernel.tainted",  # set by the kernel itself (e.g. an out-of-tree module), not a setting
    "fs.dentry-state",  # dcache counters
    "fs.inode-nr",
    "fs.inode-state",
    "fs.file-nr",  # open file handles
    "fs.aio-nr",
    "fs.quota.*",  # quota counters
    "fs.binfmt_misc.*",  # its register/status files are a control interface
    "net.netfilter.nf_conntrack_count",
    "net.ipv4.tcp_fastopen_key",  # a random key
    "net.ipv4.route.gc_*",  # route cache counters/intervals are read as live values
    "vm.stat_refresh",
    "vm.nr_*",  # page counters (nr_pdflush_threads …)
    "vm.drop_caches",  # a trigger, reads its last write
    "*.*_count",
    "dev.cdrom.info",  # changes as media are probed
    "net.ipv6.conf.*.stable_secret",  # unreadable (EIO) until set
)

_PROTO_FILES = {
    "tcp": "/proc/net/tcp",
    "tcp6": "/proc/net/tcp6",
    "udp": "/proc/net/udp",
    "udp6": "/proc/net/udp6",
}
_TCP_LISTEN = "0A"
_UDP_UNCONNECTED = "07"
_UNIX_ACCEPTCON = 0x00010000
_PF_KTHREAD = 0x00200000
# scontrol show config: the settings through which a checkpointer hooks into Slurm.
_SLURM_CONFIG_KEYS = re.compile(
    r"(Plugin|Plugins|PlugStack|Prolog|Epilog|Type$|Parameters$|GresTypes|Features|"
    r"Include|TaskAffinity|LaunchParameters|JobContainer)",
)
# Node states that only say how busy the node is (our own snapshot job makes it MIXED).
_ALLOC_STATES = {"IDLE", "MIXED", "ALLOCATED", "COMPLETING", "ALLOC", "MIX"}


class Collector:
    """Rows of one snapshot; an item seen twice keeps its first value."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.items: dict[tuple[str, str], str] = {}

    def add(self, kind: str, key: str, value: Any) -> None:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        self.items.setdefault((kind, key), text)

    def error(self, what: str, why: Any) -> None:
        self.add("error", what, str(why))

    def excluded(self, what: str, why: str) -> None:
        self.add("excluded", what, why)

    def path(self, absolute: str) -> Path:
        """An absolute node path under the collector's root (tests use a fake root)."""
        return self.root / absolute.lstrip("/")

    def rows(self) -> list[dict[str, str]]:
        return [{"kind": k, "key": key, "value": v} for (k, key), v in self.items.items()]


# --- helpers ---------------------------------------------------------------------------------


def sha256_file(path: Path | str) -> str:
    """Hash without following a symlink and without blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb", buffering=0) as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _md5_file(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _run(argv: list[str], env: Mapping[str, str] | None = None) -> str:
    """A read-only command's stdout; CkptPocError with its reason otherwise."""
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT_S,
            check=False,
            env=dict(env) if env is not None else None,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CkptPocError(f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        detail = (done.stderr.strip() or done.stdout.strip())[-300:]
        raise CkptPocError(f"{' '.join(argv)} exited {done.returncode}: {detail}")
    return done.stdout


def _capabilities(path: str) -> str | None:
    try:
        raw = os.getxattr(path, "security.capability", follow_symlinks=False)
    except OSError:
        return None  # ENODATA: none; ENOTSUP: the filesystem has no xattrs, so none either
    return raw.hex()


def _type_letter(mode: int) -> str:
    for test, letter in (
        (stat.S_ISREG, "f"),
        (stat.S_ISDIR, "d"),
        (stat.S_ISLNK, "l"),
        (stat.S_ISSOCK, "s"),
        (stat.S_ISFIFO, "p"),
        (stat.S_ISCHR, "c"),
        (stat.S_ISBLK, "b"),
    ):
        if test(mode):
            return letter
    return "?"


def _under(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def _walk(
    top: str,
    skip: list[str],
    col: Collector,
    descend: Callable[[str], bool] = lambda _path: True,
) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry below ``top`` (lstat, symlinks never followed), ``top`` itself first;
    entries under ``skip`` are not listed, folders ``descend`` refuses are not entered. An
    entry that vanishes mid-walk is not an error (the node changed while looked at); one
    that cannot be read is."""
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return
    except OSError as exc:
        col.error(f"files:{top}", exc.strerror or exc)
        return
    yield top, st
    if not stat.S_ISDIR(st.st_mode):
        return
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                listed = sorted(entries, key=lambda e: e.name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            col.error(f"files:{folder}", exc.strerror or exc)
            continue
        for entry in listed:
            path = entry.path
            if _under(path, skip):
                continue
            try:
                est = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as exc:
                col.error(f"files:{path}", exc.strerror or exc)
                continue
            yield path, est
            if stat.S_ISDIR(est.st_mode) and descend(path):
                stack.append(path)


# --- kinds -----------------------------------------------------------------------------------


def _dpkg_paragraphs(text: str) -> Iterator[dict[str, str]]:
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        last = ""
        for line in block.splitlines():
            if line.startswith((" ", "\t")) and last:
                fields[last] += "\n" + line.strip()
            elif ":" in line:
                last, _, value = line.partition(":")
                fields[last] = value.strip()
        if "Package" in fields:
            yield fields


def collect_packages(col: Collector) -> None:
    status = col.path("/var/lib/dpkg/status")
    try:
        text = status.read_text(errors="replace")
    except FileNotFoundError:
        col.excluded("packages", "no dpkg database (/var/lib/dpkg/status): not a Debian node")
        return
    except OSError as exc:
        col.error("packages:/var/lib/dpkg/status", exc.strerror or exc)
        return
    for pkg in _dpkg_paragraphs(text):
        name = f"{pkg['Package']}:{pkg.get('Architecture', '?')}"
        col.add(
            "packages", name, {"version": pkg.get("Version", ""), "status": pkg.get("Status", "")}
        )
        # A conffile edited (or deleted) since the package shipped it: what an install that
        # edits packaged config leaves behind even when the file's name is unchanged.
        for line in pkg.get("Conffiles", "").splitlines():
            parts = line.split()
            if len(parts) < 2 or parts[1] == "newconffile" or "obsolete" in parts[2:]:
                continue
            conf, shipped = parts[0], parts[1]
            try:
                actual = _md5_file(col.path(conf))
            except FileNotFoundError:
                actual = "missing"
            except OSError as exc:
                col.error(f"packages:conffile:{conf}", exc.strerror or exc)
                continue
            if actual != shipped:
                col.add("packages", f"conffile:{conf}", {"package": name, "md5": actual})


UNIT_DIRS = ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")


def _unit_entries(col: Collector) -> Iterator[tuple[str, os.stat_result]]:
    seen: set[str] = set()
    for folder in UNIT_DIRS:
        real = os.path.realpath(col.path(folder))
        if real in seen:  # /lib → /usr/lib on a merged-/usr system: one walk
            continue
        seen.add(real)
        yield from _walk(str(col.path(folder)), [], col)


def _pid1_is_systemd(col: Collector) -> tuple[bool, str]:
    try:
        comm = col.path("/proc/1/comm").read_text().strip()
    except OSError as exc:
        return False, f"unreadable ({exc.strerror})"
    return comm == "systemd", comm


def collect_units(col: Collector) -> None:
    for path, st in _unit_entries(col):
        if stat.S_ISDIR(st.st_mode):
            continue
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(path)
            resolved = os.path.join(os.path.dirname(path), target)
            # Enabled units and masks are symlinks: one whose target is gone is a leftover
            # of a unit deleted without `systemctl disable`.
            dangling = target != "/dev/null" and not os.path.exists(resolved)
            col.add("units", path, {"link": target, "dangling": dangling})
        elif stat.S_ISREG(st.st_mode):
            try:
                col.add("units", path, {"sha256": sha256_file(path)})
            except OSError as exc:
                col.error(f"units:{path}", exc.strerror or exc)
    systemd, pid1 = _pid1_is_systemd(col)
    if not systemd or col.root != Path("/"):
        col.excluded(
            "units:active",
            f"systemd is not PID 1 here (PID 1 is {pid1!r}): active states are not observable",
        )
        return
    try:
        out = _run(["systemctl", "list-units", "--all", "--no-legend", "--plain", "--no-pager"])
    except CkptPocError as exc:
        col.error("units:active", exc)
        return
    for line in out.splitlines():
        parts = line.split(None, 4)
        if len(parts) >= 4:
            col.add("units", f"active:{parts[0]}", {"load": parts[1], "active": parts[2:4]})


NAMES_ONLY_DEPTH = 2  # /var/log/NAME and /var/log/slurm/NAME; deeper is the tools' business
HASH_THREADS = 4  # hashlib releases the GIL: reads and hashes overlap on a cold cache


def _names_only_depth(path: str, folders: list[str]) -> int | None:
    """How deep ``path`` lies below the names-only folder holding it (None: in none)."""
    for folder in folders:
        if path == folder:
            return 0
        if path.startswith(folder.rstrip("/") + "/"):
            return path[len(folder.rstrip("/")) :].count("/")
    return None


def collect_files(col: Collector, watch: Watch, data_dirs: list[str]) -> None:
    skip = [str(col.path(s)) for s in (*NEVER_WALKED, *data_dirs)]
    for folder in data_dirs:
        col.excluded(f"files:{folder}", "the plan's data folder: the PoC's own records")
    for folder in watch.names_only:
        col.excluded(
            f"files:{folder}",
            f"busy folder: entry names and types only, {NAMES_ONLY_DEPTH} levels deep",
        )
    names_only = [str(col.path(p)) for p in watch.names_only]
    root = str(col.root).rstrip("/")

    def descend(path: str) -> bool:
        depth = _names_only_depth(path, names_only)
        return depth is None or depth < NAMES_ONLY_DEPTH

    done: set[str] = set()
    to_hash: list[tuple[str, str, dict[str, Any]]] = []
    for top in watch.paths:
        for path, st in _walk(str(col.path(top)), skip, col, descend):
            if path in done:  # watched paths may overlap (/var/lib and /var/lib/x)
                continue
            done.add(path)
            key = path[len(root) :] if root else path
            mode = st.st_mode
            depth = _names_only_depth(path, names_only)
            if depth:  # inside a busy folder (the folder itself is described fully)
                col.add("files", key, {"type": _type_letter(mode)})
                continue
            item: dict[str, Any] = {
                "type": _type_letter(mode),
                "mode": oct(stat.S_IMODE(mode)),
                "owner": f"{st.st_uid}:{st.st_gid}",
            }
            if stat.S_ISLNK(mode):
                item["link"] = os.readlink(path)
            elif stat.S_ISREG(mode):
                caps = _capabilities(path)
                if caps:
                    item["caps"] = caps
                to_hash.append((key, path, item))
                continue
            elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                item["rdev"] = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
            col.add("files", key, item)

    def hashed(path: str) -> str | OSError:
        try:
            return sha256_file(path)
        except OSError as exc:
            return exc

    with ThreadPoolExecutor(HASH_THREADS) as pool:
        digests = list(pool.map(hashed, [path for _, path, _ in to_hash]))
    for (key, _path, item), digest in zip(to_hash, digests, strict=True):
        if isinstance(digest, FileNotFoundError):
            continue  # removed while looked at
        if isinstance(digest, OSError):
            col.error(f"files:{key}", digest.strerror or digest)
            continue
        item["sha256"] = digest
        col.add("files", key, item)


def collect_modules(col: Collector) -> None:
    try:
        text = col.path("/proc/modules").read_text()
    except FileNotFoundError:
        col.excluded("modules", "no /proc/modules: the kernel has no loadable modules")
        return
    except OSError as exc:
        col.error("modules:/proc/modules", exc.strerror or exc)
        return
    for line in text.splitlines():
        if line.strip():
            col.add("modules", line.split()[0], "loaded")


def _volatile(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in VOLATILE_SYSCTLS)


def collect_sysctls(col: Collector) -> None:
    top = col.path("/proc/sys")
    for pattern in VOLATILE_SYSCTLS:
        col.excluded(f"sysctls:{pattern}", "volatile: changes by itself on an idle node")
    unreadable: list[str] = []
    for folder, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            key = os.path.relpath(path, top).replace("/", ".")
            if _volatile(key):
                continue
            try:
                if not os.stat(path).st_mode & 0o444:
                    continue  # write-only triggers (vm.compact_memory): no state to read
                with open(path, "rb") as fh:
                    value = fh.read(65536).decode(errors="replace")
            except FileNotFoundError:
                continue
            except OSError as exc:
                # The kernel refuses some reads by design (EIO, EINVAL, EPERM on a few keys).
                unreadable.append(f"{key} ({exc.strerror})")
                continue
            col.add("sysctls", key, " ".join(value.split()))
    if unreadable:
        col.excluded("sysctls:unreadable", "the kernel refuses to read: " + ", ".join(unreadable))


def _proc_ids() -> list[int]:
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def _read_proc(pid: int) -> dict[str, Any] | None:
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


def _processes() -> dict[int, dict[str, Any]]:
    procs = {}
    for pid in _proc_ids():
        info = _read_proc(pid)
        if info is not None:
            procs[pid] = info
    return procs


def _is_collector(argv: list[str]) -> bool:
    return any(
        a == "tasks.exit.snapshots" and argv[i + 1 : i + 2] == ["collect"]
        for i, a in enumerate(argv)
    )


def _own_family(procs: dict[int, dict[str, Any]]) -> set[int]:
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


def _command(info: dict[str, Any], limit: int) -> str:
    args = " ".join(info["argv"][1:])
    return f"{info['exe'] or (info['argv'][:1] or ['?'])[0]} {args}".strip()[:limit]


def _process_key(info: dict[str, Any], procs: dict[int, dict[str, Any]]) -> str:
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


def collect_processes(col: Collector, procs: dict[int, dict[str, Any]] | None = None) -> None:
    procs = procs if procs is not None else _processes()
    own = _own_family(procs)
    counted: dict[str, dict[str, Any]] = {}
    for info in procs.values():
        if info["kthread"] or info["pid"] in own or (not info["argv"] and not info["exe"]):
            continue  # kernel threads, our own family, zombies
        entry = counted.setdefault(_process_key(info, procs), {"uids": set(), "count": 0})
        entry["uids"].add(info["uid"])
        entry["count"] += 1
    for key, entry in counted.items():
        col.add("processes", key, {"uid": ",".join(sorted(entry["uids"])), "count": entry["count"]})
    col.excluded("processes:self", "the snapshotting process, its parents and its children")


def _socket_owners(procs: dict[int, dict[str, Any]]) -> dict[str, int]:
    owners: dict[str, int] = {}
    for pid in procs:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owners.setdefault(target[8:-1], pid)
    return owners


def _addr(hex_addr: str) -> tuple[str, int]:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = ".".join(str(b) for b in reversed(raw))
    else:  # /proc prints IPv6 as four host-order 32-bit words
        words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
        import ipaddress

        ip = str(ipaddress.IPv6Address(b"".join(words)))
    return ip, int(port, 16)


def collect_sockets(col: Collector, procs: dict[int, dict[str, Any]] | None = None) -> None:
    procs = procs if procs is not None else _processes()
    owners = _socket_owners(procs)
    own = _own_family(procs)

    def owner(inode: str) -> tuple[str, bool]:
        pid = owners.get(inode)
        if pid is None:
            return "?", False
        return _process_key(procs[pid], procs), pid in own

    for proto, path in _PROTO_FILES.items():
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue  # no IPv6 on this kernel
        except OSError as exc:
            col.error(f"sockets:{path}", exc.strerror or exc)
            continue
        for line in lines:
            f = line.split()
            state, inode = f[3], f[9]
            listening = (
                state == _TCP_LISTEN
                if proto.startswith("tcp")
                else (state == _UDP_UNCONNECTED and f[2].endswith(":0000"))
            )
            if not listening:
                continue
            ip, port = _addr(f[1])
            who, ours = owner(inode)
            if not ours:
                col.add("sockets", f"{proto} {ip}:{port} {who}"[:500], "listening")
    try:
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError as exc:
        col.error("sockets:/proc/net/unix", exc.strerror or exc)
        return
    for line in lines:
        f = line.split()
        if len(f) < 8 or not int(f[3], 16) & _UNIX_ACCEPTCON:
            continue
        who, ours = owner(f[6])
        if not ours:
            col.add("sockets", f"unix {f[7]} {who}"[:500], "listening")


def collect_mounts(col: Collector) -> None:
    try:
        lines = col.path("/proc/self/mountinfo").read_text().splitlines()
    except OSError as exc:
        col.error("mounts:/proc/self/mountinfo", exc.strerror or exc)
        return
    for line in lines:
        left, _, right = line.partition(" - ")
        lf, rf = left.split(), right.split()
        point = lf[4].encode().decode("unicode_escape")
        key, n = point, 1
        while ("mounts", key) in col.items:  # stacked mounts on one point
            n += 1
            key = f"{point}#{n}"
        col.add(
            "mounts",
            key,
            {"fstype": rf[0], "source": rf[1], "options": lf[5], "super": rf[2:3]},
        )


def collect_users(col: Collector) -> None:
    for file, label in (("/etc/passwd", "user"), ("/etc/group", "group")):
        try:
            lines = col.path(file).read_text().splitlines()
        except OSError as exc:
            col.error(f"users:{file}", exc.strerror or exc)
            continue
        for line in lines:
            fields = line.split(":")
            if len(fields) >= 3 and fields[0]:
                # The password field ("x") carries nothing: shadow is hashed under files.
                col.add("users", f"{label}:{fields[0]}", ":".join(fields[2:]))


def _hash_files(col: Collector, kind: str, paths: list[Path]) -> None:
    for path in paths:
        key = "/" + str(path.relative_to(col.root))
        try:
            if path.is_symlink():
                col.add(kind, key, {"link": os.readlink(path)})
            elif path.is_file():
                col.add(kind, key, {"sha256": sha256_file(path)})
        except FileNotFoundError:
            continue
        except OSError as exc:
            col.error(f"{kind}:{key}", exc.strerror or exc)


def collect_cron(col: Collector) -> None:
    found: list[Path] = [col.path("/etc/crontab")]
    for pattern in ("/etc/cron.*/*", "/var/spool/cron/crontabs/*", "/etc/anacrontab"):
        found += sorted(col.root.glob(pattern.lstrip("/")))
    _hash_files(col, "cron", found)
    for path, st in _unit_entries(col):
        if path.endswith(".timer") and not stat.S_ISDIR(st.st_mode):
            key = "timer:" + path[len(str(col.root).rstrip("/")) :]
            if stat.S_ISLNK(st.st_mode):
                col.add("cron", key, {"link": os.readlink(path)})
            else:
                try:
                    col.add("cron", key, {"sha256": sha256_file(path)})
                except OSError as exc:
                    col.error(f"cron:{key}", exc.strerror or exc)


def collect_ldconfig(col: Collector) -> None:
    _hash_files(
        col,
        "ldconfig",
        [col.path("/etc/ld.so.conf"), *sorted(col.root.glob("etc/ld.so.conf.d/*"))],
    )
    if col.root != Path("/"):
        col.excluded("ldconfig:cache", "ldconfig -p reads this machine's cache, not the root's")
        return
    try:
        out = _run(["ldconfig", "-p"])
    except CkptPocError as exc:
        col.error("ldconfig:cache", exc)
        return
    libs: dict[str, list[str]] = {}
    for line in out.splitlines()[1:]:
        name, sep, path = line.strip().partition(" => ")
        if sep:
            libs.setdefault(name, []).append(path)
    for name, paths in libs.items():
        col.add("ldconfig", name, sorted(paths))


def _kv_config(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def _plugstack_files(col: Collector, conf: Path, seen: set[Path]) -> None:
    """The PlugStackConfig file and every file its `include` lines pull in."""
    if conf in seen or not conf.is_file():
        return
    seen.add(conf)
    try:
        lines = conf.read_text().splitlines()
    except OSError as exc:
        col.error(f"scheduler:file:{conf}", exc.strerror or exc)
        return
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] == "include":
            for inc in sorted(Path("/").glob(words[1].lstrip("/"))):
                _plugstack_files(col, inc, seen)


def collect_slurm(col: Collector, node: str, env: Mapping[str, str] | None = None) -> None:
    env = env if env is not None else os.environ
    try:
        config = _kv_config(_run(["scontrol", "show", "config"], env))
    except CkptPocError as exc:
        col.error("scheduler:slurm config", exc)
        config = {}
    for key, value in sorted(config.items()):
        if _SLURM_CONFIG_KEYS.search(key):
            col.add("scheduler", f"config:{key}", value)
    # Files: /etc/slurm/**, the running cluster's own config folder (SLURM_CONF's), the
    # plugstack file and its includes, and the plugins in PluginDir (where Cedana copies
    # its .so files, outside any watched path).
    files: set[Path] = set()
    folders = [Path("/etc/slurm")]
    if env.get("SLURM_CONF"):
        folders.append(Path(env["SLURM_CONF"]).parent)
    for folder in folders:
        files.update(p for p in folder.rglob("*") if p.is_file() or p.is_symlink())
    stack: set[Path] = set()
    if config.get("PlugStackConfig"):
        _plugstack_files(col, Path(config["PlugStackConfig"]), stack)
    files.update(stack)
    for plugin_dir in config.get("PluginDir", "").split(":"):
        if plugin_dir and Path(plugin_dir).is_dir():
            files.update(Path(plugin_dir).glob("*.so"))
    for path in sorted(files):
        try:
            value = (
                {"link": os.readlink(path)}
                if path.is_symlink()
                else {"sha256": sha256_file(path), "mode": oct(path.stat().st_mode & 0o7777)}
            )
        except OSError as exc:
            col.error(f"scheduler:file:{path}", exc.strerror or exc)
            continue
        col.add("scheduler", f"file:{path}", value)
    try:
        shown = _run(["scontrol", "show", "node", node, "--oneliner"], env)
    except CkptPocError as exc:
        col.error(f"scheduler:node {node}", exc)
        return
    fields = dict(re.findall(r"(\w+)=(\S*)", shown))
    for key in ("AvailableFeatures", "ActiveFeatures", "Gres", "Partitions", "Reason"):
        col.add("scheduler", f"node:{key}", fields.get(key, ""))
    # Busy-ness (IDLE/MIXED…) follows the jobs, the snapshot's own included; the rest of the
    # state (DRAIN, DOWN, flags) is what an install or its removal could leave.
    states = fields.get("State", "").split("+")
    col.add("scheduler", "node:alloc", "+".join(s for s in states if s in _ALLOC_STATES))
    col.add("scheduler", "node:State", "+".join(s for s in states if s not in _ALLOC_STATES))


def collect_kubernetes(col: Collector, node: str) -> None:
    try:
        shown = json.loads(_run(["kubectl", "get", "node", node, "-o", "json"]))
    except (CkptPocError, ValueError) as exc:
        col.error(f"scheduler:kubernetes node {node}", exc)
    else:
        meta, spec = shown.get("metadata", {}), shown.get("spec", {})
        for key, value in sorted(meta.get("labels", {}).items()):
            col.add("scheduler", f"label:{key}", value)
        for taint in spec.get("taints", []):
            col.add("scheduler", f"taint:{taint.get('key')}:{taint.get('effect')}", taint)
    files = [p for p in col.root.glob("etc/containerd/**/*") if p.is_file() or p.is_symlink()]
    _hash_files(col, "scheduler", [*sorted(files), col.path("/var/lib/kubelet/config.yaml")])


def collect(
    node: str,
    watch: Watch,
    *,
    root: Path = Path("/"),
    slurm: bool = False,
    data_dirs: list[str] | None = None,
    kubernetes: bool = False,
    env: Mapping[str, str] | None = None,
) -> list[dict[str, str]]:
    """Observe this machine: one {kind, key, value} per item of each kind ``watch`` names.

    ``data_dirs`` (the plan's data folder) are never walked; ``root`` lets a test point the
    file-based kinds at a fake tree (processes, sockets, sysctls always read this kernel).
    """
    col = Collector(root)
    dirs = [os.path.abspath(d) for d in data_dirs or []]
    procs = _processes() if {"processes", "sockets"} & set(watch.kinds) else None
    for kind in watch.kinds:
        if kind == "packages":
            collect_packages(col)
        elif kind == "units":
            collect_units(col)
        elif kind == "files":
            collect_files(col, watch, dirs)
        elif kind == "modules":
            collect_modules(col)
        elif kind == "sysctls":
            collect_sysctls(col)
        elif kind == "sockets":
            collect_sockets(col, procs)
        elif kind == "processes":
            collect_processes(col, procs)
        elif kind == "mounts":
            collect_mounts(col)
        elif kind == "users":
            collect_users(col)
        elif kind == "cron":
            collect_cron(col)
        elif kind == "ldconfig":
            collect_ldconfig(col)
        elif kind == "scheduler":
            if slurm:
                collect_slurm(col, node, env)
            elif kubernetes:
                collect_kubernetes(col, node)
            else:
                col.excluded("scheduler", "a local plan: no scheduler holds a view of the node")
    return col.rows()


# --- the dataset -----------------------------------------------------------------------------


def _check_node(plan: Plan, node: str) -> None:
    if node not in plan.cluster.nodes:
        raise BlastRadiusError(
            f"node {node!r} is not one of the plan's nodes {list(plan.cluster.nodes)}: "
            "nothing was observed"
        )


def _data_dirs(plan: Plan, ctx: RunContext) -> list[str]:
    return sorted({str(Path(plan.data_dir).resolve()), str(ctx.data_dir)})


def collect_on_slurm(
    plan: Plan, node: str, data_dirs: list[str], env: Mapping[str, str] | None = None
) -> list[dict[str, str]]:
    """Run the collector in a Slurm job pinned to ``node`` (srun waits and relays stdout)."""
    argv = [
        "srun",
        "-w",
        node,
        "-p",
        plan.cluster.queue,
        "-N1",
        "-n1",
        "--quiet",
        "--job-name=ckpt-poc-snapshot",
        f"--chdir={REPO_ROOT}",
        sys.executable,
        "-m",
        "tasks.exit.snapshots",
        "collect",
        "--node",
        node,
        "--watch",
        plan.exit.watch.model_dump_json(),
        "--slurm",
        "--json",
        *[a for d in data_dirs for a in ("--data-dir", d)],
    ]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=SRUN_TIMEOUT_S,
            check=False,
            cwd=REPO_ROOT,
            env=dict(env) if env is not None else None,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CkptPocError(f"snapshot of node {node}: srun failed: {exc}") from exc
    if done.returncode != 0:
        raise CkptPocError(
            f"snapshot of node {node}: srun exited {done.returncode}: "
            f"{(done.stderr.strip() or done.stdout.strip())[-800:]}"
        )
    try:
        rows = json.loads(done.stdout)
    except ValueError as exc:
        raise CkptPocError(f"snapshot of node {node}: the job printed no JSON: {exc}") from exc
    return rows


def take_snapshots(
    plan: Plan, ctx: RunContext, phase: str, nodes: list[str]
) -> dict[str, pd.DataFrame]:
    """``take_snapshot`` of each of ``nodes``. On a local plan every node is this machine:
    it is observed once and the rows are written under each node's name (observing the
    same machine twice in a row only doubles the time)."""
    out: dict[str, pd.DataFrame] = {}
    observed: list[dict[str, str]] | None = None
    for node in nodes:
        out[node] = take_snapshot(plan, ctx, phase, node, observed=observed)
        if plan.cluster.kind == "local":
            observed = out[node][["kind", "key", "value"]].to_dict("records")
    return out


def take_snapshot(
    plan: Plan,
    ctx: RunContext,
    phase: str,
    node: str,
    env: Mapping[str, str] | None = None,
    observed: list[dict[str, str]] | None = None,
) -> pd.DataFrame:
    """Observe one plan node at ``phase`` and write its rows (``snapshots``); the caller
    commits. A node the plan does not name is refused before anything runs. ``observed``:
    rows already read from this same machine (a local plan's other node)."""
    _check_node(plan, node)
    if not phase or not re.fullmatch(r"[A-Za-z0-9_.-]+", phase):
        raise CkptPocError(f"phase {phase!r}: use letters, digits, '_', '-' or '.'")
    data_dirs = _data_dirs(plan, ctx)
    kind = plan.cluster.kind
    if observed is not None and kind == "local":
        rows = observed
    elif kind == "slurm":
        rows = collect_on_slurm(plan, node, data_dirs, env)
    else:  # local: every plan node is this machine; kubernetes: run where kubectl reaches
        rows = collect(
            node,
            plan.exit.watch,
            slurm=False,
            kubernetes=kind == "kubernetes",
            data_dirs=data_dirs,
        )
    df = pd.DataFrame(rows, columns=["kind", "key", "value"])
    partial = bool((df["kind"] == "error").any())
    for column, value in ctx.stamp().items():
        df[column] = value
    df["node"] = node
    df["phase"] = phase
    df["partial"] = partial
    df["taken_at"] = pd.Timestamp(dt.datetime.now(dt.UTC))
    df = df[SNAPSHOTS.column_names]
    write_dataset(
        df,
        SNAPSHOTS,
        data_dir=ctx.data_dir,
        poc=ctx.poc,
        run_id=ctx.run_id,
        # One run snapshots every plan node: one file each (a second <run_id>.parquet in the
        # same week would be refused as a rewrite).
        part=list(plan.cluster.nodes).index(node),
        metadata=ctx.file_metadata,
    )
    return df


def latest_snapshot(data_dir: str | Path, poc: str, node: str, phase: str) -> pd.DataFrame | None:
    """The newest committed snapshot of ``node`` at ``phase``, or None."""
    df = read_dataset(SNAPSHOTS, data_dir=data_dir, poc=poc)
    df = df[(df["node"] == node) & (df["phase"] == phase)]
    if df.empty:
        return None
    newest = df.groupby("run_id", observed=True)["taken_at"].max().idxmax()
    return df[df["run_id"] == newest].reset_index(drop=True)


# --- `python -m tasks.exit.snapshots collect` (what the Slurm job runs) ----------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.exit.snapshots")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="observe this machine; print the rows")
    c.add_argument("--node", required=True)
    c.add_argument("--watch", default="{}", help="the plan's exit.watch as JSON")
    c.add_argument("--slurm", action="store_true")
    c.add_argument("--kubernetes", action="store_true")
    c.add_argument("--data-dir", action="append", default=[])
    c.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    args = parser.parse_args(argv)
    watch = Watch.model_validate_json(args.watch)
    rows = collect(
        args.node,
        watch,
        slurm=args.slurm,
        kubernetes=args.kubernetes,
        data_dirs=args.data_dir,
    )
    sys.stdout.write(json.dumps(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
