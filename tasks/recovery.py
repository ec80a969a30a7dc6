"""Failure injection and recovery: every trial a row, both arms, one clock.

For each fault in the plan and each repeat, the unmanaged copy first, then the managed copy,
runs on the same node until the same step, gets the same real fault, and is brought back:
the unmanaged one restarted from its own checkpoint (or the start), the managed one
restored from its last complete CRIU checkpoint. One clock (fault_injected → serving_again)
and the same components on both arms:

    detection   fault_injected → detected        (the loss is observed)
    scheduling  detected → started               (resources held again)
    restore     started → restored               (CRIU restore, or the fresh process)
    warm-up     restored → serving_again         (the first new progress line)

What `started` means differs by cluster, and each row's `includes` says so: locally the
slot is free at once (scheduling ≈ 0); on Slurm it is the recovery job — a new job, linked
to the interrupted one — observed RUNNING, so queueing, the node's return after a
node-down fault and the old allocation's release are in it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tasks import experiments
from tasks.checkpointers.criu import (
    Checkpoint,
    CriuCheckpointer,
    CriuError,
    PeriodicCheckpoints,
    clean_dead_roots,
)
from tasks.checkpointers.none import NoCheckpointer
from tasks.checkpoints import checkpoint_rows
from tasks.clock import Event, EventRecorder, span_s
from tasks.clusters.local import LocalCluster, WorkloadProcess
from tasks.clusters.slurm import ACTIVE_STATES, SlurmCluster, SlurmError
from tasks.engine import copy_argv, run_folder
from tasks.errors import CkptPocError
from tasks.experiments import (
    LOG_TAIL,
    arms_differ_only_in_managed,
    as_trials,
    failures_of,
    require_command_and_progress,
    workload_hash,
)
from tasks.faults import inject_local_fault, inject_slurm_fault
from tasks.gates import CheckResult, plain_check
from tasks.plan import Fault, Plan
from tasks.preflight import (
    PREFLIGHT_TIMEOUT_S,
    PreflightResult,
    await_first_sign,
    log_tail,
    preflight_local,
)
from tasks.probes import LogProgressProbe, compile_progress, last_step_before, steps_in
from tasks.runctx import RunContext

GATE = "recovery"
CLOCK = "fault_injected→serving_again"
INCLUDES = {
    "local": "detection+scheduling+restore+warmup (local: scheduling is holding the slot again)",
    "slurm": (
        "detection+scheduling+restore+warmup (slurm: detection by squeue poll; scheduling is "
        "the old allocation's release, the recovery job's queueing and the node's return)"
    ),
}
ARMS_IN_ORDER = ("unmanaged", "managed")  # the unmanaged copy is faulted first
FAULT_DELIVERED = "fault_delivered"  # on a failed row's dict, never a `trials` column
TIME_LIMIT_CHECK_S = 60  # slurmctld's limit check runs about every 30 s; twice that


class TrialFailed(CkptPocError):
    """A trial that cannot give a number; its row says why."""


class RecoveryStopped(CkptPocError):
    """The run stopped early: its first trials all failed the same way before any fault."""


@dataclass
class TrialSetup:
    plan: Plan
    ctx: RunContext
    cluster: LocalCluster | SlurmCluster
    recorder: EventRecorder
    fault_step: int
    timeout_s: float
    fault_timeout_s: float = 10  # how long a delivered fault has to end the workload


@dataclass
class Moments:
    """The events one trial's numbers come from, up to the copy being back."""

    fault: Event
    detected: Event
    started: Event
    restored: Event
    recoverable: Event  # when the state recovery resumes from was the workload's
    step_at_fault: int | None
    resume_step: int


def _base_row(setup: TrialSetup, fault: str, arm: str, repeat: int, node: str) -> dict[str, Any]:
    plan = setup.plan
    return {
        "measure": "recovery",
        "trial_id": f"{fault}-{repeat}",
        "arm": arm,
        "fault": fault,
        "repeat": repeat,
        "started_at": dt.datetime.now(dt.UTC),
        "clock": CLOCK,
        "includes": INCLUDES[plan.cluster.kind],
        "gpus": plan.workload.gpus,
        "gpus_from": "plan",
        "nodes": node,
        "workload_hash": workload_hash(plan),
    }


def _serve_and_measure(
    row: dict[str, Any],
    setup: TrialSetup,
    probe: LogProgressProbe,
    log: Path,
    killed_at: int,
    m: Moments,
) -> None:
    """Wait for the first new progress line (`serving_again`), check the copy resumed
    where its recoverable point said, and fill the row's numbers."""
    plan, rec = setup.plan, setup.recorder
    seen = probe.wait_for(lambda s: s.offset > killed_at, setup.timeout_s)
    if seen is None:
        raise TrialFailed("no new progress after recovery")
    serving = rec.record(row["trial_id"], row["arm"], "serving_again", step=seen.step)
    row["serving_latency_ms"] = (serving.t_mono_ns - seen.t_mono_ns) / 1e6
    first_new = _first_new_step(log, killed_at, plan.workload.progress_probe.log_regex)
    if first_new != m.resume_step + 1:
        raise TrialFailed(
            f"resumed at step {first_new}, its recoverable point held {m.resume_step}"
        )
    lost_s = span_s(m.recoverable, m.fault)
    row.update(
        status="ok",
        recovery_s=span_s(m.fault, serving),
        detection_s=span_s(m.fault, m.detected),
        scheduling_s=span_s(m.detected, m.started),
        restore_s=span_s(m.started, m.restored),
        warmup_s=span_s(m.restored, serving),
        work_lost_s=lost_s,
        work_lost_gpu_h=lost_s * row["gpus"] / 3600,
        steps_lost=(m.step_at_fault or 0) - m.resume_step,
    )


def _fail(row: dict[str, Any], rec: EventRecorder, exc: Exception, log: Path) -> None:
    """Mark the row failed with its reason; keep the workload log's tail beside it (for the
    flow run's logs and the report, not the dataset) and whether the fault was delivered."""
    row.update(status="failed", reason=str(exc).splitlines()[0][:500])
    row[LOG_TAIL] = log_tail(log)
    row[FAULT_DELIVERED] = bool(rec.events(row["trial_id"], row["arm"], "fault_injected"))
    rec.record(row["trial_id"], row["arm"], "trial_failed", reason=row["reason"])


def _wait_for_step(
    probe: LogProgressProbe, alive: Callable[[], bool], step: int, timeout: float
) -> None:
    """Wait until the copy logs ``step``; fail as soon as it exits without reaching it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe.wait_for(lambda s: s.step >= step, 0.1):
            return
        if not alive():
            if probe.wait_for(lambda s: s.step >= step, 0.3):  # lines written before the end
                return
            last = probe.last
            raise TrialFailed(
                f"the copy exited at step {last.step if last else 'none'} before reaching "
                f"step {step}"
            )
    raise TrialFailed(f"the copy never reached step {step} within {timeout:.0f} s")


def _app_checkpoint(plan: Plan, copy_dir: Path) -> Path | None:
    app = plan.workload.app_checkpoint
    return Path(app.path.replace("{copy_dir}", str(copy_dir))) if app and app.path else None


def _app_resume_step(plan: Plan, step_at_fault: int | None) -> int:
    """The step the application's own last checkpoint holds (it writes every N steps)."""
    app = plan.workload.app_checkpoint
    assert app is not None
    return (step_at_fault or 0) // app.every_steps * app.every_steps


def _progress_event(rec: EventRecorder, trial: str, arm: str, step: int) -> Event:
    """The `progress` event of the first step at or after ``step`` (the application writes
    its checkpoint right after that step, so this is when its recoverable point existed)."""
    return next(
        e for e in rec.events(trial, arm, "progress") if int(e.detail.get("step", -1)) >= step
    )


def _checkpoint_started(rec: EventRecorder, trial: str, index: int) -> Event:
    return next(
        e
        for e in rec.events(trial, "managed", "checkpoint_start")
        if e.detail.get("index") == index
    )


def _held_step(log: Path, point: Checkpoint, regex: str) -> int:
    """The last step the workload had logged when CRIU froze it."""
    return last_step_before(log, point.held_log_bytes or 0, regex) or 0


def _first_new_step(log: Path, offset: int, regex: str) -> int | None:
    with open(log, "rb") as fh:
        fh.seek(offset)
        steps = steps_in(fh.read().decode("utf-8", "replace"), compile_progress(regex))
    return steps[0] if steps else None


# --- the local engine --------------------------------------------------------------------------


def _wait_gone(proc: WorkloadProcess, cluster: LocalCluster, timeout: float) -> int | None:
    """Monotonic ns when the process was first observed gone, polled every 2 ms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            seen = time.monotonic_ns()
            cluster.wait_gone(proc, timeout=5)
            return seen
        time.sleep(0.002)
    return None


def run_local_trial(setup: TrialSetup, fault: Fault, arm: str, repeat: int) -> dict[str, Any]:
    """One trial on the local engine; returns its row (failed with a reason, never raising)."""
    plan, rec, cluster = setup.plan, setup.recorder, setup.cluster
    assert isinstance(cluster, LocalCluster)
    slot = plan.cluster.nodes[0]  # both arms on the same node
    row = _base_row(setup, fault.kind, arm, repeat, slot)
    trial = row["trial_id"]
    regex = plan.workload.progress_probe.log_regex
    copy_dir = run_folder(setup.ctx) / f"{trial}-{arm}"
    copy_dir.mkdir(parents=True, exist_ok=True)
    argv = copy_argv(plan.workload.command or [], copy_dir)
    probe: LogProgressProbe | None = None
    periodic: PeriodicCheckpoints | None = None
    try:
        launched = rec.record(trial, arm, "launch", slot=slot)
        proc = cluster.start(slot, arm, argv, tag=trial)
        probe = LogProgressProbe(proc.log, regex, rec, trial, arm).start()
        criu = None
        if arm == "managed":
            criu = CriuCheckpointer(
                copy_dir / "criu", plan.checkpointer.keep, rec, trial, timeout_s=setup.timeout_s
            )
            periodic = PeriodicCheckpoints(criu, proc, plan.checkpointer.interval_s).start()
        _wait_for_step(probe, proc.alive, setup.fault_step, setup.timeout_s)
        if periodic:
            periodic.stop()  # no dump in flight when the fault lands
        fault_ev = inject_local_fault(cluster, proc, fault.kind, rec, trial)
        gone_ns = _wait_gone(proc, cluster, timeout=setup.fault_timeout_s)
        if gone_ns is None:
            raise TrialFailed(
                f"the workload survived {fault.kind}: pid {proc.pid} still running "
                f"{setup.fault_timeout_s:.0f} s after the fault"
            )
        detected = rec.record(trial, arm, "detected", pid=proc.pid)
        row["detect_latency_ms"] = (detected.t_mono_ns - gone_ns) / 1e6
        row["fault_outcome"] = "process gone"
        killed_at = proc.log.stat().st_size
        step_at_fault = last_step_before(proc.log, killed_at, regex)
        started = rec.record(trial, arm, "started", slot=slot)
        if criu is not None:
            point = criu.last_complete()
            if point is None:
                raise TrialFailed("no complete CRIU checkpoint before the fault")
            resume_step = _held_step(proc.log, point, regex)
            recoverable = _checkpoint_started(rec, trial, point.index)
            row.update(recoverable_point="checkpoint", checkpoint_bytes=point.image_bytes)
            criu.restore(cluster, slot, point)
            restored = rec.events(trial, arm, "restored")[-1]  # CRIU's restore returned
        else:
            app = plan.workload.app_checkpoint
            arm_ckpt = NoCheckpointer(
                rec, trial, _app_checkpoint(plan, copy_dir), app.resume_args if app else []
            )
            kind = arm_ckpt.recoverable_point().kind
            resume_step = _app_resume_step(plan, step_at_fault) if kind == "app_checkpoint" else 0
            recoverable = (
                _progress_event(rec, trial, arm, resume_step)
                if kind == "app_checkpoint"
                else launched
            )
            row["recoverable_point"] = kind
            new = arm_ckpt.restart(cluster, slot, argv, tag=trial)
            restored = rec.record(trial, arm, "restored", pid=new.pid)  # the fresh process
        moments = Moments(
            fault_ev, detected, started, restored, recoverable, step_at_fault, resume_step
        )
        _serve_and_measure(row, setup, probe, proc.log, killed_at, moments)
    except (TrialFailed, CriuError, CkptPocError) as exc:
        _fail(row, rec, exc, cluster.log_path(slot, arm, trial))
    finally:
        if periodic:
            periodic.stop()
        if probe:
            probe.stop()
        cluster.stop_all()
    return row


# --- Slurm -------------------------------------------------------------------------------------


def _job_spec(
    setup: TrialSetup, trial: str, arm: str, copy_dir: Path, log: Path, **mode: Any
) -> dict[str, Any]:
    plan = setup.plan
    return {
        "trial_id": trial,
        "arm": arm,
        "node": plan.cluster.nodes[0],
        "log": str(log),
        "events": str(copy_dir / "job-events.jsonl"),
        "ckpt_root": str(copy_dir / "criu"),
        "interval_s": plan.checkpointer.interval_s,
        "keep": plan.checkpointer.keep,
        "checkpoint": arm == "managed",
        **mode,
    }


def _wait_job_event(
    rec: EventRecorder,
    events: Path,
    trial: str,
    arm: str,
    names: tuple[str, ...],
    after: Event,
    timeout: float,
) -> Event | None:
    """The first of ``names`` after ``after`` that the job appends to its events file."""
    deadline = time.monotonic() + timeout
    while True:
        rec.import_jsonl(events)
        for event in rec.events(trial, arm):
            if event.event in names and span_s(after, event) >= 0:
                return event
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _time_limit_delivery(rec: EventRecorder, events: Path, lapsed: Event) -> Event:
    """`fault_injected` for a time limit: when Slurm's SIGTERM reached the job (its wrapper
    recorded it), else the lapse itself (a job killed without SIGTERM)."""
    rec.import_jsonl(events)
    landed = [
        e for e in rec.events(lapsed.trial_id, lapsed.arm, "signalled") if span_s(lapsed, e) >= 0
    ]
    return rec.alias(landed[0] if landed else lapsed, "fault_injected", fault="time-limit")


def run_slurm_trial(setup: TrialSetup, fault: Fault, arm: str, repeat: int) -> dict[str, Any]:
    """One trial on Slurm: the copy as a job, a real Slurm fault, a new linked job that
    restores (managed) or resubmits (unmanaged) it; failed with a reason, never raising."""
    plan, rec, cluster = setup.plan, setup.recorder, setup.cluster
    assert isinstance(cluster, SlurmCluster)
    node = plan.cluster.nodes[0]
    row = _base_row(setup, fault.kind, arm, repeat, node)
    trial = row["trial_id"]
    regex = plan.workload.progress_probe.log_regex
    copy_dir = run_folder(setup.ctx) / f"{trial}-{arm}"
    copy_dir.mkdir(parents=True, exist_ok=True)
    log = copy_dir / "workload.log"
    events = copy_dir / "job-events.jsonl"
    argv = copy_argv(plan.workload.command or [], copy_dir)
    gpus = plan.workload.gpus
    probe: LogProgressProbe | None = None
    try:
        launched = rec.record(trial, arm, "launch", node=node)
        spec = _job_spec(setup, trial, arm, copy_dir, log, mode="run", argv=argv)
        job = cluster.submit(node, arm, spec, name=trial, log=log, gpus=gpus)
        row["job_id"] = job.job_id
        running = cluster.wait_until(job, lambda s: s == "RUNNING", setup.timeout_s)
        if running is None:
            raise TrialFailed(f"job {job.job_id} never started within {setup.timeout_s:.0f} s")
        allocated = cluster.allocated_gpus(job)
        if gpus and allocated:
            row.update(gpus=allocated, gpus_from="allocation")
        probe = LogProgressProbe(log, regex, rec, trial, arm).start()
        if not probe.wait_for(lambda s: s.step >= setup.fault_step, setup.timeout_s):
            raise TrialFailed(f"the copy never reached step {setup.fault_step}")
        fault_ev = inject_slurm_fault(cluster, job, fault.kind, rec, trial)
        # Slurm checks time limits about every 30 s: that fault gets the longer wait.
        grace = setup.fault_timeout_s + (TIME_LIMIT_CHECK_S if fault.kind == "time-limit" else 0)
        ended = cluster.wait_until(job, lambda s: s != "RUNNING", grace)
        if ended is None:
            raise TrialFailed(
                f"the workload survived {fault.kind}: job {job.job_id} still RUNNING "
                f"{grace:.0f} s after the fault"
            )
        detected = rec.record(trial, arm, "detected", job_id=job.job_id, state=ended.state)
        if fault.kind == "time-limit":
            fault_ev = _time_limit_delivery(rec, events, fault_ev)
        # The state changed somewhere between the two polls: that window bounds how late
        # the detection was observed.
        row["detect_latency_ms"] = (ended.t_mono_ns - ended.previous_poll_ns) / 1e6
        if fault.kind == "node-down" and fault.down_s is not None:
            time.sleep(fault.down_s)  # the node is away this long (a reboot, a repair)
            cluster.node_resume(node)
            rec.record(trial, arm, "node_returned", node=node, down_s=fault.down_s)
        # The old allocation must be released (its processes gone) before anything reads
        # what the copy logged or restarts it.
        released = cluster.wait_until(job, lambda s: s not in ACTIVE_STATES, setup.timeout_s)
        if released is None:
            raise TrialFailed(f"job {job.job_id} was not released within {setup.timeout_s} s")
        rec.import_jsonl(events)
        killed_at = log.stat().st_size
        step_at_fault = last_step_before(log, killed_at, regex)
        if arm == "managed":
            point = CriuCheckpointer.last_complete_under(copy_dir / "criu")
            if point is None:
                raise TrialFailed("no complete CRIU checkpoint before the fault")
            resume_step = _held_step(log, point, regex)
            recoverable = _checkpoint_started(rec, trial, point.index)
            row.update(recoverable_point="checkpoint", checkpoint_bytes=point.image_bytes)
            spec = _job_spec(
                setup, trial, arm, copy_dir, log, mode="restore", restore_from=str(point.path)
            )
        else:
            app = plan.workload.app_checkpoint
            app_path = _app_checkpoint(plan, copy_dir)
            kind = "app_checkpoint" if app_path and app_path.exists() else "start"
            resume_step = _app_resume_step(plan, step_at_fault) if kind == "app_checkpoint" else 0
            recoverable = (
                _progress_event(rec, trial, arm, resume_step)
                if kind == "app_checkpoint"
                else launched
            )
            row["recoverable_point"] = kind
            resume = [*argv, *(app.resume_args if app and kind == "app_checkpoint" else [])]
            spec = _job_spec(setup, trial, arm, copy_dir, log, mode="run", argv=resume)
        new_job = cluster.submit(
            node, arm, spec, name=trial, log=log, gpus=gpus, linked_to=job.job_id
        )
        row["recovery_job_id"] = new_job.job_id
        rec.record(trial, arm, "recovery_submitted", job_id=new_job.job_id, recovers=job.job_id)
        now_running = cluster.wait_until(new_job, lambda s: s == "RUNNING", setup.timeout_s)
        if now_running is None:
            state, reason = cluster.observe(new_job)
            raise TrialFailed(
                f"recovery job {new_job.job_id} never started within {setup.timeout_s:.0f} s "
                f"(state {state}, reason {reason or 'none'})"
                + (" — the node never came back" if fault.kind == "node-down" else "")
            )
        # `started` is the job's own first moment on the node (its wrapper records it): the
        # squeue poll that saw it RUNNING may come after the restore has begun.
        job_started = _wait_job_event(
            rec, events, trial, arm, ("job_started",), fault_ev, setup.timeout_s
        )
        if job_started is None:
            raise TrialFailed(f"recovery job {new_job.job_id} ran but never reported starting")
        started = rec.alias(job_started, "started", job_id=new_job.job_id)
        names = ("restored", "restore_failed") if arm == "managed" else ("workload_started",)
        restored = _wait_job_event(rec, events, trial, arm, names, fault_ev, setup.timeout_s)
        if restored is None or restored.event == "restore_failed":
            tail = restored.detail.get("log_tail", "") if restored else ""
            raise TrialFailed(
                f"recovery job {new_job.job_id} did not bring the copy back: "
                + (tail.strip().splitlines()[-1] if tail.strip() else "no restore event")
            )
        if restored.event == "workload_started":  # the unmanaged copy's fresh process
            restored = rec.alias(restored, "restored", job_id=new_job.job_id)
        moments = Moments(
            fault_ev, detected, started, restored, recoverable, step_at_fault, resume_step
        )
        _serve_and_measure(row, setup, probe, log, killed_at, moments)
    except (TrialFailed, CriuError, SlurmError, CkptPocError) as exc:
        _fail(row, rec, exc, log)
    finally:
        if probe:
            probe.stop()
        if row.get("job_id") and not row.get("fault_outcome"):
            # What accounting says ended the interrupted job (sacct lags: read it last).
            with contextlib.suppress(SlurmError):
                row["fault_outcome"] = cluster.final_state(cluster.tracked[row["job_id"]])
        left = cluster.stop_all()
        rec.import_jsonl(events)
        if left:
            rec.record(trial, arm, "left_running", job_ids=left)
    return row


# --- both ---------------------------------------------------------------------------------------

TRIAL_RUNNERS: dict[str, Callable[[TrialSetup, Fault, str, int], dict[str, Any]]] = {
    "local": run_local_trial,
    "slurm": run_slurm_trial,
}


def ensure_recovery_supports(plan: Plan) -> None:
    if plan.cluster.kind not in TRIAL_RUNNERS or plan.checkpointer.kind != "criu":
        raise CkptPocError(
            f"recovery runs on cluster.kind 'local' or 'slurm' with checkpointer 'criu' here; "
            f"this plan has {plan.cluster.kind!r} with {plan.checkpointer.kind!r}"
        )
    require_command_and_progress(plan, "recovery")


def make_cluster(plan: Plan, ctx: RunContext) -> LocalCluster | SlurmCluster:
    if plan.cluster.kind == "slurm":
        return SlurmCluster(
            list(plan.cluster.nodes), plan.cluster.queue, run_folder(ctx), Path.cwd()
        )
    return LocalCluster(
        list(plan.cluster.nodes), run_folder(ctx), Path.cwd(), workload=plan.workload.name
    )


@dataclass
class RecoveryRun:
    trials: pd.DataFrame  # one row per trial, in the `trials` schema
    events: list[Event]  # every event of the run (already written to `events`)
    run_dir: Path
    failures: list[dict[str, Any]]  # trial_id, arm, reason, log_tail of each failed trial
    stopped: str | None = None  # why the run stopped before its last trial


def stop_reason(rows: list[dict[str, Any]], fault: str) -> str | None:
    """Why to stop the run: the first trials of ``fault`` (one per arm) all failed for the
    same reason before any fault was injected — every further trial would fail the same way."""
    first = [r for r in rows if r["fault"] == fault][: len(ARMS_IN_ORDER)]
    if len(first) < len(ARMS_IN_ORDER):
        return None
    if any(r.get("status") != "failed" or r.get(FAULT_DELIVERED) for r in first):
        return None
    reasons = {r["reason"] for r in first}
    if len(reasons) != 1:
        return None
    tail = first[-1].get(LOG_TAIL) or "(the log is empty)"
    return (
        f"stopped after {len(rows)} trial(s): the first trials of {fault!r} on both arms "
        f"failed before any fault was injected, for the same reason: {reasons.pop()}. "
        f"Last lines of the workload's log:\n{tail}"
    )


def preflight(setup: TrialSetup, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> PreflightResult:
    """Start the workload once on the plan's first node and see it work (tasks/preflight)."""
    cluster = setup.cluster
    if isinstance(cluster, LocalCluster):
        return preflight_local(setup.plan, setup.ctx, cluster, timeout_s)
    plan, node = setup.plan, setup.plan.cluster.nodes[0]
    copy_dir = run_folder(setup.ctx) / "preflight"
    copy_dir.mkdir(parents=True, exist_ok=True)
    log = copy_dir / "workload.log"
    argv = copy_argv(plan.workload.command or [], copy_dir)
    spec = _job_spec(setup, "preflight", "unmanaged", copy_dir, log, mode="run", argv=argv)
    job = cluster.submit(
        node, "preflight", spec, name="preflight", log=log, gpus=plan.workload.gpus
    )
    try:
        return await_first_sign(
            plan,
            log,
            lambda: cluster.observe(job)[0] in ACTIVE_STATES,
            # A Slurm copy may wait in the queue first: the trial timeout covers that.
            max(timeout_s, setup.timeout_s),
            f"job {job.job_id}: {' '.join(argv)}",
            slice_s=0.5,
        )
    finally:
        cluster.stop_all()


def run_recovery(
    plan: Plan,
    ctx: RunContext,
    *,
    fault_step: int | None = None,
    timeout_s: float = 120,
    fault_timeout_s: float = 10,
    cluster: LocalCluster | SlurmCluster | None = None,
) -> RecoveryRun:
    """Every (fault, repeat, arm) trial of the plan, unmanaged first; one row each."""
    ensure_recovery_supports(plan)
    every = plan.workload.app_checkpoint.every_steps if plan.workload.app_checkpoint else 50
    setup = TrialSetup(
        plan,
        ctx,
        cluster or make_cluster(plan, ctx),
        EventRecorder(ctx),
        fault_step or int(every * 2.6),
        timeout_s,
        fault_timeout_s,
    )
    runner = TRIAL_RUNNERS[plan.cluster.kind]
    clean_dead_roots(run_folder(ctx).parent)  # checkpoint folders killed runs left
    rows: list[dict[str, Any]] = []
    stopped = None
    try:
        preflight(setup)
        for fault in plan.faults:
            for repeat in range(plan.repeats):
                for arm in ARMS_IN_ORDER:
                    rows.append(runner(setup, fault, arm, repeat))
                stopped = stop_reason(rows, fault.kind)
                if stopped:
                    break
            if stopped:
                break
    finally:
        setup.cluster.stop_all()
        if isinstance(setup.cluster, LocalCluster):
            setup.cluster.close()  # its reaper: nothing left to end
        setup.recorder.flush()
    return RecoveryRun(
        as_trials([pd.DataFrame(rows)], ctx),
        setup.recorder.events(),
        run_folder(ctx),
        failures_of(rows),
        stopped,
    )


def write_and_gate(run: RecoveryRun, plan: Plan, ctx: RunContext) -> list[Path]:
    """Write every trial and its checkpoints' rows, then gate the recovery trials."""
    dumps = checkpoint_rows(run.events, plan, plan.cluster.nodes[0])
    trials = as_trials([run.trials, dumps], ctx)
    if run.stopped:
        experiments.write_trials(trials, ctx)  # the run is recorded, then refused
        ctx.commit("refused: stopped early, " + run.stopped.splitlines()[0][:300])
        raise RecoveryStopped(run.stopped)
    return experiments.write_and_gate(
        trials,
        ctx,
        GATE,
        recovery_gate_checks(run.trials, plan, run.events),
    )


def _stats(values: pd.Series) -> dict[str, float | None]:
    v = values.dropna().astype(float)
    if v.empty:
        return {"n": 0, "median": None, "p90": None, "min": None, "max": None}
    return {
        "n": len(v),
        "median": float(v.median()),
        "p90": float(np.percentile(v, 90)),
        "min": float(v.min()),
        "max": float(v.max()),
    }


def _statistic(values: pd.Series, name: str) -> float | None:
    v = values.dropna().astype(float)
    if v.empty:
        return None
    return float(
        {
            "median": v.median(),
            "mean": v.mean(),
            "min": v.min(),
            "max": v.max(),
            "p90": np.percentile(v, 90),
        }[name]
    )


def summarise_recovery(trials: pd.DataFrame, plan: Plan) -> list[dict[str, Any]]:
    """Per fault × arm: n, median, p90, min, max of recovery time and work lost; the
    managed/unmanaged ratio of medians; the plan's thresholds with a verdict (managed)."""
    ok = trials[trials["status"] == "ok"]
    out = []
    crit_rt, crit_wl = plan.success.recovery_time_s, plan.success.work_lost_gpu_h
    for fault in sorted(trials["fault"].unique()):
        medians = {}
        for arm in ARMS_IN_ORDER:
            rows = ok[(ok["fault"] == fault) & (ok["arm"] == arm)]
            entry = {
                "fault": fault,
                "arm": arm,
                "failed": int(
                    (
                        (trials["fault"] == fault)
                        & (trials["arm"] == arm)
                        & (trials["status"] == "failed")
                    ).sum()
                ),
                "recovery_s": _stats(rows["recovery_s"]),
                "work_lost_gpu_h": _stats(rows["work_lost_gpu_h"]),
                "steps_lost": _stats(rows["steps_lost"]),
                # How late the harness saw `detected` and `serving_again` (DESIGN §4).
                "detect_latency_ms": _stats(rows["detect_latency_ms"]),
                "serving_latency_ms": _stats(rows["serving_latency_ms"]),
            }
            medians[arm] = entry["recovery_s"]["median"]
            if arm == "managed":
                rt = _statistic(rows["recovery_s"], crit_rt.statistic)
                wl = _statistic(rows["work_lost_gpu_h"], crit_wl.statistic)
                entry["recovery_time_verdict"] = _verdict(rt, crit_rt.threshold, crit_rt.statistic)
                entry["work_lost_verdict"] = _verdict(wl, crit_wl.threshold, crit_wl.statistic)
            out.append(entry)
        ratio = (
            medians["managed"] / medians["unmanaged"]
            if medians["managed"] is not None and medians["unmanaged"]
            else None
        )
        for entry in out[-2:]:
            entry["managed_over_unmanaged_recovery"] = ratio
    return out


def _verdict(value: float | None, threshold: float, statistic: str) -> dict[str, Any]:
    verdict = "undecided" if value is None else "met" if value <= threshold else "not met"
    return {"value": value, "threshold": threshold, "statistic": statistic, "verdict": verdict}


def recovery_gate_checks(
    trials: pd.DataFrame, plan: Plan, events: list[Event]
) -> list[CheckResult]:
    """The comparability rules for recovery (DESIGN §5): both arms and enough repeats per
    fault, one clock, arms that differ only in being managed, real faults and measured
    recoveries behind every counted trial."""
    checks = []
    ok = trials[trials["status"] == "ok"]
    for fault in plan.faults:
        for arm in ARMS_IN_ORDER:
            n = int(((ok["fault"] == fault.kind) & (ok["arm"] == arm)).sum())
            checks.append(
                plain_check(
                    GATE,
                    "trials",
                    f"repeats[{fault.kind},{arm}]",
                    n >= plan.repeats,
                    ok_trials=n,
                    required=plan.repeats,
                )
            )
    clocks = sorted(map(str, trials["clock"].unique()))
    checks.append(
        plain_check(GATE, "trials", "same_clock_both_arms", len(clocks) == 1, clocks=clocks)
    )
    checks += arms_differ_only_in_managed(GATE, trials)
    seen = {(e.trial_id, e.arm, e.event) for e in events}
    unbacked = [
        f"{t}/{a}"
        for t, a in zip(ok["trial_id"], ok["arm"], strict=True)
        if (t, a, "fault_injected") not in seen or (t, a, "serving_again") not in seen
    ]
    measured = ok["recovery_s"].notna() & ok["detection_s"].notna()
    checks.append(
        plain_check(
            GATE,
            "trials",
            "real_fault_and_measured_serving_again",
            not unbacked and bool(measured.all()),
            ok_trials=len(ok),
            without_events=unbacked,
            without_numbers=int((~measured).sum()),
        )
    )
    return checks
