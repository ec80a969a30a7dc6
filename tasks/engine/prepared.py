"""What the comparisons' workload reads at start, prepared once before its copies.

A production job reads its model, weights and data from storage at every start: that
reading is what a restore saves. A workload's ``prepare`` commands write such files (the
examples: ``python -m examples.weights {prepared}/weights.safetensors --mb N``), and its
command reads them. The comparisons (recovery, overhead, cold start, side by side) run the
first workload's ``prepare`` once per stage run, before their first copy, in the workload's
``{prepared}`` folder (tasks/engine/paths.py); a prepare command that finds its output up to
date keeps it, so the second stage costs little. The compatibility stage runs each
workload's ``prepare`` in each copy's folder, with the same ``{prepared}``.

On Slurm the commands run from the harness host into the plan's data_dir, which the nodes
share (their jobs write their logs there too), not inside a job.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan, ReadyProbe
from tasks.engine.interpreter import resolve_workload_argv, workload_env
from tasks.engine.paths import PREPARED, copy_argv, copy_word, prepared_folder
from tasks.engine.ports import free_port

OUTPUT_SAID = 400  # characters of a failed command's output in a message


class PrepareFailed(CkptPocError):
    """A ``prepare`` command failed; ``field`` names its plan item (``workloads.N.prepare.I``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class Prepared:
    folder: Path
    seconds: float
    commands: int


def workload_prepared(plan: Plan) -> Path:
    """The comparisons' workload's ``{prepared}`` folder."""
    return prepared_folder(plan.data_dir, plan.poc, plan.workload.name)


def copy_port(plan: Plan) -> int | None:
    """A port for one copy of the comparisons' workload, when its words use ``{port}`` (cold
    start's server may; the harness picks it on its host, which is the node here and on a
    Slurm cluster whose harness runs on the node it tests)."""
    return free_port() if plan.workload.uses_port else None


def workload_argv(plan: Plan, copy_dir: Path, port: int | None = None) -> list[str]:
    """The comparisons' workload command for one copy, its placeholders filled in."""
    return copy_argv(plan.workload.command or [], copy_dir, workload_prepared(plan), port)


def workload_ready_probe(plan: Plan, copy_dir: Path, port: int | None = None) -> ReadyProbe | None:
    """The comparisons' workload's ready probe for one copy, its placeholders filled in."""
    probe = plan.workload.ready_probe
    if probe is None:
        return None
    return probe.filled(lambda w: copy_word(w, copy_dir, workload_prepared(plan), port))


def output_said(text: str | bytes | None) -> str:
    """A failed command's output for a message: its last OUTPUT_SAID characters."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return (text or "").strip()[-OUTPUT_SAID:] or "(no output)"


def run_prepare_commands(
    commands: list[list[str]],
    fill: Callable[[str], str],
    *,
    cwd: Path,
    workdir: Path,
    env: dict[str, str],
    field: str,
    timeout_s: float,
) -> None:
    """Run ``commands`` (their words ``fill``ed) in order in ``cwd``, with the workload's
    ``env`` over ours; the first that fails raises PrepareFailed naming ``field.I``.
    ``python -m examples.…`` finds the workdir's packages from ``cwd`` too (on PYTHONPATH),
    as it does for the command, which runs from the workdir."""
    full = {**workload_env(), **env}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(workdir), full.get("PYTHONPATH", "")) if p)
    for i, argv in enumerate(commands):
        words = resolve_workload_argv([fill(w) for w in argv])
        where = f"{field}.{i}"
        try:
            done = subprocess.run(
                words,
                cwd=cwd,
                env=full,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise PrepareFailed(where, f"{words[0]!r} is not found") from None
        except subprocess.TimeoutExpired:
            raise PrepareFailed(where, f"did not finish within {timeout_s:.0f} s") from None
        if done.returncode != 0:
            raise PrepareFailed(
                where, f"exited {done.returncode}: {output_said(done.stderr or done.stdout)}"
            )


def prepare_workload(plan: Plan, timeout_s: float, workdir: Path | None = None) -> Prepared:
    """Run the first workload's ``prepare`` commands in order in its ``{prepared}`` folder
    (its ``{copy_dir}`` too); the first that fails raises PrepareFailed naming
    ``workloads.0.prepare.N``."""
    folder = workload_prepared(plan)
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    run_prepare_commands(
        plan.workload.prepare,
        lambda word: copy_argv([word], folder, folder)[0],
        cwd=folder,
        workdir=workdir or Path.cwd(),
        env={k: v.replace(PREPARED, str(folder)) for k, v in plan.workload.env.items()},
        field="workloads.0.prepare",
        timeout_s=timeout_s,
    )
    return Prepared(folder, time.monotonic() - t0, len(plan.workload.prepare))
