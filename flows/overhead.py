"""Steady-state overhead and the cost of checkpointing: interleaved runs, paired statistics."""

from __future__ import annotations

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
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
from tasks.experiments.overhead import (
    overhead_gate_checks,
    overhead_result,
    run_overhead,
)
from tasks.experiments.report import overhead_markdown
from tasks.experiments.results import OverheadResult
from tasks.experiments.trials import write_and_gate


@task(name="time_interleaved_runs", cache_policy=NO_CACHE)
def time_interleaved_runs(
    plan: Plan, plan_path: str, pairs: int | None, timeout_s: float, wait_for_nodes: bool
) -> OverheadResult:
    with open_run(plan, plan_path, "overhead") as ctx:
        with experiment_holding_nodes(plan, ctx, wait_for_nodes):
            run = run_overhead(plan, ctx, pairs=pairs, timeout_s=timeout_s)
        log_failures(run.failures, "run")
        files = write_and_gate(
            run.trials, ctx, "overhead", overhead_gate_checks(run.trials, plan, run.events)
        )
    return overhead_result(run, plan, ctx, files)


@flow(name="overhead", flow_run_name=run_name("overhead"))
def overhead(
    plan_path: str,
    pairs: int | None = None,
    timeout_s: float = 600,
    wait_for_nodes: bool = True,
) -> OverheadResult:
    """Interleaved A B B A runs of the plan's workload, managed vs unmanaged: steady state,
    then while checkpointed at the plan's interval; every run a row in `trials`, gated."""
    plan = ensure_plan_is_valid(plan_path)
    with failure_reported_as("overhead-report", "Steady-state overhead"):
        result = time_interleaved_runs(plan, plan_path, pairs, timeout_s, wait_for_nodes)
    create_markdown_artifact(
        key="overhead-report",
        markdown=overhead_markdown(result),
        description="Steady-state overhead and the cost of checkpointing (measured)",
    )
    return result
