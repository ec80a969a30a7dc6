"""The way out, proved: diff each plan node's snapshots of two phases (docs/design.md §1.8)."""

from __future__ import annotations

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import run_name
from flows.plan_check import ensure_plan_is_valid
from flows.results import ExitDiffRun
from tasks.data.plan import Plan
from tasks.data.runctx import open_run
from tasks.exit.exit_diff import exit_diff as diff_nodes
from tasks.exit.exit_diff import leftovers_markdown, summary_line, verdict_line


@task(name="diff_snapshots", cache_policy=NO_CACHE)
def diff_task(plan: Plan, plan_path: str, from_phase: str, to_phase: str) -> ExitDiffRun:
    with open_run(plan, plan_path, "exit_diff", commit_refusals=True) as ctx:
        diff = diff_nodes(plan, ctx, from_phase, to_phase)
        # The verdict is in the commit record too: a clean diff writes no exit_diff row.
        ctx.ends_as(f"exit verdict: {verdict_line(diff.to_json())}")
    return ExitDiffRun(diff, ctx.run_id)


@flow(name="exit_diff", flow_run_name=run_name("exit diff"))
def exit_diff(plan_path: str, from_phase: str, to_phase: str) -> ExitDiffRun:
    """Every difference between two phases' snapshots of every plan node, attributed →
    `exit_diff`; the verdict ('clean' or 'leftovers: N', the PoC's and the unexplained items)
    first in the run's artifact, the nodes' own changes listed apart."""
    plan = ensure_plan_is_valid(plan_path)
    result = diff_task(plan, plan_path, from_phase, to_phase)
    shown = result.diff.to_json()  # the form the report helpers read
    create_markdown_artifact(
        key="exit-diff",
        markdown=leftovers_markdown(shown),
        description=f"Exit verdict: {summary_line(shown)}"[:2000],
    )
    return result
