"""One copy of a workload for the compatibility stage: its folder, port, argv and env, its
``prepare`` commands, and its fidelity query.

Placeholders (tasks/data/plan_workload.py): ``{copy_dir}`` the copy's own folder, ``{port}``
a free TCP port picked for the copy, ``{workdir}`` the folder workloads run from (where a
plan's relative paths resolve: the repo for the shipped examples).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tasks.data.plan import ReadyProbe, Workload
from tasks.data.plan_workload import COPY_DIR, PORT, PREPARED, WORKDIR
from tasks.engine.interpreter import resolve_workload_argv, workload_env
from tasks.engine.ports import free_port
from tasks.engine.prepared import PrepareFailed, output_said, run_prepare_commands
from tasks.experiments.compatibility_fidelity import BadInput, CopyFiles


@dataclass(frozen=True)
class Copy:
    """One copy: where it runs, and its plan words with the placeholders filled in."""

    workload: Workload
    field: str  # "workloads.N": where the plan says it
    name: str  # "reference", "managed-1", …
    copy_dir: Path
    workdir: Path
    port: int | None
    prepared: Path  # {prepared}: what prepare writes once for every copy (weights, data)

    def fill(self, word: str) -> str:
        word = word.replace(COPY_DIR, str(self.copy_dir)).replace(WORKDIR, str(self.workdir))
        word = word.replace(PREPARED, str(self.prepared))
        return word.replace(PORT, str(self.port)) if self.port is not None else word

    @property
    def argv(self) -> list[str]:
        return [self.fill(w) for w in self.workload.command or []]

    @property
    def env(self) -> dict[str, str]:
        return {k: self.fill(v) for k, v in self.workload.env.items()}

    @property
    def ready_probe(self) -> ReadyProbe | None:
        probe = self.workload.ready_probe
        return probe.filled(self.fill) if probe else None

    def files(self, log: Path) -> CopyFiles:
        return CopyFiles(self.copy_dir, log)


def make_copy(
    workload: Workload, field: str, name: str, run_dir: Path, workdir: Path, prepared: Path
) -> Copy:
    copy_dir = run_dir / f"compat-{workload.name}" / name
    copy_dir.mkdir(parents=True, exist_ok=True)
    prepared.mkdir(parents=True, exist_ok=True)
    port = free_port() if workload.uses_port else None
    return Copy(workload, field, name, copy_dir, workdir, port, prepared)


def run_prepare(copy: Copy, timeout_s: float) -> None:
    """The workload's ``prepare`` commands, in order, in the copy's folder; the first that
    fails is bad input naming its item."""
    try:
        run_prepare_commands(
            copy.workload.prepare,
            copy.fill,
            cwd=copy.copy_dir,
            workdir=copy.workdir,
            env=copy.env,
            field=f"{copy.field}.prepare",
            timeout_s=timeout_s,
        )
    except PrepareFailed as exc:
        raise BadInput(exc.field, exc.message) from None


def run_query(copy: Copy, when: str) -> str:
    """The fidelity query's output (exit status and stdout); bad input if it cannot run
    or fails ``when`` is "the reference run" (a query that fails later is a finding)."""
    fidelity = copy.workload.fidelity
    assert fidelity is not None and fidelity.query is not None
    words = resolve_workload_argv([copy.fill(w) for w in fidelity.query])
    where = f"{copy.field}.fidelity.query"
    try:
        done = subprocess.run(
            words,
            cwd=copy.workdir,
            env={**workload_env(), **copy.env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=fidelity.query_timeout_s,
            check=False,
        )
    except FileNotFoundError:
        raise BadInput(where, f"{words[0]!r} is not found") from None
    except subprocess.TimeoutExpired:
        if when == "the reference run":
            raise BadInput(where, f"no answer within {fidelity.query_timeout_s:g} s") from None
        return f"timed out after {fidelity.query_timeout_s:g} s"
    if done.returncode != 0 and when == "the reference run":
        raise BadInput(
            where, f"exited {done.returncode} in {when}: {output_said(done.stderr or done.stdout)}"
        )
    return f"exit {done.returncode}\n{done.stdout.decode('utf-8', 'replace')}"
