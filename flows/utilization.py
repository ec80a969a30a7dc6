"""Job-level utilization (goodput) per arm, week and workload; daily on its schedule."""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import run_name
from flows.plan_check import ensure_plan_is_valid
from flows.results import UtilizationResult
from tasks.data.plan import Plan
from tasks.data.runctx import open_run
from tasks.window.utilization import compute_utilization

GPU_HOUR_COLUMNS = (
    "allocated_gpu_h",
    "delivered_gpu_h",
    "lost_gpu_h",
    "idle_checkpoint_gpu_h",
    "idle_recovery_gpu_h",
    "idle_other_gpu_h",
    "queued_gpu_h",
    "unfinished_step_gpu_h",
    "excluded_gpu_h",
)
COLUMNS = (
    "week",
    "arm",
    "workload",
    "jobs",
    *GPU_HOUR_COLUMNS,
    "goodput",
    "goodput_job_span",
    "chains_open",
    "provisional",
    "busy_fraction",
    "busy_metric",
    "samples",
)


@task(name="compute_job_utilization", cache_policy=NO_CACHE)
def compute_job_utilization(plan: Plan, plan_path: str, week: str | None) -> UtilizationResult:
    with open_run(plan, plan_path, "utilization") as ctx:
        rows = compute_utilization(plan, ctx, week)
    records = [
        {c: (None if _missing(v) else v) for c, v in row.items() if c in COLUMNS}
        for row in rows.to_dict("records")
    ]
    return UtilizationResult(ctx.poc, ctx.run_id, week, records)


def _missing(value: Any) -> bool:
    try:
        return bool(value != value)  # NaN / NA
    except (TypeError, ValueError):
        return value is None


@flow(name="utilization", flow_run_name=run_name("utilization"))
def utilization(plan_path: str, week: str | None = None) -> UtilizationResult:
    """Per arm, ISO week and workload: allocated GPU-hours split into delivered, lost and
    idle (checkpointing, recovery, other), goodput and the samples' busy fraction."""
    plan = ensure_plan_is_valid(plan_path)
    result = compute_job_utilization(plan, plan_path, week)
    create_table_artifact(
        key="utilization",
        table=result.rows or [{"week": week or "all", "note": "no allocations yet"}],
        description="Job-level utilization per arm and week (measured)",
    )
    return result
