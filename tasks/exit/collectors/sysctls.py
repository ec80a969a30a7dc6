"""``sysctls``: every readable key of /proc/sys, the volatile ones left out (and listed)."""

from __future__ import annotations

import fnmatch
import os

from tasks.exit.collectors.base import Collector, Observation

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


def _volatile(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in VOLATILE_SYSCTLS)


def collect_sysctls(col: Collector, obs: Observation) -> None:
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
