"""Failure injection and recovery: real faults on both arms, every trial a row, gated."""

from __future__ import annotations

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import (
    experiment_holding_nodes,
    failure_reported_as,
    log_failures,
    run_name,
)
from flows.plan_check import ensure_plan_is_valid
from tasks.data.plan import Plan
from tasks.data.runctx import open_run
from tasks.experiments.recovery import recovery_result, run_recovery, write_and_gate
from tasks.experiments.report import recovery_markdown, recovery_rows
from tasks.experiments.results import RecoveryResult


@task(name="inject_faults_and_recover", cache_policy=NO_CACHE)
def inject_faults_and_recover(
    plan: Plan, plan_path: str, timeout_s: float, fault_step: int | None, wait_for_nodes: bool
) -> RecoveryResult:
    with open_run(plan, plan_path, "recovery") as ctx:
        with experiment_holding_nodes(plan, ctx, wait_for_nodes):
            run = run_recovery(plan, ctx, fault_step=fault_step, timeout_s=timeout_s)
        log_failures(run.failures, "trial")
        files = write_and_gate(run, plan, ctx)
    return recovery_result(run, plan, ctx, files)


@flow(name="recovery", flow_run_name=run_name("recovery"))
def recovery(
    plan_path: str,
    timeout_s: float = 120,
    fault_step: int | None = None,
    wait_for_nodes: bool = True,
) -> RecoveryResult:
    """Each of the plan's faults, `repeats` times, on the unmanaged then the managed copy:
    recovery time and work lost per trial in `trials`, gated, then summarised per fault.
    Returns the result (tasks/experiments/results.py: RecoveryResult)."""
    plan = ensure_plan_is_valid(plan_path)
    with failure_reported_as("recovery-report", "Recovery after real faults"):
        result = inject_faults_and_recover(plan, plan_path, timeout_s, fault_step, wait_for_nodes)
    create_table_artifact(
        key="recovery-summary",
        table=recovery_rows(result),
        description="Recovery time and work lost per fault and arm (measured)",
    )
    create_markdown_artifact(
        key="recovery-report",
        markdown=recovery_markdown(result),
        description="Recovery: verdicts against the plan's thresholds",
    )
    return result
