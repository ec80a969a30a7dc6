"""What the managed arm's checkpointer offers, and the checkpointers keyed by the plan's
``checkpointer.kind``.

- ``criu`` (criu.py): the harness takes and restores CRIU checkpoints; the engines build
  it through `managed_checkpointer`.
- ``cedana`` (cedana.py): contract only — its install steps, the sbatch opt-in, its API
  requests and the exit checklist; no checkpoint is taken here, so it has nothing to build.
- ``none`` (none.py, `NoCheckpointer`): the unmanaged arm of every plan, not a plan kind;
  what it resumes from is the application's own checkpoint, or the start.

A checkpointer the engines run is one module whose class has what `Checkpointer` names,
plus one entry in `CHECKPOINTERS`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tasks.data.arms import MANAGED
from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan
from tasks.engine.checkpointers.criu import Checkpoint, CriuCheckpointer
from tasks.engine.checkpointers.criu_gpu import gpu_checkpointer
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.process import ProcessSlots, WorkloadProcess


class Checkpointer(Protocol):
    """Checkpoints one workload copy (the managed arm) and brings it back from them."""

    def record(self, event: str, **detail: object) -> Event: ...

    def dump(
        self, proc: WorkloadProcess, *, leave_running: bool = True, timeout: float | None = None
    ) -> Checkpoint:
        """Take one checkpoint of the running copy (it runs on afterwards, unless
        ``leave_running`` is off: a notice's dump ends it), within ``timeout`` seconds."""
        ...

    def complete(self) -> list[Checkpoint]: ...

    def last_complete(self) -> Checkpoint | None: ...

    def restore(
        self, cluster: ProcessSlots, slot: str, checkpoint: Checkpoint | None = None
    ) -> WorkloadProcess:
        """The copy again on ``slot``, from ``checkpoint`` (default: the last complete)."""
        ...

    def close(self) -> None:
        """Let go of the checkpoints' folder (as the end of this process would)."""
        ...


# (root, keep, recorder, trial_id, arm, timeout_s) -> the copy's checkpointer
Build = Callable[[Path, int, EventRecorder, str, str, float], Checkpointer]


@dataclass(frozen=True)
class CheckpointerKind:
    kind: str
    build: Build | None  # None: contract only, nothing is checkpointed here
    what: str


def _criu(
    root: Path, keep: int, recorder: EventRecorder, trial_id: str, arm: str, timeout_s: float
) -> Checkpointer:
    return CriuCheckpointer(root, keep, recorder, trial_id, arm, timeout_s=timeout_s)


CHECKPOINTERS: dict[str, CheckpointerKind] = {
    "criu": CheckpointerKind("criu", _criu, "CRIU dumps and restores, taken by the harness"),
    "cedana": CheckpointerKind(
        "cedana", None, "contract only: install steps, opt-in, API requests, exit checklist"
    ),
}
# The kinds the engines checkpoint with here.
RUN_HERE = tuple(kind for kind, entry in CHECKPOINTERS.items() if entry.build is not None)


def ensure_runs_on(plan: Plan, who_runs: str, clusters: Collection[str]) -> None:
    """Refuse a plan whose cluster or checkpointer kind ``who_runs`` (e.g. "recovery runs
    on") does not run: it runs ``clusters`` with a checkpointer of `RUN_HERE`."""
    if plan.cluster.kind in clusters and plan.checkpointer.kind in RUN_HERE:
        return
    raise CkptPocError(
        f"{who_runs} cluster.kind {' or '.join(map(repr, clusters))} with checkpointer "
        f"{' or '.join(map(repr, RUN_HERE))} here; this plan has {plan.cluster.kind!r} with "
        f"{plan.checkpointer.kind!r}"
    )


def managed_checkpointer(
    plan: Plan,
    root: Path,
    recorder: EventRecorder,
    trial_id: str,
    *,
    arm: str = MANAGED,
    keep: int | None = None,
    timeout_s: float = 600,
) -> Checkpointer:
    """The plan's checkpointer for one copy, checkpointing into ``root`` (keeping the
    plan's ``keep``, unless given)."""
    entry = CHECKPOINTERS[plan.checkpointer.kind]
    if entry.build is None:
        raise CkptPocError(f"checkpointer {entry.kind!r} is {entry.what}: it runs nothing here")
    built = entry.build(
        root, plan.checkpointer.keep if keep is None else keep, recorder, trial_id, arm, timeout_s
    )
    if isinstance(built, CriuCheckpointer):  # the workload's own options (workload.criu)
        built.add_options(plan.workload.criu.dump, plan.workload.criu.restore)
        if plan.checkpointer.gpu:  # the copies' GPU state toggled around each dump
            return gpu_checkpointer(built)
    return built
