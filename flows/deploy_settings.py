"""What `prefect deploy` reads from the plan: `python -m flows.deploy_settings PLAN` prints
shell `export` lines that prefect.yaml's `{{ $CKPT_POC_… }}` placeholders take (the plan's
time zone, crons and whether the schedules start active). scripts/prefect-up evals them.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from tasks.data import env_markers
from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan, load_plan


def deploy_settings(plan: Plan, plan_path: str) -> dict[str, str]:
    schedules = plan.window.schedules
    return {
        env_markers.PLAN: plan_path,
        env_markers.SCHEDULES_ACTIVE: "true" if schedules.active else "false",
        env_markers.TIMEZONE: schedules.timezone,
        env_markers.CRON_SAMPLE_WINDOW: schedules.sample_window,
        env_markers.CRON_UTILIZATION: schedules.utilization,
        env_markers.CRON_WEEKLY_REPORT: schedules.weekly_report,
        # The way out is tried during the PoC: uninstall once, on exit.test_by at 09:00
        # (Prefect's rrule takes UNTIL, not COUNT).
        env_markers.RRULE_UNINSTALL: (
            f"DTSTART:{plan.exit.test_by:%Y%m%d}T090000\n"
            f"RRULE:FREQ=DAILY;UNTIL={plan.exit.test_by:%Y%m%d}T235959"
        ),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m flows.deploy_settings PLAN", file=sys.stderr)
        return 2
    try:
        plan = load_plan(Path(argv[0]), check_cluster=False)
    except CkptPocError as exc:
        print(f"deploy_settings: {exc}", file=sys.stderr)
        return 1
    for key, value in deploy_settings(plan, argv[0]).items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
