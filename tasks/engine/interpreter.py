"""How a plan's workload command finds its interpreter, whoever starts the run.

A plan names its workload as an argv list, e.g. ``[python, -m, examples.train_digits, …]``.
Looked up on ``PATH``, ``python`` would be whatever the starting shell happens to have:
the project's environment under ``uv run``, the machine's Python in a Prefect worker or a
Slurm job. So the rule is fixed here, in one place, and used by every launcher (the local
cluster and the in-job wrapper on Slurm):

- ``python`` or ``python3`` as the first word means **the interpreter running ckpt-poc**
  (``sys.executable``: the project's ``.venv``, which has the examples' dependencies);
- every other program is looked up on ``PATH`` with that interpreter's ``bin`` folder
  first, so console scripts of the environment are found too;
- an absolute path is used as written (a plan that wants another interpreter says so).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

PROJECT_PYTHON_NAMES = frozenset({"python", "python3"})


def project_python() -> str:
    """The interpreter running ckpt-poc (its environment's ``bin/python``, unresolved)."""
    return sys.executable


def resolve_workload_argv(argv: list[str]) -> list[str]:
    """``argv`` with a bare ``python``/``python3`` replaced by the project's interpreter."""
    if argv and argv[0] in PROJECT_PYTHON_NAMES:
        return [project_python(), *argv[1:]]
    return list(argv)


def workload_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a workload copy runs in: ``base`` (default: ours) with the project
    environment's ``bin`` first on ``PATH``."""
    env = dict(os.environ if base is None else base)
    bin_dir = str(Path(project_python()).parent)
    parts = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
    env["PATH"] = os.pathsep.join([bin_dir, *parts])
    return env
