"""Stage 0: the plan on paper. Nothing that touches a cluster runs before this passes."""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import run_name
from tasks.data.plan import Plan, load_plan
from tasks.experiments.deadline import grace_warnings


@task(name="ensure_plan_is_valid", cache_policy=NO_CACHE)
def ensure_plan_is_valid(plan_path: str) -> Plan:
    return load_plan(plan_path)


@flow(name="plan_check", flow_run_name=run_name("plan check"), log_prints=True)
def plan_check(plan_path: str) -> dict[str, str]:
    """Validate a PoC plan; fails listing every problem with its field path and YAML line."""
    plan = ensure_plan_is_valid(plan_path)
    # A check that could not run (sinfo absent or silent) is said in the run's log and result:
    # "valid" then means "valid as far as this machine could tell".
    warnings = [*plan.check_warnings, *grace_warnings(plan)]  # the latter: vs what was measured
    for warning in warnings:
        print(f"warning: {warning}")
    return {
        "poc": plan.poc,
        "cluster": plan.cluster.kind,
        "checkpointer": plan.checkpointer.kind,
        "warnings": "\n".join(warnings),
    }
