"""The local backend's copies: a process on a slot of this machine, the managed arm dumped
on a timer by the plan's checkpointer in the harness (tasks/engine/checkpointers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tasks.data.plan import Fault, Plan
from tasks.data.runctx import RunContext
from tasks.engine.checkpointers.base import Checkpointer, managed_checkpointer
from tasks.engine.checkpointers.periodic import PeriodicCheckpoints
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.copies import CopyEnd, CopyRequest, dump_failures
from tasks.engine.clusters.local.cluster import LocalCluster
from tasks.engine.clusters.local.preflight import preflight_local
from tasks.engine.clusters.local.recovery import LocalRecovery
from tasks.engine.clusters.process import WorkloadProcess
from tasks.engine.preflight import PreflightResult


@dataclass
class LocalCopy:
    request: CopyRequest
    process: WorkloadProcess
    recorder: EventRecorder
    checkpointer: Checkpointer | None = None
    periodic: PeriodicCheckpoints | None = None

    @property
    def log(self) -> Path:
        return self.process.log

    @property
    def names(self) -> dict[str, str | int]:
        return {"pid": self.process.pid}


@dataclass
class LocalBackend(LocalCluster):
    """The local cluster with its copies (the `Cluster` protocol)."""

    plan: Plan | None = field(default=None, repr=False)

    @classmethod
    def for_plan(cls, plan: Plan, run_dir: Path, workdir: Path) -> LocalBackend:
        return cls(
            list(plan.cluster.nodes), run_dir, workdir, workload=plan.workload.name, plan=plan
        )

    def start_copy(self, request: CopyRequest, recorder: EventRecorder) -> LocalCopy:
        assert self.plan is not None, "a copy is started for a plan (LocalBackend.for_plan)"
        request.copy_dir.mkdir(parents=True, exist_ok=True)
        copy = LocalCopy(request, self.start(request.node, request.arm, request.argv), recorder)
        if request.checkpoint:
            copy.checkpointer = managed_checkpointer(
                self.plan, request.checkpoints, recorder, request.trial, arm=request.arm
            )
            copy.periodic = PeriodicCheckpoints(
                copy.checkpointer,
                copy.process,
                self.plan.checkpointer.interval_s,
            ).start()
        return copy

    def copy_alive(self, copy: LocalCopy) -> bool:
        if copy.periodic is not None:
            copy.periodic.check()
        return copy.process.alive()

    def end_copy(self, copy: LocalCopy) -> CopyEnd:
        failures: list[BaseException] = []
        if copy.periodic is not None:
            try:
                copy.periodic.stop()
            except BaseException as exc:  # the checkpoint thread's death: the run's failure
                failures.append(exc)
        if copy.checkpointer is not None:
            copy.checkpointer.close()
            copy.checkpointer = None
        end = dump_failures(copy.recorder, copy.request)
        end.failures += failures
        return end

    def copy_gpus(self, copy: LocalCopy) -> int | None:
        return None  # a local slot is given no GPUs: the copy sees the machine's

    def preflight(
        self, ctx: RunContext, timeout_s: float, queue_timeout_s: float = 0
    ) -> PreflightResult:
        assert self.plan is not None, "a preflight is for a plan (LocalBackend.for_plan)"
        return preflight_local(self.plan, ctx, self, timeout_s)

    def recovery_steps(self, fault: Fault) -> LocalRecovery:
        return LocalRecovery(self)
