"""The engine on its own: the plan's workload as a managed and an unmanaged copy, one clock."""

from __future__ import annotations

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import experiment_holding_nodes, run_name
from flows.plan_check import ensure_plan_is_valid
from tasks.data.plan import Plan
from tasks.data.runctx import open_run
from tasks.engine.side_by_side import (
    SideBySideSummary,
    ensure_engine_supports,
    run_side_by_side,
)


@task(name="run_managed_and_unmanaged", cache_policy=NO_CACHE)
def run_managed_and_unmanaged(
    plan: Plan, plan_path: str, timeout_s: float, wait_for_nodes: bool
) -> SideBySideSummary:
    ensure_engine_supports(plan)
    with (
        open_run(plan, plan_path, "side_by_side") as ctx,
        experiment_holding_nodes(plan, ctx, wait_for_nodes),
    ):
        return run_side_by_side(plan, ctx, timeout_s=timeout_s).summary()


@flow(name="side_by_side", flow_run_name=run_name("side by side"))
def side_by_side(
    plan_path: str, timeout_s: float = 300, wait_for_nodes: bool = True
) -> SideBySideSummary:
    """Both copies of the plan's workload, CRIU checkpoints on the managed one, every event
    in the `events` dataset."""
    plan = ensure_plan_is_valid(plan_path)
    summary = run_managed_and_unmanaged(plan, plan_path, timeout_s, wait_for_nodes)
    lines = ["# Side by side", "", "| arm | slot | last step | exited |", "|---|---|---:|---|"]
    for arm, r in summary.arms.items():
        lines.append(f"| {arm} | {r.slot} | {r.last_step} | {r.exited} |")
    lines += [
        "",
        f"CRIU checkpoints: {summary.checkpoints} (median dump "
        f"{summary.median_dump_s} s, median image {summary.median_image_bytes} B), "
        f"skipped ticks {summary.skipped_ticks}; events recorded: {summary.events}.",
    ]
    create_markdown_artifact(
        key="side-by-side",
        markdown="\n".join(lines),
        description="Managed and unmanaged copies (measured)",
    )
    return summary
