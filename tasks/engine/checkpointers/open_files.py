"""The files a checkpoint kept beside CRIU's images, so that a `--leave-running` dump restores.

CRIU records the size of every regular file the dumped tree holds open and refuses to restore
once one has changed (`File … has bad size 31156 (expect 26489)`, range.md): a workload left
running after a periodic dump goes on writing its own log and output files (GROMACS's md.log
and ener.edr), so by the time a fault comes every such file has grown. CRIU skips the check
only for files opened write-only with O_APPEND (the harness's stdout log is one).

A file the tree maps shared and writable is the same problem without CRIU's check: CRIU
keeps no copy of a file mapping's pages (they are the file's), so once the copy left running
has written on into it the restored memory meets later contents. Open MPI's shared-memory
transport (`/dev/shm/vader_segment.*`) is one: restored that way, a rank segfaults.

So at CRIU's `post-dump` action (the tree is still frozen: the files are exactly as the
images expect) ``save`` copies each such file, checked or mapped, into
``<checkpoint>/kept-files/``, and before a restore ``put_back`` writes them back in place
(same inode: the restored fds see them). The copy is what the checkpoint costs in bytes and
frozen time, and both are recorded.

This file runs as a script from scripts/criu-action-script (stdlib only: it starts inside
CRIU's freeze, where every millisecond counts).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

KEPT = "kept-files"
MANIFEST = "manifest.json"
# Past it a file is not copied, and the manifest says so. The checkpointer passes its
# keep_files_max setting (tasks/data/settings_bare.py, whose default this is).
DEFAULT_MAX_BYTES = 1 << 30
_O_ACCMODE, _O_WRONLY, _O_APPEND = 0o3, 0o1, 0o2000


def _tree(root: int) -> list[int]:
    """``root`` and every descendant (through each thread's children). The same walk as
    clusters/reaper.py's ``descendants``, kept here: this file runs alone, stdlib only,
    inside CRIU's freeze, where importing the package would cost frozen time."""
    seen, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.append(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                    todo.extend(int(c) for c in fh.read().split())
            except (OSError, ValueError):
                continue
    return seen


def _flags(pid: int, fd: str) -> int | None:
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def size_checked_writable(root: int) -> list[Path]:
    """Regular files the tree holds open for writing whose size CRIU checks at restore
    (all but write-only O_APPEND ones); deleted files are CRIU's own (ghost files)."""
    found: dict[Path, None] = {}
    for pid in _tree(root):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            flags = _flags(pid, fd)
            if flags is None or not flags & _O_ACCMODE:
                continue  # read-only
            if flags & _O_ACCMODE == _O_WRONLY and flags & _O_APPEND:
                continue  # CRIU does not check these
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.endswith(" (deleted)") or not stat.S_ISREG(st.st_mode):
                continue
            found[Path(target)] = None
    return list(found)


def shared_writable_mappings(root: int) -> list[Path]:
    """Regular files the tree maps shared and writable (``rw-s`` in /proc/PID/maps); not
    deleted ones (CRIU's) nor devices (a GPU's /dev/nvidia*)."""
    found: dict[Path, None] = {}
    for pid in _tree(root):
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not parts[1].startswith("rw") or parts[1][3] != "s":
                continue
            path = parts[5]
            if not path.startswith("/") or path.endswith(" (deleted)"):
                continue
            try:
                if stat.S_ISREG(os.stat(path).st_mode):
                    found[Path(path)] = None
            except OSError:
                continue
    return list(found)


def files_to_keep(root: int) -> list[Path]:
    return list(dict.fromkeys([*size_checked_writable(root), *shared_writable_mappings(root)]))


def save(root: int, checkpoint: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> dict:
    """Copy the tree's size-checked writable files and shared writable mappings into
    ``checkpoint``/kept-files; returns the manifest (also written there, atomically, last)."""
    kept = checkpoint / KEPT
    kept.mkdir(exist_ok=True)
    files, total = [], 0
    for n, path in enumerate(files_to_keep(root), 1):
        try:
            st = path.stat()
        except OSError:
            continue
        size = st.st_size
        # The mode too: a file put back where it was removed must have it again (CRIU's
        # restore checks it: "bad mode 0100644 (expect 0100600)" on Open MPI's segments).
        entry: dict[str, object] = {
            "path": str(path),
            "size": size,
            "mode": stat.S_IMODE(st.st_mode),
        }
        if total + size > max_bytes:
            entry["skipped"] = f"over the {max_bytes} bytes a checkpoint keeps beside its images"
        else:
            copy = kept / f"{n:04d}"
            shutil.copyfile(path, copy)
            entry["copy"] = copy.name
            total += size
        files.append(entry)
    manifest = {"files": files, "bytes": total}
    tmp = kept / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, kept / MANIFEST)
    return manifest


def action_env(pid: int, checkpoint: Path, max_bytes: int) -> dict[str, str]:
    """What scripts/criu-action-script needs to run ``save`` for this dump, files past
    ``max_bytes`` not copied. The checkpointer's call, in the package (run as the script,
    this file imports nothing of it)."""
    from tasks.data import env_markers

    return {
        env_markers.KEEP_FILES_PID: str(pid),
        env_markers.KEEP_FILES_DIR: str(checkpoint),
        env_markers.KEEP_FILES_LIMIT: str(max_bytes),
        env_markers.PYTHON: sys.executable,
    }


def read_manifest(checkpoint: Path) -> dict | None:
    try:
        return json.loads((checkpoint / KEPT / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def kept_bytes(checkpoint: Path) -> int:
    manifest = read_manifest(checkpoint)
    return int(manifest.get("bytes", 0)) if manifest else 0


def put_back(checkpoint: Path) -> tuple[int, int]:
    """Write each kept file back as it was at the dump (in place: same inode, its mode
    and owner kept); (files, bytes) put back. Nothing kept: (0, 0)."""
    manifest = read_manifest(checkpoint)
    if not manifest:
        return 0, 0
    count = total = 0
    for entry in manifest.get("files", []):
        if "copy" not in entry:
            continue  # skipped at the dump: CRIU's restore will say if it has grown
        source, target = checkpoint / KEPT / entry["copy"], Path(entry["path"])
        if not target.exists():
            # Its folder may have gone too: Open MPI removes its session directory (pmix_dstor
            # lock segments) once the job's ranks die, sometimes before the restore begins.
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
            if "mode" in entry:  # as it was at the dump, whatever the umask
                os.chmod(target, int(entry["mode"]))
        with open(source, "rb") as src, open(target, "r+b") as dst:
            shutil.copyfileobj(src, dst)
            dst.truncate()
        count, total = count + 1, total + int(entry["size"])
    return count, total


if __name__ == "__main__":  # scripts/criu-action-script: open_files.py ROOT_PID CHECKPOINT MAX
    save(int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
