"""A self-hosted server's watch for silent flow runs (`python -m cli.automations`).

A worker or node that dies mid-run leaves its flow run Running for ever: nothing reports
it. Flow runs send heartbeats (PREFECT_FLOWS_HEARTBEAT_FREQUENCY, set by
scripts/prefect-up for the worker); this automation marks a run CRASHED when three
heartbeats are missed. The next sampler run then records the silent span as a gap row.
"""

from __future__ import annotations

import sys
from datetime import timedelta

NAME = "ckpt-poc: crash flow runs that stopped sending heartbeats"


def ensure_zombie_automation(heartbeat_s: int) -> str:
    """Create the automation (or replace it when the heartbeat changed); return its id."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture

    within = timedelta(seconds=3 * heartbeat_s)
    try:
        existing = Automation.read(name=NAME)
    except ValueError:
        existing = None
    if existing is not None:
        trigger = existing.trigger
        if isinstance(trigger, EventTrigger) and trigger.within == within:
            return str(existing.id)
        existing.delete()
    automation = Automation(
        name=NAME,
        description="A flow run silent for three heartbeats is crashed (its span is a gap).",
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=within,
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {within.total_seconds():.0f} s: the worker or "
                "node running it stopped",
            )
        ],
    ).create()
    return str(automation.id)


if __name__ == "__main__":
    seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    print(ensure_zombie_automation(seconds))
