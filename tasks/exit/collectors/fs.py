"""Reading files without changing or following them: hashes, entry types, a walk."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from tasks.exit.collectors.base import Collector

CHUNK = 1 << 20


def sha256_file(path: Path | str) -> str:
    """Hash without following a symlink and without blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb", buffering=0) as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def md5_file(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def capabilities(path: str) -> str | None:
    try:
        raw = os.getxattr(path, "security.capability", follow_symlinks=False)
    except OSError:
        return None  # ENODATA: none; ENOTSUP: the filesystem has no xattrs, so none either
    return raw.hex()


def type_letter(mode: int) -> str:
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


def under(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def walk(
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
            if under(path, skip):
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


def hash_files(col: Collector, kind: str, paths: list[Path]) -> None:
    """A ``kind`` row per path under the collector's root: its link or its sha256."""
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
