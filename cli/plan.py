"""`ckpt-poc plan check PLAN`: is the plan valid, and if not, every problem."""

from __future__ import annotations

import os

from cli.common import PlanArg, command_body, out


def check_cmd(plan: PlanArg) -> None:
    """Validate a plan: exit 0, or 1 listing every problem as file:line: field: message."""
    measured_warnings: list[str] = []  # the plan against what this PoC measured so far
    if os.environ.get("PREFECT_API_URL"):
        with command_body(prefect=False):
            from flows.plan_check import plan_check  # a real server: the check is in its UI

            info = plan_check(str(plan))
    else:  # reading a file needs no Prefect server start-up: answer at once
        from tasks.data.plan import load_plan
        from tasks.experiments.deadline import grace_warnings

        with command_body(prefect=False):
            loaded = load_plan(plan)
            measured_warnings = grace_warnings(loaded)
        info = {
            "poc": loaded.poc,
            "cluster": loaded.cluster.kind,
            "checkpointer": loaded.checkpointer.kind,
            "warnings": list(loaded.check_warnings),
        }
    out.print(
        f"[green]plan {plan} is valid[/]: poc={info['poc']} cluster={info['cluster']} "
        f"checkpointer={info['checkpointer']}"
    )
    for warning in measured_warnings:
        out.print(f"[yellow]warning[/]: {plan}: {warning}")
    # A skipped cluster check is logged by tasks.data.plan as it happens (stderr).
