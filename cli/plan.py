"""`ckpt-poc plan check PLAN`: is the plan valid, and if not, every problem."""

from __future__ import annotations

import os

from cli.common import PlanArg, command_body, out


def check_cmd(plan: PlanArg) -> None:
    """Validate a plan: exit 0, or 1 listing every problem as file:line: field: message."""
    if os.environ.get("PREFECT_API_URL"):
        with command_body(prefect=False):
            from flows.plan_check import plan_check  # a real server: the check is in its UI

            info = plan_check(str(plan))
    else:  # reading a file needs no Prefect server start-up: answer at once
        from tasks.data.plan import load_plan

        with command_body(prefect=False):
            loaded = load_plan(plan)
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
    # A skipped cluster check is logged by tasks.data.plan as it happens (stderr).
