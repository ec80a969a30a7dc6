"""The Slurm backend's copies: a batch job pinned to the plan's node, running the one
wrapper every ckpt-poc job runs (tasks/engine/clusters/slurm/job.py); the managed arm's job is opted
in (its wrapper dumps the copy with the node's CRIU every ``checkpointer.interval_s``). The
job appends its events to a file beside its log, which the harness takes in."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tasks.data.arms import UNMANAGED
from tasks.data.plan import Fault, Plan
from tasks.data.runctx import RunContext
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.copies import CopyEnd, CopyRequest, dump_failures
from tasks.engine.clusters.fault_kind import has_notice
from tasks.engine.clusters.slurm.cluster import ACTIVE_STATES, SlurmCluster, SlurmJob
from tasks.engine.clusters.slurm.recovery import SlurmRecovery
from tasks.engine.clusters.slurm.recovery_notice import SlurmNoticeRecovery
from tasks.engine.clusters.slurm.spec import copy_spec
from tasks.engine.paths import run_folder
from tasks.engine.preflight import TRIAL, PreflightResult, await_first_sign
from tasks.engine.prepared import (
    copy_port,
    prepare_workload,
    workload_argv,
    workload_ready_probe,
)


@dataclass
class SlurmCopy:
    request: CopyRequest
    job: SlurmJob
    recorder: EventRecorder

    @property
    def log(self) -> Path:
        return self.job.log

    @property
    def events(self) -> Path:
        return self.request.copy_dir / "job-events.jsonl"

    @property
    def names(self) -> dict[str, str | int]:
        return {"job_id": self.job.job_id}


@dataclass
class SlurmBackend(SlurmCluster):
    """The Slurm cluster with its copies (the `Cluster` protocol)."""

    plan: Plan | None = field(default=None, repr=False)
    copies: list[SlurmCopy] = field(default_factory=list, repr=False)

    @classmethod
    def for_plan(cls, plan: Plan, run_dir: Path, workdir: Path) -> SlurmBackend:
        return cls(list(plan.cluster.nodes), plan.cluster.queue, run_dir, workdir, plan=plan)

    def start_copy(self, request: CopyRequest, recorder: EventRecorder) -> SlurmCopy:
        """Submit the copy's job and wait until it runs; one that never starts is cancelled
        and raises JobNeverStarted with Slurm's reason (the stage ends with it)."""
        assert self.plan is not None, "a copy is started for a plan (SlurmBackend.for_plan)"
        request.copy_dir.mkdir(parents=True, exist_ok=True)
        log = request.copy_dir / "workload.log"
        spec = copy_spec(
            self.plan,
            request.trial,
            request.arm,
            request.copy_dir,
            checkpoint=request.checkpoint,
            mode="run",
            argv=request.argv,
            ckpt_root=str(request.checkpoints),
            fingerprint=request.fingerprint,
        )
        job = self.submit(
            request.node,
            request.arm,
            spec,
            name=request.trial,
            log=log,
            gpus=self.plan.workload.gpus,
            exclusive=request.exclusive,
        )
        copy = SlurmCopy(request, job, recorder)
        self.copies.append(copy)
        self.wait_started(job, request.start_timeout_s)
        return copy

    def copy_alive(self, copy: SlurmCopy) -> bool:
        copy.recorder.import_jsonl(copy.events)
        return self.observe(copy.job)[0] in ACTIVE_STATES

    def end_copy(self, copy: SlurmCopy) -> CopyEnd:
        copy.recorder.import_jsonl(copy.events)
        return dump_failures(copy.recorder, copy.request)

    def copy_gpus(self, copy: SlurmCopy) -> int | None:
        return self.allocated_gpus(copy.job)

    def stop_all(self) -> list[str]:
        """Cancel what still runs, then take in what the copies' jobs recorded of their end."""
        left = super().stop_all()
        for copy in self.copies:
            copy.recorder.import_jsonl(copy.events)
        return left

    def preflight(
        self, ctx: RunContext, timeout_s: float, queue_timeout_s: float = 0
    ) -> PreflightResult:
        """The preflight as a Slurm job on the plan's first node; a copy may wait in the
        queue first (``queue_timeout_s`` covers that too)."""
        assert self.plan is not None, "a preflight is for a plan (SlurmBackend.for_plan)"
        plan, node = self.plan, self.plan.cluster.nodes[0]
        prepare_workload(plan, timeout_s)
        copy_dir = run_folder(ctx) / TRIAL
        copy_dir.mkdir(parents=True, exist_ok=True)
        log = copy_dir / "workload.log"
        port = copy_port(plan)
        argv = workload_argv(plan, copy_dir, port)
        spec = copy_spec(
            plan,
            TRIAL,
            UNMANAGED,
            copy_dir,
            checkpoint=False,
            log=str(log),
            mode="run",
            argv=argv,
        )
        job = self.submit(node, TRIAL, spec, name=TRIAL, log=log, gpus=plan.workload.gpus)
        try:
            return await_first_sign(
                plan,
                log,
                lambda: self.observe(job)[0] in ACTIVE_STATES,
                max(timeout_s, queue_timeout_s),
                f"job {job.job_id}: {' '.join(argv)}",
                slice_s=0.5,
                ready=workload_ready_probe(plan, copy_dir, port),
            )
        finally:
            self.stop_all()

    def recovery_steps(self, fault: Fault) -> SlurmRecovery:
        """A fault with a notice requeues the same job; any other is followed by a new one."""
        return SlurmNoticeRecovery(self) if has_notice(fault) else SlurmRecovery(self)
