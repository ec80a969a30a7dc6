"""The unmanaged arm: nothing is checkpointed by the harness.

Its recoverable point is the application's own last checkpoint when the workload has one
(the plan's `workload.app_checkpoint`), else the start; recovery restarts the command
(with the plan's resume arguments when there is an application checkpoint to resume).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasks.data.arms import UNMANAGED
from tasks.data.events import Ev
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.process import ProcessSlots, WorkloadProcess


@dataclass(frozen=True)
class RecoverablePoint:
    kind: str  # "app_checkpoint" | "start"
    path: Path | None


class NoCheckpointer:
    def __init__(
        self,
        recorder: EventRecorder,
        trial_id: str,
        app_checkpoint: Path | None,
        resume_args: list[str],
        arm: str = UNMANAGED,
    ) -> None:
        self._recorder, self._trial, self._arm = recorder, trial_id, arm
        self.app_checkpoint = app_checkpoint
        self.resume_args = resume_args

    def recoverable_point(self) -> RecoverablePoint:
        if self.app_checkpoint is not None and self.app_checkpoint.exists():
            return RecoverablePoint("app_checkpoint", self.app_checkpoint)
        return RecoverablePoint("start", None)

    def restart(
        self, cluster: ProcessSlots, slot: str, argv: list[str], tag: str = ""
    ) -> WorkloadProcess:
        point = self.recoverable_point()
        extra = self.resume_args if point.kind == "app_checkpoint" else []
        self._recorder.record(
            self._trial, self._arm, Ev.RESTART_START, recoverable_point=point.kind
        )
        proc = cluster.start(slot, self._arm, [*argv, *extra], tag=tag)
        self._recorder.record(
            self._trial, self._arm, Ev.RESTARTED, pid=proc.pid, recoverable_point=point.kind
        )
        return proc
