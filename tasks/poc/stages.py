"""The PoC's stages, each declared once: the registry every other part reads.

`poc` (flows/poc.py) runs them in this order through their flows, `ckpt-poc status` and the
`poc` flow's artifact show them (tasks/poc/progress.py), the CLI's `--until` lists them and
tests/unit/test_layout.py checks each one against its flow and prefect.yaml. Adding a stage is one
`Stage(...)` here and its flow in flows/.

A stage's ``done`` answers, from the committed data only (tasks/poc/evidence.py), why the stage
is not done yet (None: done). Its ``needs`` are the stages whose results it needs: its gate. A
stage whose needs are not all done is blocked, with their reasons.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tasks.poc.evidence import Evidence

Check = Callable[[Evidence], str | None]


@dataclass(frozen=True)
class FlowCall:
    """One flow `poc` calls for a stage: ``target`` is ``module:function`` under flows/, called
    with the plan's path and ``kwargs``."""

    target: str
    kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def module(self) -> str:
        return self.target.split(":")[0]

    @property
    def function(self) -> str:
        return self.target.split(":")[1]


@dataclass(frozen=True)
class Stage:
    name: str
    done: Check
    # What `poc` calls, in order; the last call's result is the stage's. Empty: `poc` does
    # not run it inline (the window runs on its schedules).
    flows: tuple[FlowCall, ...]
    # The prefect.yaml deployment of its (last) flow, "<flow>/<deployment>".
    deployment: str
    needs: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()  # the datasets its runs write
    # Its runs' `stage` in their commit records, when not its name (a snapshot's phase).
    commits_as: str | None = None
    # It runs both arms of the workload: the demo's short window samples beside it.
    compares_arms: bool = False


def _good_run(stage: str, missing: str) -> Check:
    return lambda e: e.no_good_run(stage, missing)


def _measured(stage: str) -> Check:
    return lambda e: e.measured(stage)


def _window(e: Evidence) -> str | None:
    sampled = e.window.weeks_sampled
    if sampled >= e.weeks_needed:
        return None
    return f"window: {sampled} of {e.weeks_needed} week(s) sampled"


def _weekly_report(e: Evidence) -> str | None:
    # A report counts once it was built after the last sampler run (it saw every week).
    latest_input = max(e.last_at("sample_window"), e.last_at("utilization"))
    if e.good("weekly_report") and e.last_at("weekly_report") >= latest_input:
        return None
    return "no weekly report over the whole window"


def _exit_diff(e: Evidence) -> str | None:
    if e.good("exit_diff") and e.last_at("exit_diff") >= e.last_at("uninstall"):
        return None
    return "no exit diff after the uninstall"


def _flow(target: str, **kwargs: Any) -> FlowCall:
    return FlowCall(f"flows.{target}", MappingProxyType(kwargs))


# In the order `poc` runs them. The window needs only the opt-in (it samples the managed
# workload); the way out needs the comparisons done first (uninstalling earlier would end
# them); the record needs the weekly report and the exit diff.
REGISTRY: tuple[Stage, ...] = (
    # The plan was loaded (validated) to be looked at: its gate has passed.
    Stage("plan_check", lambda e: None, (_flow("plan_check:plan_check"),), "plan_check/plan_check"),
    Stage(
        "baseline",
        _good_run("baseline", "no committed baseline"),
        (_flow("baseline:baseline"),),
        "baseline/baseline",
        needs=("plan_check",),
        writes=("jobs", "quarantine", "exposure", "gates"),
    ),
    Stage(
        "before_install",
        lambda e: "; ".join(e.missing_before_install()) or None,
        (_flow("snapshot:snapshot", phase="before_install"),),
        "snapshot/snapshot",
        needs=("baseline",),
        writes=("snapshots",),
        commits_as="snapshot",
    ),
    Stage(
        "install",
        _good_run("install", "not installed (no committed install)"),
        (_flow("install:install"),),
        "install/install",
        needs=("baseline", "before_install"),
        writes=("events", "snapshots"),
    ),
    Stage(
        "opt_in",
        _good_run("opt_in", "workload not opted in"),
        (_flow("install:opt_in"),),
        "opt_in/opt_in",
        needs=("install",),
        writes=("events",),
    ),
    # Every workload of the plan through CRIU cycles before the comparisons: a workload
    # that fails is the stage's result (committed), not a refusal; nothing waits on it.
    Stage(
        "compatibility",
        _good_run("compatibility", "no committed compatibility run"),
        (_flow("compatibility:compatibility"),),
        "compatibility/compatibility",
        needs=("opt_in",),
        writes=("compatibility", "events", "gates"),
    ),
    Stage(
        "recovery",
        _measured("recovery"),
        (_flow("recovery:recovery"),),
        "recovery/recovery",
        needs=("opt_in",),
        writes=("trials", "events", "gates"),
        compares_arms=True,
    ),
    Stage(
        "overhead",
        _measured("overhead"),
        (_flow("overhead:overhead"),),
        "overhead/overhead",
        needs=("recovery",),
        writes=("trials", "events", "gates"),
        compares_arms=True,
    ),
    Stage(
        "cold_start",
        _measured("cold_start"),
        (_flow("cold_start:cold_start"),),
        "cold_start/cold_start",
        needs=("overhead",),
        writes=("trials", "events", "gates"),
        compares_arms=True,
    ),
    Stage(
        "window",
        _window,
        (),
        "sample_window/sample_window",
        needs=("opt_in",),
        writes=("samples", "sample_gaps"),
        commits_as="sample_window",
    ),
    Stage(
        "weekly_report",
        _weekly_report,
        # Goodput per arm first: the report's utilization rows are read from it.
        (_flow("utilization:utilization"), _flow("weekly_report:weekly_report")),
        "weekly_report/weekly_report",
        needs=("window",),
        writes=("utilization", "reports"),
    ),
    Stage(
        "uninstall",
        _good_run("uninstall", "not uninstalled"),
        (_flow("install:uninstall"),),
        "uninstall/uninstall",
        needs=("cold_start",),
        writes=("events", "snapshots", "exit_diff"),
    ),
    Stage(
        "exit_diff",
        _exit_diff,
        (_flow("exit_diff:exit_diff", from_phase="before_install", to_phase="after_uninstall"),),
        "exit_diff/exit_diff",
        needs=("uninstall",),
        writes=("exit_diff",),
    ),
    Stage(
        "record",
        lambda e: e.record_missing(),
        (_flow("record:record"),),
        "record/record",
        needs=("weekly_report", "exit_diff"),
    ),
)
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in REGISTRY)
BY_NAME: Mapping[str, Stage] = MappingProxyType({s.name: s for s in REGISTRY})
# The scheduled deployments of the long window (prefect.yaml): `poc` switches them on.
WINDOW_DEPLOYMENTS: tuple[str, ...] = (
    "sample_window/sample_window",
    "utilization/utilization",
    "weekly_report/weekly_report",
)


def stage(name: str) -> Stage:
    """The stage called ``name``; a clear error naming the stages for anything else."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r}: not a stage; one of {', '.join(STAGE_NAMES)}") from None
