"""The way out, step one: a snapshot of each plan node at a named phase (DESIGN §1.8)."""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import run_name
from flows.plan_check import ensure_plan_is_valid
from tasks.data.errors import BlastRadiusError, CkptPocError
from tasks.data.plan import Plan
from tasks.data.runctx import open_run
from tasks.exit.snapshots import take_snapshots as take_snapshots_of


@task(name="take_snapshots", cache_policy=NO_CACHE)
def take_snapshots(plan: Plan, plan_path: str, phase: str, nodes: list[str]) -> dict[str, Any]:
    """One run, one snapshot per node; committed even when partial (the error rows are the
    record of what could not be read), then a partial snapshot fails the run."""
    outside = [n for n in nodes if n not in plan.cluster.nodes]
    if outside:  # before anything is observed or written
        raise BlastRadiusError(
            f"node(s) {outside} are not among the plan's nodes {list(plan.cluster.nodes)}"
        )
    # A refusal is committed even before any row: the record says why no snapshot exists.
    with open_run(plan, plan_path, "snapshot", commit_refusals=True) as ctx:
        summary: dict[str, Any] = {"run_id": ctx.run_id, "phase": phase, "nodes": {}}
        for node, df in take_snapshots_of(plan, ctx, phase, nodes).items():
            errors = df[df["kind"] == "error"]
            summary["nodes"][node] = {
                "items": int((~df["kind"].isin(["error", "excluded"])).sum()),
                "partial": bool(df["partial"].any()),
                "errors": [f"{r.key}: {r.value}" for r in errors.itertuples()],
                "kinds": sorted(set(df["kind"]) - {"error", "excluded"}),
            }
        partial = {n: s["errors"] for n, s in summary["nodes"].items() if s["partial"]}
        if partial:
            ctx.ends_as(f"partial: {sorted(partial)}", "partial")
    summary["partial"] = bool(partial)
    return summary


def snapshot_markdown(summary: dict[str, Any]) -> str:
    lines = [f"# Snapshot `{summary['phase']}`", ""]
    lines += ["| node | items | partial | kinds |", "|---|---|---|---|"]
    for node, s in summary["nodes"].items():
        lines.append(f"| {node} | {s['items']} | {s['partial']} | {', '.join(s['kinds'])} |")
    for node, s in summary["nodes"].items():
        if s["errors"]:
            lines += ["", f"## {node}: could not read", *[f"- {e}" for e in s["errors"][:50]]]
    return "\n".join(lines) + "\n"


@flow(name="snapshot", flow_run_name=run_name("snapshot"))
def snapshot(plan_path: str, phase: str, node: str | None = None) -> dict[str, Any]:
    """Snapshot every plan node (or one) at ``phase`` → the `snapshots` dataset. A partial
    snapshot is written and marked, and fails the run with what could not be read."""
    plan = ensure_plan_is_valid(plan_path)
    nodes = [node] if node else list(plan.cluster.nodes)
    summary = take_snapshots(plan, plan_path, phase, nodes)
    create_markdown_artifact(
        key="snapshot", markdown=snapshot_markdown(summary), description="Node snapshot"
    )
    if summary["partial"]:
        errors = [f"  - {n}: {e}" for n, s in summary["nodes"].items() for e in s["errors"][:10]]
        raise CkptPocError(
            f"snapshot {phase!r} is partial (written and marked so; never diffed as whole):\n"
            + "\n".join(errors)
        )
    return summary
