"""The whole PoC as one flow: the stage flows in order, each only once the gate before it passed.

Where the PoC stands comes from the committed datasets (tasks/progress.py), never from
memory, so `poc` can be re-run at any time: stages already done are skipped. A stage that is
blocked, or one that ran and still is not done, stops the run with its gate's own message.
The long window is not run inline: `poc` switches on the scheduled window deployments and
returns; a later run picks up from there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.common import run_name
from tasks.plan import load_plan
from tasks.progress import (
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
        from flows.weekly_report import weekly_report as f

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


@flow(name="poc", flow_run_name=run_name("poc"), log_prints=True)
def poc(plan_path: str, until: str | None = None) -> dict[str, Any]:
    """Run the PoC's stages in order from where it stands; stop after ``until`` (a stage
    name), at the window (its schedules switched on), or at a refused gate (failing)."""
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
    first = poc_state(plan, plan.data_dir, scheduled=False)
    # Done before this run started: skipped (that is what makes a re-run idempotent).
    skipped += [
        s for s in STAGES[1 : STAGES.index(stop) + 1] if first["stages"][s]["status"] == "done"
    ]
    while True:
        state = poc_state(plan, plan.data_dir, scheduled=False)
        stage = next_stage(state, stop, ran)  # raises, with why, at a gate not passed
        if stage is None:
            result.update(stopped="complete" if first_not_done(state) is None else f"after {stop}")
            break
        entry = state["stages"][stage]
        if stage == "window":
            result.update(stopped="window", window=_start_window())
            break
        logger.info("stage %s is due (%s): running it", stage, entry["why"])
        runners[stage]()
        ran.append(stage)
    result["state"] = poc_state(plan, plan.data_dir, scheduled=False)
    create_markdown_artifact(
        key="poc-progress",
        markdown=f"# PoC {plan.poc}: stopped {result['stopped']}\n\n```\n"
        + "\n".join(state_lines(result["state"]))
        + "\n```\n",
        description="Where the PoC stands: each stage done, due or blocked",
    )
    return result


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
