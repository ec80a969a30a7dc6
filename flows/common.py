"""What every stage flow does the same way in Prefect: its run's name, failures in its log."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from tasks.data.errors import CkptPocError
from tasks.data.locks import hold_nodes
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext


def _poc_of(plan_path: str) -> str:
    """The plan's `poc` name, read leniently: a name is no place to report a bad plan (the
    plan check does that, with lines)."""
    try:
        poc = yaml.safe_load(Path(plan_path).read_text()).get("poc")
    except (OSError, yaml.YAMLError, AttributeError):
        return "plan unreadable"
    return str(poc) if poc else "no poc name"


def run_name(stage: str) -> Callable[[], str]:
    """A flow_run_name for ``stage``: "recovery · demo · demo.yaml · 12-01 09:30Z"."""

    def name() -> str:
        from prefect.runtime import flow_run

        plan_path = str(flow_run.parameters.get("plan_path", ""))
        when = dt.datetime.now(dt.UTC).strftime("%m-%d %H:%MZ")
        return f"{stage} · {_poc_of(plan_path)} · {Path(plan_path).name or '?'} · {when}"

    return name


def log_failures(failures: list[dict[str, Any]], what: str) -> None:
    """Each failed trial in the flow run's log: its reason and the workload's last lines."""
    logger = get_run_logger()
    for f in failures:
        tail = f.get("log_tail") or "(the workload's log is empty)"
        logger.warning(
            "failed %s %s / %s: %s\nlast lines of the workload's log:\n%s",
            what,
            f["trial_id"],
            f["arm"],
            f["reason"],
            tail,
        )


@contextlib.contextmanager
def failure_reported_as(key: str, title: str) -> Iterator[None]:
    """If the stage fails on purpose (a workload that does not start, a run stopped early,
    a refused gate), its report artifact says so, as text, before the error ends the run."""
    try:
        yield
    except CkptPocError as exc:
        create_markdown_artifact(
            key=key,
            markdown=f"# {title}: no result\n\n```\n{exc}\n```",
            description=f"{title}: the run failed before its report",
        )
        raise


@contextlib.contextmanager
def experiment_holding_nodes(plan: Plan, ctx: RunContext, wait: bool) -> Iterator[None]:
    """Run an experiment holding the plan's nodes (tasks.data.locks): a second run waits, saying
    for whom, or refuses when ``wait`` is False (the run's journal, open_run, then leaves no
    trace of a run that wrote nothing)."""
    with hold_nodes(
        plan.cluster.kind,
        list(plan.cluster.nodes),
        poc=ctx.poc,
        run_id=ctx.run_id,
        stage=ctx.stage,
        wait=wait,
        notify=get_run_logger().warning,
    ):
        yield
