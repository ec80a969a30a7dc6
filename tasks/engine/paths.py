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


def run_folder(ctx: RunContext) -> Path:
    return ctx.data_dir / ctx.poc / "runs" / ctx.run_id


def copy_argv(argv: list[str], copy_dir: Path) -> list[str]:
    """The plan's argv for one copy: ``{copy_dir}`` becomes that copy's own folder."""
    return [a.replace(COPY_DIR, str(copy_dir)) for a in argv]
