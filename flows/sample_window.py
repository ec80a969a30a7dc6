"""The long window's sampler: one span on each test node, on the schedule in prefect.yaml."""

from __future__ import annotations

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import run_name
from flows.plan_check import ensure_plan_is_valid
from tasks.data.plan import Plan
from tasks.data.runctx import open_run
from tasks.window.sampling.nodes import sample
from tasks.window.sampling.span import STAGE, SampleRun


@task(name="sample_span", cache_policy=NO_CACHE)
def sample_span(
    plan: Plan, plan_path: str, span_s: float | None, interval_s: float | None, node: str | None
) -> SampleRun:
    # Refused before any row: no trace (open_run); a span ended early commits what it read.
    with open_run(plan, plan_path, STAGE) as ctx:
        return sample(plan, ctx, span_s=span_s, interval_s=interval_s, node=node)


def sample_markdown(result: SampleRun, sampler: str) -> str:
    return "\n".join(
        [
            f"# Samples: {result.samples} rows, {result.gaps} gap row(s)",
            "",
            f"- sampler: {sampler}; nodes: {', '.join(result.nodes)}",
            f"- span: {result.from_} → {result.to} ({result.reads} reads)",
            f"- runs a killed sampler left, kept up to their last flush: "
            f"{', '.join(result.salvaged_runs) or 'none'}",
        ]
    )


@flow(name="sample_window", flow_run_name=run_name("sample window"))
def sample_window(
    plan_path: str,
    span_s: float | None = None,
    interval_s: float | None = None,
    node: str | None = None,
) -> SampleRun:
    """Sample the plan's test nodes for one span (the plan's span_s at interval_s) with the
    plan's sampler; the stretch since the last run, if any, becomes a gap row."""
    plan = ensure_plan_is_valid(plan_path)
    result = sample_span(plan, plan_path, span_s, interval_s, node)
    create_markdown_artifact(
        key="sample-window",
        markdown=sample_markdown(result, plan.window.sampler),
        description="The last sampler span",
    )
    return result
