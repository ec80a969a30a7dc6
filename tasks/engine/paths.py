"""Where a run's files go, and each workload copy's own folder in its argv.

One definition, imported by the clock (its journal), the engines and the experiments. It
imports nothing else of the project: a Slurm job's wrapper loads the clock, and starts fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
