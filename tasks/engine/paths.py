"""Where a run's files go, and each workload copy's own folder in its argv.

One definition, imported by the clock (its journal), the engines and the experiments. It
imports nothing else of the project: a Slurm job's wrapper loads the clock, and starts fast.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.data.plan import Plan
    from tasks.data.runctx import RunContext

COPY_DIR = "{copy_dir}"
PREPARED = "{prepared}"
PORT = "{port}"


def run_folder(ctx: RunContext) -> Path:
    return ctx.data_dir / ctx.poc / "runs" / ctx.run_id


def prepared_root(data_dir: str | Path, poc: str) -> Path:
    """The PoC's prepared folders' parent, under the plan's data_dir."""
    return Path(data_dir).resolve() / poc / "prepared"


def prepared_folder(data_dir: str | Path, poc: str, workload: str) -> Path:
    """``{prepared}``: what a workload's ``prepare`` writes once for all its copies (weights,
    a data set), one folder per workload and PoC under the plan's data_dir."""
    return prepared_root(data_dir, poc) / workload


def copy_word(word: str, copy_dir: Path, prepared: Path | None, port: int | None) -> str:
    """One plan word for one copy: ``{copy_dir}`` its own folder, ``{prepared}`` its
    workload's prepared folder, ``{port}`` the port picked for it."""
    word = word.replace(COPY_DIR, str(copy_dir))
    word = word.replace(PREPARED, str(prepared)) if prepared else word
    return word.replace(PORT, str(port)) if port is not None else word


def copy_argv(
    argv: list[str], copy_dir: Path, prepared: Path | None = None, port: int | None = None
) -> list[str]:
    """The plan's argv for one copy, its placeholders filled in (copy_word)."""
    return [copy_word(a, copy_dir, prepared, port) for a in argv]


def images_folder(copy_dir: Path, images_dir: str | None, data_dir: str | Path, poc: str) -> Path:
    """Where one copy's checkpoint images go: ``copy_dir/criu``, or with the plan's
    ``checkpointer.images_dir`` the same path under that folder's PoC folder."""
    if images_dir is None:
        return copy_dir / "criu"
    copy_dir = Path(copy_dir).resolve()
    try:
        relative = copy_dir.relative_to(Path(data_dir).resolve() / poc)
    except ValueError:  # a run folder under another data dir (the run's own): from runs/ on
        parts = copy_dir.parts
        cut = len(parts) - 1 - parts[::-1].index("runs") if "runs" in parts else len(parts) - 1
        relative = Path(*parts[cut:])
    return Path(images_dir) / poc / relative / "criu"


def checkpoint_folder(plan: Plan, copy_dir: Path) -> Path:
    """The plan's folder for one copy's checkpoint images (images_folder)."""
    return images_folder(copy_dir, plan.checkpointer.images_dir, plan.data_dir, plan.poc)


def images_roots(plan: Plan, ctx: RunContext) -> list[Path]:
    """The folders every checkpoint root of the PoC's runs lies under (stale ones are
    cleaned there): its runs folder, and the images_dir's runs folder when set."""
    images_dir = plan.checkpointer.images_dir
    return [run_folder(ctx).parent] + ([Path(images_dir) / ctx.poc / "runs"] if images_dir else [])


def _unescape_mount(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_point(
    path: str | Path, mountinfo: str = "/proc/self/mountinfo"
) -> tuple[str, str | None]:
    """The mount ``path`` lies on (the longest mount-point prefix) and its file system type;
    ("/", None) when mountinfo cannot be read.

    Symlinks in the part of ``path`` that exists are resolved; the rest (a log or folder
    not created yet) lies on the mount its deepest existing part is on, so it matches too.
    """
    p = os.path.realpath(path)
    best, fstype = "/", None
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                left, sep, right = line.partition(" - ")
                fields = left.split()
                if not sep or len(fields) < 5 or not right.split():
                    continue
                mnt = _unescape_mount(fields[4])
                prefix = mnt.rstrip("/") + "/"
                # >=: a later line for the same mount point is mounted over the earlier one.
                if (p == mnt or p.startswith(prefix)) and len(mnt) >= len(best):
                    best, fstype = mnt, right.split()[0]
    except OSError:
        return "/", None
    return best, fstype


def mount_fstype(path: Path, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The file system type ``path`` lives on (mount_point); None if unknown."""
    return mount_point(path, mountinfo)[1]
