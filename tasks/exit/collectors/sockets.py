"""``sockets``: listening TCP/UDP (v4 and v6) and unix sockets, keyed by their owner process's
key (its executable and argv hash: tasks.exit.collectors.processes) and valued with the
owner's facts (PoC markers, deleted executable); the snapshot's own tree's left out."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import Any

from tasks.exit.collectors.base import Collector, Observation, ProcessTable
from tasks.exit.collectors.processes import own_tree, process_facts, process_key, process_table

_PROTO_FILES = {
    "tcp": "/proc/net/tcp",
    "tcp6": "/proc/net/tcp6",
    "udp": "/proc/net/udp",
    "udp6": "/proc/net/udp6",
}
_TCP_LISTEN = "0A"
_UDP_UNCONNECTED = "07"
_UNIX_ACCEPTCON = 0x00010000


def _socket_owners(procs: ProcessTable) -> dict[str, int]:
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
        ip = str(ipaddress.IPv6Address(b"".join(words)))
    return ip, int(port, 16)


def collect_sockets(col: Collector, obs: Observation) -> None:
    procs = process_table(obs)
    owners = _socket_owners(procs)
    own = own_tree(procs)
    facts: dict[int, str] = {}

    def owner(inode: str) -> tuple[str, bool]:
        pid = owners.get(inode)
        if pid is None:
            return "?", False
        return process_key(procs[pid], obs), pid in own

    def value(inode: str) -> str:
        pid = owners.get(inode)
        if pid is None:
            return "listening"
        if pid not in facts:
            described: dict[str, Any] = {"state": "listening"}
            described.update(process_facts(pid, procs, obs))
            facts[pid] = json.dumps(described, sort_keys=True)
        return facts[pid]

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
                col.add("sockets", f"{proto} {ip}:{port} {who}"[:500], value(inode))
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
            col.add("sockets", f"unix {f[7]} {who}"[:500], value(f[6]))
