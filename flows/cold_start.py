"""Cold start: native launch → ready against restore → ready, with checkpoint size."""

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
from tasks.experiments.cold_start import (
    cold_start_gate_checks,
    cold_start_result,
    plot_restore_throughput,
    run_cold_start,
)
from tasks.experiments.report_cold_start import cold_start_markdown
from tasks.experiments.results import ColdStartResult
from tasks.experiments.trials import write_and_gate


@task(name="time_native_and_restored_starts", cache_policy=NO_CACHE)
def time_native_and_restored_starts(
    plan: Plan, plan_path: str, repeats: int | None, timeout_s: float, wait_for_nodes: bool
) -> ColdStartResult:
    with open_run(plan, plan_path, "cold_start") as ctx:
        with experiment_holding_nodes(plan, ctx, wait_for_nodes):
            run = run_cold_start(plan, ctx, repeats=repeats, timeout_s=timeout_s)
        log_failures(run.failures, "start")
        files = write_and_gate(
            run.trials, ctx, "cold_start", cold_start_gate_checks(run.trials, plan)
        )
    plot = plot_restore_throughput(run.trials, run.summary, run.run_dir / "restore-throughput.png")
    return cold_start_result(run, plan, ctx, files, plot)


@flow(name="cold_start", flow_run_name=run_name("cold start"))
def cold_start(
    plan_path: str,
    repeats: int | None = None,
    timeout_s: float = 120,
    wait_for_nodes: bool = True,
) -> ColdStartResult:
    """Native launch → ready against CRIU restore → ready of the same initialised copy;
    every start a row in `trials`, gated; the speed-up with its CI, and restore GB/s."""
    plan = ensure_plan_is_valid(plan_path)
    with failure_reported_as("cold-start-report", "Cold start"):
        result = time_native_and_restored_starts(
            plan, plan_path, repeats, timeout_s, wait_for_nodes
        )
    create_markdown_artifact(
        key="cold-start-report",
        markdown=cold_start_markdown(result),
        description="Cold start: native vs restore (measured)",
    )
    return result
