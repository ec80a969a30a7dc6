"""One workload copy as every backend starts, follows and ends it (tasks/engine/clusters/base:
`Cluster.start_copy`): what to start where, the handle the stages follow, and what its end
leaves (its dumps' failures, read from its own events, so both backends say them alike)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tasks.data.errors import CkptPocError
from tasks.data.events import Ev
from tasks.engine.clock import EventRecorder


class CopyNeverStarted(CkptPocError):
    """A copy whose node never ran it within its timeout (a Slurm job left pending): the
    stage ends with the scheduler's reason, committing nothing (the run could not finish;
    it is no verdict on rows)."""


@dataclass(frozen=True)
class CopyRequest:
    """One copy to start: its trial and arm, the plan node it runs on, what it runs, and the
    arm's opt-in (``checkpoint``: the plan's checkpointer dumps it every
    ``checkpointer.interval_s`` on that node, into ``checkpoint_root``)."""

    trial: str
    arm: str
    node: str
    copy_dir: Path  # its own folder: log, job records, checkpoints
    argv: list[str]
    checkpoint: bool = False
    checkpoint_root: Path | None = None  # default copy_dir / "criu"
    exclusive: bool = False  # the node to itself (a timed run)
    fingerprint: bool = False  # read the node's fingerprint where the copy runs
    start_timeout_s: float = 300  # a job that has not started by then ends the stage

    @property
    def checkpoints(self) -> Path:
        return self.checkpoint_root or self.copy_dir / "criu"


class WorkloadCopy(Protocol):
    request: CopyRequest

    @property
    def log(self) -> Path:
        """Where the copy writes (the probes follow it)."""
        ...

    @property
    def names(self) -> dict[str, str | int]:
        """What the events name it by: its pid, or its job id."""
        ...


@dataclass
class CopyEnd:
    """What a copy's end leaves: its dumps that failed, apart from those its own end cut."""

    checkpoint_errors: list[str] = field(default_factory=list)
    dumps_cut_by_exit: int = 0
    failures: list[BaseException] = field(default_factory=list)  # a worker's death: a bug


def dump_failures(recorder: EventRecorder, request: CopyRequest) -> CopyEnd:
    """The copy's failed dumps, from its `checkpoint_failed` events (a dump the workload's own
    end cut short is counted apart, as the trials say it: checkpoints.WORKLOAD_EXITED)."""
    end = CopyEnd()
    for event in recorder.events(request.trial, request.arm, Ev.CHECKPOINT_FAILED):
        if event.detail.get("workload_exited"):
            end.dumps_cut_by_exit += 1
            continue
        tail = str(event.detail.get("log_tail") or "").strip().splitlines()
        end.checkpoint_errors.append(
            f"checkpoint {event.detail.get('index')} failed (rc {event.detail.get('rc')})"
            + (f": {tail[-1]}" if tail else "")
        )
    return end
