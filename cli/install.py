"""`ckpt-poc install | opt-in | uninstall PLAN`: the stages that touch a node, and the way out.

Each runs its flow (flows/install.py); `ckpt-poc demo` calls the very same `run_uninstall`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.common import JsonOpt, PlanArg, command_body, out, write_json

if TYPE_CHECKING:
    from flows.results import UninstallRun


def install_cmd(plan: PlanArg, as_json: JsonOpt = False) -> None:
    """Install the plan's checkpointer on its nodes only (needs a baseline and a
    before_install snapshot of every node); then snapshot after_install."""
    with command_body():
        from flows.install import install

        result = install(str(plan))
    if as_json:
        write_json(result.to_json(), default=str)
        return
    for node, info in result.nodes.nodes.items():
        what = "already installed" if info.skipped else ", ".join(info.files or ())
        out.print(f"{node}: {info.prefix}: {what}", highlight=False, markup=False)


def opt_in_cmd(
    plan: PlanArg,
    workload: Annotated[str | None, typer.Option(help="the workload (default: the plan's)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Mark the plan's workload as managed; say how its jobs opt in."""
    with command_body():
        from flows.install import opt_in

        record = opt_in(str(plan), workload)
    if as_json:
        write_json(record, default=str)
        return
    how = " or ".join(" ".join(record[k]) for k in ("sbatch_args", "or_sbatch_args") if k in record)
    out.print(
        f"{record['workload']} opted in by {record['who']} at {record['when']}: "
        + (f"sbatch {how}" if how else "the managed arm"),
        highlight=False,
        markup=False,
    )


def run_uninstall(plan: Path) -> UninstallRun:
    """The uninstall flow (exit.uninstall, after_uninstall snapshot, diff); a failed step
    is a command failure (exit 1), a leftover is not: it is in the result's verdict."""
    with command_body():
        from flows.install import uninstall

        result = uninstall(str(plan))
    return result


def print_verdict(result: UninstallRun) -> None:
    """Each leftover by name and class, the node's own changes apart, then the verdict."""
    for x in result.leftovers:
        out.print(
            f"  {x['node']} {x['kind']} {x['key']}: {x['change']} "
            f"({x.get('class', 'leftover')}: {x.get('reason', '')})",
            highlight=False,
            markup=False,
        )
    own = result.node_own
    if own:
        out.print(f"the node's own ({len(own)}, listed apart, not leftovers):", markup=False)
        for x in own:
            out.print(
                f"  {x['node']} {x['kind']} {x['key']}: {x['change']} ({x['reason']})",
                highlight=False,
                markup=False,
            )
    out.print(f"exit verdict: {result.verdict}", highlight=False, markup=False)


def uninstall_cmd(plan: PlanArg, as_json: JsonOpt = False) -> None:
    """Run the plan's exit.uninstall on every node, snapshot after_uninstall and diff it
    against before_install; exit 0 only when the verdict is clean."""
    result = run_uninstall(plan)
    if as_json:
        write_json(result.to_json(), default=str)
    else:
        print_verdict(result)
    if result.verdict != "clean":
        raise typer.Exit(1)
