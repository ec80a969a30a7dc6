"""Contained install, per-workload opt-in, and the way out (docs/design.md §1.2, §1.8).

Thin flows over tasks/exit/install.py. ``install`` refuses to start without a valid plan, a
committed baseline and a committed `before_install` snapshot of every plan node; after
installing it snapshots `after_install`. ``uninstall`` runs the plan's exit.uninstall on every
node, snapshots `after_uninstall` and diffs it against `before_install`: the verdict
('clean' or 'leftovers: N') is the flow's result and its markdown artifact.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.common import experiment_holding_nodes, failure_reported_as, run_name
from flows.plan_check import ensure_plan_is_valid
from flows.results import InstallRun, UninstallRun
from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext, open_run
from tasks.exit.install_result import OptInRecord
from tasks.poc.progress import GateRefused, refusal_before


def check_ready_to_install(plan: Plan) -> None:
    """The install's gate, the registry's (tasks/poc/stages.py): a committed baseline and a
    whole `before_install` snapshot of every plan node."""
    why = refusal_before(plan, plan.data_dir, "install")
    if why:
        raise GateRefused(
            f"install refused: {why}\n  (run the stages before it first: "
            "`ckpt-poc poc PLAN --until before_install`)"
        )


def snapshot_all(plan: Plan, ctx: RunContext, phase: str) -> None:
    from tasks.exit.snapshots import take_snapshots

    take_snapshots(plan, ctx, phase, list(plan.cluster.nodes))


def _lines(rows: dict[str, Any]) -> str:
    """Each node's entry of a result's JSON form, as the report shows it."""
    return "\n".join(f"- **{node}**: `{info}`" for node, info in rows.items())


@flow(name="install", flow_run_name=run_name("install"))
def install(plan_path: str, wait_for_nodes: bool = True) -> InstallRun:
    """Install the criu checkpointer on the plan's nodes, then snapshot `after_install`."""
    from tasks.exit import install as inst

    plan = ensure_plan_is_valid(plan_path)
    with failure_reported_as("install-report", "Install"):
        check_ready_to_install(plan)
        with (
            open_run(plan, plan_path, "install") as ctx,
            experiment_holding_nodes(plan, ctx, wait_for_nodes),
        ):
            done = inst.install(plan, ctx)
            snapshot_all(plan, ctx, "after_install")
    title = f"# Install of {plan.checkpointer.kind} ({plan.poc})"
    create_markdown_artifact(
        key="install-report",
        markdown=f"{title}\n\n{_lines(done.to_json())}\n",
        description="What install put on each node (prefix, hook, files)",
    )
    return InstallRun(plan.poc, ctx.run_id, done)


@flow(name="opt_in", flow_run_name=run_name("opt_in"))
def opt_in(plan_path: str, workload: str | None = None) -> OptInRecord:
    """Mark the plan's workload as managed (who, what and when as events)."""
    from tasks.exit import install as inst

    plan = ensure_plan_is_valid(plan_path)
    with (
        failure_reported_as("opt-in-report", "Opt-in"),
        open_run(plan, plan_path, "opt_in") as ctx,
    ):
        record = inst.opt_in(plan, ctx, workload)
    how = record.get("sbatch_args") or ["managed arm"]
    create_markdown_artifact(
        key="opt-in-report",
        markdown=(
            f"# Opt-in: {record['workload']} ({plan.poc})\n\n"
            f"- how: `{' '.join(how)}`\n- who: {record['who']}\n- when: {record['when']}\n"
        ),
        description="Which workload is managed, and how it opts in",
    )
    return record


@flow(name="uninstall", flow_run_name=run_name("uninstall"))
def uninstall(plan_path: str, wait_for_nodes: bool = True) -> UninstallRun:
    """Run exit.uninstall on every node, snapshot `after_uninstall`, diff against
    `before_install`; the verdict is the result."""
    from tasks.exit import install as inst
    from tasks.exit.exit_diff import (
        exit_diff,
        json_form,
        leftovers_markdown,
        summary_line,
        verdict_line,
    )

    logger = get_run_logger()
    plan = ensure_plan_is_valid(plan_path)
    with failure_reported_as("uninstall-report", "Uninstall"):
        failed: CkptPocError | None = None
        with (
            open_run(plan, plan_path, "uninstall") as ctx,
            experiment_holding_nodes(plan, ctx, wait_for_nodes),
        ):
            try:
                steps = inst.uninstall(plan, ctx)
            except CkptPocError as exc:
                failed = exc  # raised once the run is committed: its snapshot says what is left
            finally:
                # Whatever uninstall left, the snapshot and the diff say it.
                snapshot_all(plan, ctx, "after_uninstall")
        if failed is not None:
            raise failed
        # Its own run (and commit record): one per run id, and this flow run's id is the
        # uninstall's; `poc` reads both stages from their commit records.
        with open_run(plan, plan_path, "exit_diff", run_id=f"{ctx.run_id}-exit-diff") as diff_ctx:
            diff = exit_diff(plan, diff_ctx, "before_install", "after_uninstall").to_json()
            verdict = verdict_line(diff)
            diff_ctx.ends_as(f"exit verdict: {verdict}")
    logger.info("exit verdict: %s", summary_line(diff))
    create_markdown_artifact(
        key="uninstall-report",
        markdown=(
            f"# The way out ({plan.poc}): {verdict}\n\n{_lines(steps.to_json())}\n\n"
            + leftovers_markdown(diff)
        ),
        description="Uninstall steps and the before_install → after_uninstall diff",
    )
    shown = json_form(diff)
    return UninstallRun(plan.poc, ctx.run_id, steps, verdict, shown["leftovers"], shown["node_own"])
