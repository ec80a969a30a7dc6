"""What every snapshot collector shares: the rows it adds to, what it is told, its signature.

A collector observes one kind (docs/design.md §1.8) of THIS machine, read-only, and adds one row per
item to a `Collector`; what it cannot read is an ``error`` row, what it leaves out on purpose
an ``excluded`` row. The registry in `tasks.exit.collectors` maps each kind the plan's
``exit.watch`` names to its collector.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from tasks.baseline.pseudonym import Pseudonymiser
from tasks.data.errors import CkptPocError
from tasks.data.plan import Watch

CMD_TIMEOUT_S = 60

# One process of the process table: exe, argv, uid, ppid, kernel thread or not, cwd and the
# names of the PoC's marker variables in its environment (never their values).
ProcessInfo = dict[str, Any]
ProcessTable = dict[int, ProcessInfo]


class Collector:
    """Rows of one snapshot; an item seen twice keeps its first value."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.items: dict[tuple[str, str], str] = {}

    def add(self, kind: str, key: str, value: Any) -> None:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        self.items.setdefault((kind, key), text)

    def error(self, what: str, why: Any) -> None:
        self.add("error", what, str(why))

    def excluded(self, what: str, why: str) -> None:
        self.add("excluded", what, why)

    def path(self, absolute: str) -> Path:
        """An absolute node path under the collector's root (tests use a fake root)."""
        return self.root / absolute.lstrip("/")

    def rows(self) -> list[dict[str, str]]:
        return [{"kind": k, "key": key, "value": v} for (k, key), v in self.items.items()]


@dataclass(frozen=True)
class Observation:
    """What one `collect` call observes, as every collector is told it.

    ``data_dirs``: absolute folders never walked (the plan's data folder); ``scheduler``: the
    scheduler holding a view of the node (None: a local plan); ``env``: the environment its
    commands run with (None: this process's); ``processes``: the process table read once
    for the kinds that share it (None: a collector reads its own); ``pseudonymiser``: keys
    the hash a process's argv is stored as (None: a kind that stores no argv was asked);
    ``argv_rules``: the plan's allowed argv globs, matched here and stored by name;
    ``poc_paths``: the PoC's own folders (its checkout, its install prefix root): a process
    run from one is the PoC's."""

    node: str
    watch: Watch
    data_dirs: list[str] = field(default_factory=list)
    scheduler: Literal["slurm", "kubernetes"] | None = None
    env: Mapping[str, str] | None = None
    processes: ProcessTable | None = None
    pseudonymiser: Pseudonymiser | None = field(default=None, repr=False)
    argv_rules: tuple[str, ...] = ()
    poc_paths: tuple[str, ...] = ()


class SnapshotCollector(Protocol):
    """One kind's collector: adds that kind's rows (and its error/excluded rows) to ``col``."""

    def __call__(self, col: Collector, obs: Observation, /) -> None: ...


def run_command(argv: list[str], env: Mapping[str, str] | None = None) -> str:
    """A read-only command's stdout; CkptPocError with its reason otherwise."""
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT_S,
            check=False,
            env=dict(env) if env is not None else None,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CkptPocError(f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        detail = (done.stderr.strip() or done.stdout.strip())[-300:]
        raise CkptPocError(f"{' '.join(argv)} exited {done.returncode}: {detail}")
    return done.stdout
