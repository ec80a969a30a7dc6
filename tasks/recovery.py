"""Failure injection and recovery on the local engine: every trial a row, both arms.

For each fault in the plan and each repeat, the unmanaged copy first, then the managed copy,
runs on the same slot until the same step, gets the same real fault, and is brought back:
the unmanaged one restarted from its own checkpoint (or the start), the managed one
restored from its last complete CRIU checkpoint. One clock (fault_injected → serving_again)
and the same components on both arms:

    detection   fault_injected → detected        (the process is observed gone)
    scheduling  detected → started               (the slot is held again; ~0 locally)
    restore     started → restored               (CRIU restore, or a fresh start)
    warm-up     restored → serving_again         (the first new progress line)
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tasks.checkpointers.criu import CriuCheckpointer, CriuError, PeriodicCheckpoints
from tasks.checkpointers.none import NoCheckpointer
from tasks.clock import Event, EventRecorder, span_s
from tasks.clusters.local import LocalCluster, WorkloadProcess
from tasks.datasets import TRIALS
from tasks.engine import copy_argv, ensure_engine_supports, run_folder
from tasks.errors import CkptPocError
from tasks.faults import inject_local_fault
from tasks.plan import Plan
from tasks.probes import LogProgressProbe, compile_progress, last_step_before, steps_in
from tasks.runctx import RunContext

CLOCK = "fault_injected→serving_again"
INCLUDES = "detection+scheduling+restore+warmup (local: scheduling is holding the slot again)"
ARMS_IN_ORDER = ("unmanaged", "managed")  # the unmanaged copy is faulted first


class TrialFailed(CkptPocError):
    """A trial that cannot give a number; its row says why."""


def workload_hash(plan: Plan) -> str:
    return hashlib.sha256(plan.workload.model_dump_json().encode()).hexdigest()[:16]


@dataclass
class TrialSetup:
    plan: Plan
    ctx: RunContext
    cluster: LocalCluster
    recorder: EventRecorder
    fault_step: int
    timeout_s: float


def _wait_gone(proc: WorkloadProcess, cluster: LocalCluster, timeout: float) -> float | None:
    """Monotonic ns when the process was first observed gone, polled every 2 ms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            seen = time.monotonic_ns()
            cluster.wait_gone(proc, timeout=5)
            return seen
        time.sleep(0.002)
    return None


def run_trial(setup: TrialSetup, fault: str, arm: str, repeat: int) -> dict[str, Any]:
    """One trial; returns its row (status 'failed' with a reason rather than raising)."""
    plan, rec, cluster = setup.plan, setup.recorder, setup.cluster
    trial = f"{fault}-{repeat}"
    slot = plan.cluster.nodes[0]  # both arms on the same node
    copy_dir = run_folder(setup.ctx) / f"{trial}-{arm}"
    copy_dir.mkdir(parents=True, exist_ok=True)
    argv = copy_argv(plan.workload.command or [], copy_dir)
    app = plan.workload.app_checkpoint
    row: dict[str, Any] = {
        "measure": "recovery",
        "trial_id": trial,
        "arm": arm,
        "fault": fault,
        "repeat": repeat,
        "started_at": dt.datetime.now(dt.UTC),
        "clock": CLOCK,
        "includes": INCLUDES,
        "gpus": plan.workload.gpus,
        "gpus_from": "plan",
        "nodes": slot,
        "workload_hash": workload_hash(plan),
    }
    probe: LogProgressProbe | None = None
    periodic: PeriodicCheckpoints | None = None
    try:
        launched = rec.record(trial, arm, "launch", slot=slot)
        proc = cluster.start(slot, arm, argv, tag=trial)
        probe = LogProgressProbe(
            proc.log, plan.workload.progress_probe.log_regex, rec, trial, arm
        ).start()
        criu = None
        if arm == "managed":
            criu = CriuCheckpointer(copy_dir / "criu", plan.checkpointer.keep, rec, trial)
            periodic = PeriodicCheckpoints(criu, proc, plan.checkpointer.interval_s).start()
        if not probe.wait_for(lambda s: s.step >= setup.fault_step, setup.timeout_s):
            raise TrialFailed(f"the copy never reached step {setup.fault_step}")
        if periodic:
            periodic.stop()  # no dump in flight when the fault lands
        fault_ev = inject_local_fault(cluster, proc, fault, rec, trial)
        gone_ns = _wait_gone(proc, cluster, timeout=10)
        if gone_ns is None:
            raise TrialFailed(f"the workload survived {fault}")
        detected = rec.record(trial, arm, "detected", pid=proc.pid)
        row["detect_latency_ms"] = (detected.t_mono_ns - gone_ns) / 1e6
        killed_at = proc.log.stat().st_size
        step_at_fault = last_step_before(
            proc.log, killed_at, plan.workload.progress_probe.log_regex
        )
        started = rec.record(trial, arm, "started", slot=slot)
        if criu is not None:
            point = criu.last_complete()
            if point is None:
                raise TrialFailed("no complete CRIU checkpoint before the fault")
            resume_step = (
                last_step_before(
                    proc.log, point.held_log_bytes or 0, plan.workload.progress_probe.log_regex
                )
                or 0
            )
            recoverable_ns = _checkpoint_time(rec, trial, point.index).t_mono_ns
            row.update(recoverable_point="checkpoint", checkpoint_bytes=point.image_bytes)
            new = criu.restore(cluster, slot, point)
        else:
            arm_ckpt = NoCheckpointer(
                rec,
                trial,
                Path(app.path.replace("{copy_dir}", str(copy_dir))) if app and app.path else None,
                app.resume_args if app else [],
            )
            kind = arm_ckpt.recoverable_point().kind
            resume_step = (
                (step_at_fault or 0) // app.every_steps * app.every_steps
                if kind == "app_checkpoint" and app
                else 0
            )
            recoverable_ns = (
                _first_seen_ns(probe, resume_step)
                if kind == "app_checkpoint"
                else launched.t_mono_ns
            )
            row["recoverable_point"] = kind
            new = arm_ckpt.restart(cluster, slot, argv, tag=trial)
        restored = rec.record(trial, arm, "restored", pid=new.pid)
        seen = probe.wait_for(lambda s: s.offset > killed_at, setup.timeout_s)
        if seen is None:
            raise TrialFailed("no new progress after recovery")
        serving = rec.record(trial, arm, "serving_again", step=seen.step)
        row["serving_latency_ms"] = (serving.t_mono_ns - seen.t_mono_ns) / 1e6
        first_new = _first_new_step(proc.log, killed_at, plan.workload.progress_probe.log_regex)
        if first_new != resume_step + 1:
            raise TrialFailed(
                f"resumed at step {first_new}, its recoverable point held {resume_step}"
            )
        lost_s = (fault_ev.t_mono_ns - recoverable_ns) / 1e9
        row.update(
            status="ok",
            recovery_s=span_s(fault_ev, serving),
            detection_s=span_s(fault_ev, detected),
            scheduling_s=span_s(detected, started),
            restore_s=span_s(started, restored),
            warmup_s=span_s(restored, serving),
            work_lost_s=lost_s,
            work_lost_gpu_h=lost_s * plan.workload.gpus / 3600,
            steps_lost=(step_at_fault or 0) - resume_step,
        )
    except (TrialFailed, CriuError, CkptPocError) as exc:
        row.update(status="failed", reason=str(exc).splitlines()[0][:500])
        rec.record(trial, arm, "trial_failed", reason=row["reason"])
    finally:
        if periodic:
            periodic.stop()
        if probe:
            probe.stop()
        cluster.stop_all()
    return row


def _checkpoint_time(rec: EventRecorder, trial: str, index: int) -> Event:
    return next(
        e
        for e in rec.events(trial, "managed", "checkpoint_start")
        if e.detail.get("index") == index
    )


def _first_seen_ns(probe: LogProgressProbe, step: int) -> int:
    """When the probe first saw ``step`` (the app checkpoint is written right after it)."""
    return next(s.t_mono_ns for s in probe.seen if s.step >= step)


def _first_new_step(log: Path, offset: int, regex: str) -> int | None:
    with open(log, "rb") as fh:
        fh.seek(offset)
        steps = steps_in(fh.read().decode("utf-8", "replace"), compile_progress(regex))
    return steps[0] if steps else None


def run_recovery(
    plan: Plan, ctx: RunContext, *, fault_step: int | None = None, timeout_s: float = 120
) -> pd.DataFrame:
    """Every (fault, repeat, arm) trial of the plan, unmanaged first; one row each."""
    ensure_engine_supports(plan)
    if plan.workload.progress_probe is None or plan.workload.progress_probe.log_regex is None:
        raise CkptPocError("recovery on the local engine needs workload.progress_probe.log_regex")
    every = plan.workload.app_checkpoint.every_steps if plan.workload.app_checkpoint else 50
    setup = TrialSetup(
        plan,
        ctx,
        LocalCluster(list(plan.cluster.nodes), run_folder(ctx), Path.cwd()),
        EventRecorder(ctx),
        fault_step or int(every * 2.6),
        timeout_s,
    )
    rows = []
    try:
        for fault in plan.faults:
            for repeat in range(plan.repeats):
                for arm in ARMS_IN_ORDER:
                    rows.append(run_trial(setup, fault.kind, arm, repeat))
    finally:
        setup.cluster.stop_all()
        setup.recorder.flush()
    frame = pd.DataFrame(rows)
    for name, value in ctx.stamp().items():
        frame[name] = value
    return frame.reindex(columns=TRIALS.column_names)


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
            }
            medians[arm] = entry["recovery_s"]["median"]
            if arm == "managed":
                rt = _statistic(rows["recovery_s"], crit_rt.statistic)
                wl = _statistic(rows["work_lost_gpu_h"], crit_wl.statistic)
                entry["recovery_time_verdict"] = _verdict(rt, crit_rt.threshold)
                entry["work_lost_verdict"] = _verdict(wl, crit_wl.threshold)
            out.append(entry)
        ratio = (
            medians["managed"] / medians["unmanaged"]
            if medians["managed"] is not None and medians["unmanaged"]
            else None
        )
        for entry in out[-2:]:
            entry["managed_over_unmanaged_recovery"] = ratio
    return out


def _verdict(value: float | None, threshold: float) -> dict[str, Any]:
    if value is None:
        return {"value": None, "threshold": threshold, "verdict": "undecided"}
    return {
        "value": value,
        "threshold": threshold,
        "verdict": "met" if value <= threshold else "not met",
    }


def recovery_gate_checks(trials: pd.DataFrame, plan: Plan) -> list[dict[str, Any]]:
    """The comparability rules for recovery, as (name, success, observed) records."""
    checks = []
    ok = trials[trials["status"] == "ok"]
    for fault in plan.faults:
        for arm in ARMS_IN_ORDER:
            n = int(((ok["fault"] == fault.kind) & (ok["arm"] == arm)).sum())
            checks.append(
                {
                    "name": f"repeats[{fault.kind},{arm}]",
                    "success": n >= plan.repeats,
                    "observed": {"ok_trials": n, "required": plan.repeats},
                }
            )
    checks.append(
        {
            "name": "same_clock_both_arms",
            "success": trials["clock"].nunique() == 1,
            "observed": {"clocks": sorted(trials["clock"].unique())},
        }
    )
    for column in (
        "nodes",
        "workload_hash",
        "fp_host",
        "fp_cpu_model",
        "fp_kernel",
        "fp_gpu_model",
        "fp_driver",
        "fp_cuda",
        "fp_versions",
    ):
        distinct = sorted(map(str, trials[column].unique()))
        checks.append(
            {
                "name": f"arms_differ_only_in_managed[{column}]",
                "success": len(distinct) == 1,
                "observed": {"values": distinct},
            }
        )
    real = ok["recovery_s"].notna() & ok["detection_s"].notna()
    checks.append(
        {
            "name": "real_fault_and_measured_serving_again",
            "success": bool(real.all()),
            "observed": {"ok_trials": len(ok), "measured": int(real.sum())},
        }
    )
    return checks
