"""Contained install, per-workload opt-in, and the way out (DESIGN §1.2, §1.8; issue 12).

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
from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext, make_run_context
from tasks.data.runs import committed_runs


def check_ready_to_install(plan: Plan, data_dir: str) -> None:
    """A committed baseline and a committed `before_install` snapshot of every plan node."""
    from tasks.exit.snapshots import latest_snapshot

    problems = []
    runs = committed_runs(data_dir, plan.poc).values()
    if not any(r.get("stage") == "baseline" for r in runs):
        problems.append("no committed baseline run: run `ckpt-poc baseline PLAN` first")
    for node in plan.cluster.nodes:
        if latest_snapshot(data_dir, plan.poc, node, "before_install") is None:
            problems.append(
                f"no committed before_install snapshot of {node}: run "
                "`ckpt-poc snapshot PLAN --phase before_install` first"
            )
    if problems:
        raise CkptPocError("install refused:\n" + "\n".join(f"  - {p}" for p in problems))


def snapshot_all(plan: Plan, ctx: RunContext, phase: str) -> None:
    from tasks.exit.snapshots import take_snapshots

    take_snapshots(plan, ctx, phase, list(plan.cluster.nodes))


def _lines(rows: dict[str, Any]) -> str:
    return "\n".join(f"- **{node}**: `{info}`" for node, info in rows.items())


@flow(name="install", flow_run_name=run_name("install"))
def install(plan_path: str, wait_for_nodes: bool = True) -> dict[str, Any]:
    """Install the criu checkpointer on the plan's nodes, then snapshot `after_install`."""
    from tasks.exit import install as inst

    plan = ensure_plan_is_valid(plan_path)
    with failure_reported_as("install-report", "Install"):
        check_ready_to_install(plan, str(plan.data_dir))
        ctx = make_run_context(plan, plan_path, stage="install")
        with experiment_holding_nodes(plan, ctx, wait_for_nodes):
            done = inst.install(plan, ctx)
            snapshot_all(plan, ctx, "after_install")
        ctx.commit()
    create_markdown_artifact(
        key="install-report",
        markdown=f"# Install of {plan.checkpointer.kind} ({plan.poc})\n\n{_lines(done)}\n",
        description="What install put on each node (prefix, hook, files)",
    )
    return {"poc": plan.poc, "run_id": ctx.run_id, "nodes": done}


@flow(name="opt_in", flow_run_name=run_name("opt_in"))
def opt_in(plan_path: str, workload: str | None = None) -> dict[str, Any]:
    """Mark the plan's workload as managed (who, what and when as events)."""
    from tasks.exit import install as inst

    plan = ensure_plan_is_valid(plan_path)
    with failure_reported_as("opt-in-report", "Opt-in"):
        ctx = make_run_context(plan, plan_path, stage="opt_in")
        record = inst.opt_in(plan, ctx, workload)
        ctx.commit()
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
def uninstall(plan_path: str, wait_for_nodes: bool = True) -> dict[str, Any]:
    """Run exit.uninstall on every node, snapshot `after_uninstall`, diff against
    `before_install`; the verdict is the result."""
    from tasks.exit import install as inst
    from tasks.exit.exit_diff import exit_diff, verdict_line

    logger = get_run_logger()
    plan = ensure_plan_is_valid(plan_path)
    with failure_reported_as("uninstall-report", "Uninstall"):
        ctx = make_run_context(plan, plan_path, stage="uninstall")
        with experiment_holding_nodes(plan, ctx, wait_for_nodes):
            try:
                steps = inst.uninstall(plan, ctx)
            finally:
                # Whatever uninstall left, the snapshot and the diff say it.
                snapshot_all(plan, ctx, "after_uninstall")
                ctx.commit()
        # Its own run (and commit record): one per run id, and this flow run's id is the
        # uninstall's; `poc` reads both stages from their commit records.
        diff_ctx = make_run_context(
            plan, plan_path, run_id=f"{ctx.run_id}-exit-diff", stage="exit_diff"
        )
        diff = exit_diff(plan, diff_ctx, "before_install", "after_uninstall")
        verdict = verdict_line(diff)
        diff_ctx.commit(f"exit verdict: {verdict}")
    n = len(diff["leftovers"])
    logger.info("exit verdict: %s", verdict)
    rows = "\n".join(
        f"| {x['node']} | {x['kind']} | `{x['key']}` | {x['change']} |" for x in diff["leftovers"]
    )
    create_markdown_artifact(
        key="uninstall-report",
        markdown=(
            f"# The way out ({plan.poc}): {verdict}\n\n{_lines(steps)}\n\n"
            + (f"| node | kind | key | change |\n|---|---|---|---|\n{rows}\n" if n else "")
        ),
        description="Uninstall steps and the before_install → after_uninstall diff",
    )
    return {
        "poc": plan.poc,
        "run_id": ctx.run_id,
        "steps": steps,
        "verdict": verdict,
        "leftovers": diff["leftovers"],
    }
