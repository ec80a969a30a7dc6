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

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.common import run_name
from flows.short_window import start_sampler, stop_sampler
from tasks.data.plan import load_plan
from tasks.poc.progress import (
    STAGES,
    WINDOW_DEPLOYMENTS,
    GateRefused,
    first_not_done,
    next_stage,
    poc_state,
    state_lines,
)

RECORD_FLOW = Path(__file__).resolve().parent / "record.py"


def activate_window(
    deployments: tuple[str, ...] = WINDOW_DEPLOYMENTS, active: bool = True
) -> dict[str, Any]:
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
    return {"activated": activated, "missing": missing}


def _record_hook(plan_path: str) -> Any:
    """HOOK: the decision record (flows/record.py, another worker's) once it exists."""
    if not RECORD_FLOW.exists():
        raise GateRefused("record: flows/record.py does not exist yet (the decision record)")
    from flows.record import record  # type: ignore[import-not-found]

    return record(plan_path)


def _runners(plan_path: str) -> dict[str, Callable[[], Any]]:
    """Each stage's flow, called as a subflow (imported lazily: each pulls its own deps)."""

    def baseline() -> Any:
        from flows.baseline import baseline as f

        return f(plan_path)

    def before_install() -> Any:
        from flows.snapshot import snapshot as f

        return f(plan_path, phase="before_install")

    def install() -> Any:
        from flows.install import install as f

        return f(plan_path)

    def opt_in() -> Any:
        from flows.install import opt_in as f

        return f(plan_path)

    def recovery() -> Any:
        from flows.recovery import recovery as f

        return f(plan_path)

    def overhead() -> Any:
        from flows.overhead import overhead as f

        return f(plan_path)

    def cold_start() -> Any:
        from flows.cold_start import cold_start as f

        return f(plan_path)

    def weekly_report() -> Any:
        # Goodput per arm first: the report's utilization rows are read from it.
        from flows.utilization import utilization
        from flows.weekly_report import weekly_report as f

        utilization(plan_path)
        return f(plan_path)

    def uninstall() -> Any:
        from flows.install import uninstall as f

        return f(plan_path)

    def exit_diff() -> Any:
        from flows.exit_diff import exit_diff as f

        return f(plan_path, "before_install", "after_uninstall")

    return {
        "baseline": baseline,
        "before_install": before_install,
        "install": install,
        "opt_in": opt_in,
        "recovery": recovery,
        "overhead": overhead,
        "cold_start": cold_start,
        "weekly_report": weekly_report,
        "uninstall": uninstall,
        "exit_diff": exit_diff,
        "record": lambda: _record_hook(plan_path),
    }


# The stages that run both arms: the short window samples beside them.
COMPARISONS = ("recovery", "overhead", "cold_start")


@flow(name="poc", flow_run_name=run_name("poc"), log_prints=True)
def poc(plan_path: str, until: str | None = None, short_window: bool = False) -> dict[str, Any]:
    """Run the PoC's stages in order from where it stands; stop after ``until`` (a stage
    name), at the window (its schedules switched on), or at a refused gate (failing).
    ``short_window`` (the demo): sample the test nodes while the comparisons run and count
    one sampled week as the window instead of switching on its schedules."""
    from flows.plan_check import plan_check

    logger = get_run_logger()
    if until is not None and until not in STAGES:
        raise GateRefused(f"--until {until!r}: not a stage; one of {', '.join(STAGES)}")
    plan_check(plan_path)  # gate 0: nothing runs on an invalid plan (its own message)
    plan = load_plan(plan_path, check_cluster=False)
    runners = _runners(plan_path)
    ran: list[str] = ["plan_check"]
    skipped: list[str] = []
    stop = until or STAGES[-1]
    result: dict[str, Any] = {"poc": plan.poc, "ran": ran, "skipped": skipped}
    weeks = 1 if short_window else None

    def state_now() -> dict[str, Any]:
        return poc_state(plan, plan.data_dir, scheduled=False, window_weeks=weeks)

    first = state_now()
    # Done before this run started: skipped (that is what makes a re-run idempotent).
    skipped += [
        s for s in STAGES[1 : STAGES.index(stop) + 1] if first["stages"][s]["status"] == "done"
    ]
    sampler = None
    try:
        while True:
            state = state_now()
            stage = next_stage(state, stop, ran)  # raises, with why, at a gate not passed
            if sampler is not None and stage not in COMPARISONS:
                _stop_short_window(sampler)
                sampler = None
                state = state_now()
                stage = next_stage(state, stop, ran)
            if stage is None:
                result.update(
                    stopped="complete" if first_not_done(state) is None else f"after {stop}"
                )
                break
            entry = state["stages"][stage]
            if stage == "window":
                result.update(stopped="window", window=_start_window())
                break
            window_due = state["stages"]["window"]["status"] != "done"
            if short_window and sampler is None and stage in COMPARISONS and window_due:
                logger.info("short window: sampling the test nodes while the arms run")
                sampler = start_sampler(plan_path)
            logger.info("stage %s is due (%s): running it", stage, entry["why"])
            outcome = runners[stage]()
            ran.append(stage)
            if stage in ("uninstall", "exit_diff") and isinstance(outcome, dict):
                result["exit"] = {k: outcome.get(k) for k in ("verdict", "leftovers")}
            if stage == "record" and isinstance(outcome, dict):
                result["record"] = {k: outcome.get(k) for k in ("html", "pdf", "verdicts")}
    finally:
        if sampler is not None:
            _stop_short_window(sampler)
    result["state"] = state_now()
    create_markdown_artifact(
        key="poc-progress",
        markdown=f"# PoC {plan.poc}: stopped {result['stopped']}\n\n"
        + (
            "The demo's short window: the test nodes were sampled while the comparisons "
            "ran (minutes, not the plan's weeks).\n\n"
            if short_window
            else ""
        )
        + "```\n"
        + "\n".join(state_lines(result["state"]))
        + "\n```\n",
        description="Where the PoC stands: each stage done, due or blocked",
    )
    return result


def _stop_short_window(sampler: Any) -> None:
    warning = stop_sampler(sampler)
    if warning:
        get_run_logger().warning("short window: %s", warning)


def _start_window() -> dict[str, Any]:
    """The window runs on its schedules, not inline: switch them on, or say why not."""
    logger = get_run_logger()
    try:
        outcome = activate_window()
    except Exception as exc:  # no API reachable: said, and the run returns
        outcome = {"activated": {}, "missing": list(WINDOW_DEPLOYMENTS), "error": str(exc)}
    if outcome["missing"]:
        logger.warning(
            "could not switch on the window's schedules: deployment(s) %s not on this Prefect "
            "API (deploy them: scripts/prefect-up), then re-run poc",
            ", ".join(outcome["missing"]),
        )
    if outcome["activated"]:
        logger.info("window schedules switched on: %s", outcome["activated"])
    return outcome
