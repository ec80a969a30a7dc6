"""The range of applications: each plan workload through checkpoint → kill → restore cycles."""

from __future__ import annotations

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import experiment_holding_nodes, failure_reported_as, run_name
from flows.plan_check import ensure_plan_is_valid
from tasks.data.plan import Plan
from tasks.data.runctx import open_run
from tasks.experiments.backends.registry import run_sweep
from tasks.experiments.compatibility_result import (
    CompatibilityResult,
    compatibility_markdown,
    compatibility_result,
    result_lines,
)
from tasks.experiments.compatibility_rows import write_and_gate_compatibility, write_matrix


@task(name="checkpoint_kill_restore_each_workload", cache_policy=NO_CACHE)
def checkpoint_kill_restore_each_workload(
    plan: Plan,
    plan_path: str,
    cycles: int | None,
    timeout_s: float | None,
    only: list[str] | None,
    wait_for_nodes: bool,
) -> CompatibilityResult:
    with open_run(plan, plan_path, "compatibility") as ctx:
        with experiment_holding_nodes(plan, ctx, wait_for_nodes):
            run = run_sweep(plan, ctx, cycles=cycles, timeout_s=timeout_s, only=only)
        files = write_and_gate_compatibility(run, ctx)
    result = compatibility_result(run, ctx, files)
    write_matrix(result)
    return result


@flow(name="compatibility", flow_run_name=run_name("compatibility"))
def compatibility(
    plan_path: str,
    cycles: int | None = None,
    timeout_s: float | None = None,
    only: list[str] | None = None,
    wait_for_nodes: bool = True,
) -> CompatibilityResult:
    """Every workload of the plan (or those in ``only``): an uninterrupted reference run,
    then ``cycles`` (default: the plan's compatibility.cycles) CRIU checkpoint → kill →
    restore cycles and the fidelity check; rows in `compatibility`, gated; the matrix as
    the compatibility-report artifact. A workload that fails is a result, not a failure."""
    plan = ensure_plan_is_valid(plan_path)
    with failure_reported_as("compatibility-report", "Compatibility"):
        result = checkpoint_kill_restore_each_workload(
            plan, plan_path, cycles, timeout_s, only, wait_for_nodes
        )
    logger = get_run_logger()
    for line in result_lines(result):
        logger.info("%s", line)
    create_markdown_artifact(
        key="compatibility-report",
        markdown=compatibility_markdown(result),
        description="Compatibility: workload × dump, restore, fidelity, k/n (measured)",
    )
    return result
