"""``files``: every entry under the watched paths (sha256, mode, owner, capabilities, links),
names and types only in the busy folders; never /proc, /sys or the plan's data folder."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tasks.exit.collectors.base import Collector, Observation
from tasks.exit.collectors.fs import capabilities, sha256_file, type_letter, walk

NEVER_WALKED = ("/proc", "/sys")  # virtual: their "files" are the kernel's live state
NAMES_ONLY_DEPTH = 2  # /var/log/NAME and /var/log/slurm/NAME; deeper is the tools' business
HASH_THREADS = 4  # hashlib releases the GIL: reads and hashes overlap on a cold cache

# (key, path, item) of a regular file whose sha256 is still to be read.
_ToHash = list[tuple[str, str, dict[str, Any]]]


def _names_only_depth(path: str, folders: list[str]) -> int | None:
    """How deep ``path`` lies below the names-only folder holding it (None: in none)."""
    for folder in folders:
        if path == folder:
            return 0
        if path.startswith(folder.rstrip("/") + "/"):
            return path[len(folder.rstrip("/")) :].count("/")
    return None


def collect_files(col: Collector, obs: Observation) -> None:
    watch, data_dirs = obs.watch, obs.data_dirs
    skip = [str(col.path(s)) for s in (*NEVER_WALKED, *data_dirs)]
    for folder in data_dirs:
        col.excluded(f"files:{folder}", "the PoC's own folder: its records (data_dir) or images")
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
    to_hash: _ToHash = []
    for top in watch.paths:
        for path, st in walk(str(col.path(top)), skip, col, descend):
            if path in done:  # watched paths may overlap (/var/lib and /var/lib/x)
                continue
            done.add(path)
            key = path[len(root) :] if root else path
            mode = st.st_mode
            depth = _names_only_depth(path, names_only)
            if depth:  # inside a busy folder (the folder itself is described fully)
                col.add("files", key, {"type": type_letter(mode)})
                continue
            item: dict[str, Any] = {
                "type": type_letter(mode),
                "mode": oct(stat.S_IMODE(mode)),
                "owner": f"{st.st_uid}:{st.st_gid}",
            }
            if stat.S_ISLNK(mode):
                item["link"] = os.readlink(path)
            elif stat.S_ISREG(mode):
                caps = capabilities(path)
                if caps:
                    item["caps"] = caps
                to_hash.append((key, path, item))
                continue
            elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                item["rdev"] = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
            col.add("files", key, item)
    _add_hashed(col, to_hash)


def _add_hashed(col: Collector, to_hash: _ToHash) -> None:
    """The regular files' rows, once their sha256 is read (in threads, in walk order)."""

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
