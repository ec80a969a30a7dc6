"""The whole PoC as one flow: the stage flows in order, each only once the gate before it passed.

Where the PoC stands comes from the committed datasets (tasks/poc/progress.py), never from
memory, so `poc` can be re-run at any time: stages already done are skipped. A stage that is
blocked, or one that ran and still is not done, stops the run with its gate's own message.
The long window is not run inline: `poc` switches on the scheduled window deployments and
returns; a later run picks up from there. The demo (``short_window=True``: scripts/demo, the
`poc/demo` deployment) instead samples the test nodes while the comparisons run and counts one
sampled week as the window (flows/short_window.py), so it runs to the decision record.
"""

from __future__ import annotations

import importlib
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.common import run_name
from flows.results import (
    ExitDiffRun,
    ExitVerdict,
    PocRun,
    RecordRun,
    RecordSummary,
    UninstallRun,
    WindowStart,
)
from flows.short_window import start_sampler, stop_sampler
from tasks.data.plan import load_plan
from tasks.poc.progress import (
    GateRefused,
    PocState,
    first_not_done,
    next_stage,
    poc_state,
    state_lines,
)
from tasks.poc.stages import STAGE_NAMES, WINDOW_DEPLOYMENTS, stage


def activate_window(
    deployments: tuple[str, ...] = WINDOW_DEPLOYMENTS, active: bool = True
) -> WindowStart:
    """Switch on (``active``; off: False) every schedule of the window deployments on the
    current Prefect API. Returns the schedules per deployment, and the deployments missing
    there."""
    from prefect.client.orchestration import get_client

    activated: dict[str, int] = {}
    missing: list[str] = []
    with get_client(sync_client=True) as client:
        for name in deployments:
            try:
                dep = client.read_deployment_by_name(name)
            except Exception:  # ObjectNotFound, or an API without deployments
                missing.append(name)
                continue
            schedules = client.read_deployment_schedules(dep.id)
            for s in schedules:
                if s.active != active:
                    client.update_deployment_schedule(dep.id, s.id, active=active)
            activated[name] = len(schedules)
    return WindowStart(activated, tuple(missing))


def run_stage(name: str, plan_path: str) -> Any:
    """The stage's flows (the registry's), called in order as subflows; the last one's result
    is the stage's. Imported lazily: each pulls its own dependencies."""
    result: Any = None
    for call in stage(name).flows:
        function = getattr(importlib.import_module(call.module), call.function)
        result = function(plan_path, **call.kwargs)
    return result


@flow(name="poc", flow_run_name=run_name("poc"), log_prints=True)
def poc(plan_path: str, until: str | None = None, short_window: bool = False) -> PocRun:
    """Run the PoC's stages in order from where it stands; stop after ``until`` (a stage
    name), at the window (its schedules switched on), or at a refused gate (failing).
    ``short_window`` (the demo): sample the test nodes while the comparisons run and count
    one sampled week as the window instead of switching on its schedules."""
    from flows.plan_check import plan_check

    logger = get_run_logger()
    if until is not None and until not in STAGE_NAMES:
        raise GateRefused(f"--until {until!r}: not a stage; one of {', '.join(STAGE_NAMES)}")
    plan_check(plan_path)  # gate 0: nothing runs on an invalid plan (its own message)
    plan = load_plan(plan_path, check_cluster=False)
    ran: list[str] = ["plan_check"]
    stop = until or STAGE_NAMES[-1]
    exit_seen: ExitVerdict | None = None
    record_seen: RecordSummary | None = None
    window: WindowStart | None = None
    weeks = 1 if short_window else None

    def state_now() -> PocState:
        return poc_state(plan, plan.data_dir, scheduled=False, window_weeks=weeks)

    first = state_now()
    # Done before this run started: skipped (that is what makes a re-run idempotent).
    skipped = [
        s for s in STAGE_NAMES[1 : STAGE_NAMES.index(stop) + 1] if first.stages[s].status == "done"
    ]
    sampler = None
    try:
        while True:
            state = state_now()
            name = next_stage(state, stop, ran)  # raises, with why, at a gate not passed
            if sampler is not None and (name is None or not stage(name).compares_arms):
                _stop_short_window(sampler)
                sampler = None
                state = state_now()
                name = next_stage(state, stop, ran)
            if name is None:
                stopped = "complete" if first_not_done(state) is None else f"after {stop}"
                break
            entry = state.stages[name]
            if not stage(name).flows:  # the window: it runs on its schedules, not inline
                stopped, window = "window", _start_window()
                break
            window_due = state.stages["window"].status != "done"
            if short_window and sampler is None and stage(name).compares_arms and window_due:
                logger.info("short window: sampling the test nodes while the arms run")
                sampler = start_sampler(plan_path)
            logger.info("stage %s is due (%s): running it", name, entry.why)
            outcome = run_stage(name, plan_path)
            ran.append(name)
            if isinstance(outcome, UninstallRun | ExitDiffRun):
                exit_seen = outcome.exit_verdict()
            if isinstance(outcome, RecordRun):
                record_seen = outcome.summary()
    finally:
        if sampler is not None:
            _stop_short_window(sampler)
    result = PocRun(
        plan.poc, tuple(ran), tuple(skipped), exit_seen, record_seen, stopped, window, state_now()
    )
    _publish_progress(result, short_window)
    return result


def _publish_progress(result: PocRun, short_window: bool) -> None:
    create_markdown_artifact(
        key="poc-progress",
        markdown=f"# PoC {result.poc}: stopped {result.stopped}\n\n"
        + (
            "The demo's short window: the test nodes were sampled while the comparisons "
            "ran (minutes, not the plan's weeks).\n\n"
            if short_window
            else ""
        )
        + "```\n"
        + "\n".join(state_lines(result.state.to_json()))
        + "\n```\n",
        description="Where the PoC stands: each stage done, due or blocked",
    )


def _stop_short_window(sampler: Any) -> None:
    warning = stop_sampler(sampler)
    if warning:
        get_run_logger().warning("short window: %s", warning)


def _start_window() -> WindowStart:
    """The window runs on its schedules, not inline: switch them on, or say why not."""
    logger = get_run_logger()
    try:
        outcome = activate_window()
    except Exception as exc:  # no API reachable: said, and the run returns
        outcome = WindowStart({}, WINDOW_DEPLOYMENTS, str(exc))
    if outcome.missing:
        logger.warning(
            "could not switch on the window's schedules: deployment(s) %s not on this Prefect "
            "API (deploy them: scripts/prefect-up), then re-run poc",
            ", ".join(outcome.missing),
        )
    if outcome.activated:
        logger.info("window schedules switched on: %s", outcome.activated)
    return outcome
