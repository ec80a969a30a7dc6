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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tasks.data.arms import (
    ARMS,  # in order: the unmanaged copy is faulted first
    MANAGED,
    UNMANAGED,
)
from tasks.data.errors import CkptPocError
from tasks.data.events import Ev
from tasks.data.gates import CheckResult, plain_check
from tasks.data.plan import Fault, Plan, grace_of
from tasks.data.row_types import RecoveryRow
from tasks.data.runctx import RunContext
from tasks.engine.checkpointers.base import ensure_runs_on
from tasks.engine.checkpointers.criu import clean_dead_roots
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.clusters.base import Cluster
from tasks.engine.clusters.copies import CopyNeverStarted
from tasks.engine.clusters.registry import BUILT_KINDS, cluster_for
from tasks.engine.paths import images_roots, run_folder
from tasks.engine.preflight import PREFLIGHT_TIMEOUT_S, PreflightResult
from tasks.experiments import trials as experiments
from tasks.experiments.checkpoints import checkpoint_rows
from tasks.experiments.clocks import same_clock_check
from tasks.experiments.deadline import run_deadline_sweep
from tasks.experiments.recovery_trial import (
    FAULT_DELIVERED,
    TrialFailed,
    TrialSetup,
    base_row,
    fail_trial,
    run_trial,
)
from tasks.experiments.results import (
    RECOVERY_STATS,
    Failure,
    RecoveryArm,
    RecoveryResult,
    Stats,
    Verdict,
)
from tasks.experiments.trials import (
    LOG_TAIL,
    arms_differ_only_in_managed,
    as_trials,
    failures_of,
    require_command_and_progress,
)

GATE = "recovery"


class RecoveryStopped(CkptPocError):
    """The run stopped early: its first trials all failed the same way before any fault."""

    refuses_run = True

    def refusal(self) -> str:
        return "refused: stopped early, " + str(self).splitlines()[0][:300]


# --- both ---------------------------------------------------------------------------------------


def ensure_recovery_supports(plan: Plan) -> None:
    ensure_runs_on(plan, "recovery runs on", BUILT_KINDS)
    require_command_and_progress(plan, "recovery")


def make_cluster(plan: Plan, ctx: RunContext) -> Cluster:
    return cluster_for(plan, run_folder(ctx), Path.cwd())


@dataclass
class RecoveryRun:
    trials: pd.DataFrame  # one row per trial, in the `trials` schema
    events: list[Event]  # every event of the run (already written to `events`)
    run_dir: Path
    failures: list[dict[str, Any]]  # trial_id, arm, reason, log_tail of each failed trial
    stopped: str | None = None  # why the run stopped before its last trial


def stop_reason(rows: list[RecoveryRow], fault: str) -> str | None:
    """Why to stop the run: the first trials of ``fault`` (one per arm) all failed for the
    same reason before any fault was injected — every further trial would fail the same way."""
    first = [r for r in rows if r["fault"] == fault][: len(ARMS)]
    if len(first) < len(ARMS):
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
    """Start the workload once on the plan's first node and see it work (tasks/engine/preflight)."""
    # A Slurm copy may wait in the queue first: the trial timeout covers that.
    return setup.cluster.preflight(setup.ctx, timeout_s, queue_timeout_s=setup.timeout_s)


def run_one_trial(setup: TrialSetup, fault: Fault, arm: str, repeat: int) -> RecoveryRow:
    """The trial's row; a trial that raises all the same (a defect, not a result) gives
    a failed row with the error, and the other trials still run."""
    try:
        return run_trial(setup, fault, arm, repeat)
    except CopyNeverStarted:
        raise  # the stage ends with the scheduler's reason: no trial could run
    except Exception as exc:  # one trial's defect must not end the stage
        node = setup.plan.cluster.nodes[0]
        includes = setup.cluster.recovery_steps(fault).includes
        row = base_row(setup, fault.kind, arm, repeat, node, includes)
        log = run_folder(setup.ctx) / f"{row['trial_id']}-{arm}" / "workload.log"
        error = TrialFailed(f"the trial runner failed: {type(exc).__name__}: {exc}")
        fail_trial(row, setup.recorder, error, log)
        setup.cluster.stop_all()
        return row


def needs_deadline_sweep(plan: Plan) -> bool:
    """A local plan with a notice fault: what its grace period holds is measured here."""
    return plan.cluster.kind == "local" and any(grace_of(f) is not None for f in plan.faults)


def run_recovery(
    plan: Plan,
    ctx: RunContext,
    *,
    fault_step: int | None = None,
    timeout_s: float = 120,
    fault_timeout_s: float = 10,
    cluster: Cluster | None = None,
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
    clean_dead_roots(*images_roots(plan, ctx))  # checkpoint folders killed runs left
    rows: list[RecoveryRow] = []
    stopped = None
    try:
        preflight(setup)
        for fault in plan.faults:
            for repeat in range(plan.repeats):
                for arm in ARMS:
                    rows.append(run_one_trial(setup, fault, arm, repeat))
                stopped = stop_reason(rows, fault.kind)
                if stopped:
                    break
            if stopped:
                break
        if not stopped and needs_deadline_sweep(plan):
            run_deadline_sweep(plan, run_folder(ctx), setup.cluster, setup.recorder)
    finally:
        setup.cluster.stop_all()
        setup.cluster.close()  # a local cluster's reaper: nothing left to end
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
        experiments.write_trials(trials, ctx)  # the run is recorded, then refused (open_run)
        raise RecoveryStopped(run.stopped)
    return experiments.write_and_gate(
        trials,
        ctx,
        GATE,
        recovery_gate_checks(run.trials, plan, run.events),
    )


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


def summarise_recovery(trials: pd.DataFrame, plan: Plan) -> tuple[RecoveryArm, ...]:
    """Per fault × arm: n, median, p90, min, max of recovery time and work lost; the
    managed/unmanaged ratio of medians; the plan's thresholds with a verdict (managed)."""
    ok = trials[trials["status"] == "ok"]
    out: list[RecoveryArm] = []
    crit_rt, crit_wl = plan.success.recovery_time_s, plan.success.work_lost_gpu_h
    for fault in sorted(trials["fault"].unique()):
        arms: dict[str, dict[str, Any]] = {}
        for arm in ARMS:
            rows = ok[(ok["fault"] == fault) & (ok["arm"] == arm)]
            failed = (trials["fault"] == fault) & (trials["arm"] == arm)
            entry: dict[str, Any] = {
                "fault": fault,
                "arm": arm,
                "failed": int((failed & (trials["status"] == "failed")).sum()),
                **{m: Stats.of(rows[m]) for m in RECOVERY_STATS},
            }
            if arm == MANAGED:
                rt = _statistic(rows["recovery_s"], crit_rt.statistic)
                wl = _statistic(rows["work_lost_gpu_h"], crit_wl.statistic)
                entry["recovery_time_verdict"] = Verdict.judge(
                    rt, crit_rt.threshold, crit_rt.statistic
                )
                entry["work_lost_verdict"] = Verdict.judge(wl, crit_wl.threshold, crit_wl.statistic)
            arms[arm] = entry
        managed, unmanaged = (arms[a]["recovery_s"].median for a in (MANAGED, UNMANAGED))
        ratio = managed / unmanaged if managed is not None and unmanaged else None
        out += [RecoveryArm(**e, managed_over_unmanaged_recovery=ratio) for e in arms.values()]
    return tuple(out)


def recovery_result(
    run: RecoveryRun, plan: Plan, ctx: RunContext, files: list[Path]
) -> RecoveryResult:
    """The run as the stage hands it on: counted, summarised, with its failures and files."""
    trials = run.trials
    return RecoveryResult(
        poc=ctx.poc,
        run_id=ctx.run_id,
        cluster=plan.cluster.kind,
        trials=len(trials),
        failed=int((trials["status"] == "failed").sum()),
        failures=tuple(Failure.from_json(f) for f in run.failures),
        includes=tuple(sorted(trials["includes"].dropna().unique())),
        summary=summarise_recovery(trials, plan),
        trials_files=tuple(str(f) for f in files),
        run_dir=str(run.run_dir),
    )


def recovery_gate_checks(
    trials: pd.DataFrame, plan: Plan, events: list[Event]
) -> list[CheckResult]:
    """The comparability rules for recovery (docs/design.md §5): both arms and enough repeats per
    fault, one clock, arms that differ only in being managed, real faults and measured
    recoveries behind every counted trial."""
    checks = []
    ok = trials[trials["status"] == "ok"]
    for fault in plan.faults:
        for arm in ARMS:
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
    checks.append(same_clock_check(GATE, "recovery", trials))
    checks += arms_differ_only_in_managed(GATE, trials)
    seen = {(e.trial_id, e.arm, e.event) for e in events}
    unbacked = [
        f"{t}/{a}"
        for t, a in zip(ok["trial_id"], ok["arm"], strict=True)
        if (t, a, Ev.FAULT_INJECTED) not in seen or (t, a, Ev.SERVING_AGAIN) not in seen
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
