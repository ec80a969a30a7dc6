"""The way out, step one: a snapshot of each plan node at a named phase (docs/design.md §1.8)."""

from __future__ import annotations

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import run_name
from flows.plan_check import ensure_plan_is_valid
from tasks.data.errors import BlastRadiusError
from tasks.data.plan import Plan
from tasks.data.runctx import open_run
from tasks.exit.snapshots import SnapshotResult
from tasks.exit.snapshots import take_snapshots as take_snapshots_of


@task(name="take_snapshots", cache_policy=NO_CACHE)
def take_snapshots(plan: Plan, plan_path: str, phase: str, nodes: list[str]) -> SnapshotResult:
    """One run, one snapshot per node; committed even when partial (the error rows are the
    record of what could not be read), then a partial snapshot fails the run."""
    outside = [n for n in nodes if n not in plan.cluster.nodes]
    if outside:  # before anything is observed or written
        raise BlastRadiusError(
            f"node(s) {outside} are not among the plan's nodes {list(plan.cluster.nodes)}"
        )
    # A refusal is committed even before any row: the record says why no snapshot exists.
    with open_run(plan, plan_path, "snapshot", commit_refusals=True) as ctx:
        result = SnapshotResult.of(ctx.run_id, phase, take_snapshots_of(plan, ctx, phase, nodes))
        if result.partial:
            ctx.ends_as(f"partial: {result.partial_nodes()}", "partial")
    return result


@flow(name="snapshot", flow_run_name=run_name("snapshot"))
def snapshot(plan_path: str, phase: str, node: str | None = None) -> SnapshotResult:
    """Snapshot every plan node (or one) at ``phase`` → the `snapshots` dataset. A partial
    snapshot is written and marked, and fails the run with what could not be read. Returns
    the result (tasks/exit/snapshots.py: SnapshotResult)."""
    plan = ensure_plan_is_valid(plan_path)
    nodes = [node] if node else list(plan.cluster.nodes)
    result = take_snapshots(plan, plan_path, phase, nodes)
    create_markdown_artifact(
        key="snapshot", markdown=result.markdown(), description="Node snapshot"
    )
    if result.partial:
        raise result.partial_error()
    return result
