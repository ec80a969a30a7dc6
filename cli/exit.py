"""`ckpt-poc snapshot` and `ckpt-poc exit-diff`: the way out, observed and diffed."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.common import JsonOpt, PlanArg, command_body, out, write_json


def snapshot_cmd(
    plan: PlanArg,
    phase: Annotated[str, typer.Option(help="before_install, after_install, after_uninstall…")],
    node: Annotated[
        str | None, typer.Option(help="one of the plan's nodes (default: every one)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Snapshot the plan's nodes at PHASE → the `snapshots` dataset (exit 1 if partial)."""
    with command_body():
        from flows.snapshot import snapshot

        summary = snapshot(str(plan), phase, node)
    if as_json:
        write_json(summary.to_json())
        return
    for name, s in summary.nodes.items():
        out.print(f"{name}: {s.items} items at {phase!r} ({', '.join(s.kinds)})")
    out.print(f"run {summary.run_id}")


def exit_diff_cmd(
    plan: PlanArg,
    from_phase: Annotated[str, typer.Option("--from", help="the earlier phase")],
    to_phase: Annotated[str, typer.Option("--to", help="the later phase")],
    as_json: JsonOpt = False,
) -> None:
    """Leftovers between two phases' snapshots (the PoC's and the unexplained), the nodes'
    own changes listed apart; exit 0 only when the verdict is clean."""
    with command_body():
        from flows.exit_diff import exit_diff
        from tasks.exit.exit_diff import LEFTOVER_FIELDS, json_form, summary_line

        result = exit_diff(str(plan), from_phase, to_phase)
    shown = result.to_json()  # the form the exit diff's helpers read
    if as_json:
        write_json(json_form(shown))
    else:
        from rich.table import Table

        out.print(f"exit verdict: {summary_line(shown)}", highlight=False, markup=False)
        for title, items, extra in (
            ("leftovers", result.diff.leftovers, ("class", "reason")),
            ("the nodes' own changes (not leftovers)", result.diff.node_own, ("reason",)),
        ):
            if not items:
                continue
            table = Table(*LEFTOVER_FIELDS, *extra, title=title)
            for item in items:
                fields = (*LEFTOVER_FIELDS, *extra)
                table.add_row(*("" if item[f] is None else str(item[f]) for f in fields))
            out.print(table)
    if result.diff.leftovers:
        raise typer.Exit(1)
