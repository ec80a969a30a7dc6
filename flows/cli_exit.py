"""`ckpt-poc snapshot` and `ckpt-poc exit-diff`: the way out, observed and diffed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from tasks.data.errors import CkptPocError

PlanArg = Annotated[Path, typer.Argument(help="the PoC plan (YAML)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the result as JSON")]


def snapshot_cmd(
    plan: PlanArg,
    phase: Annotated[str, typer.Option(help="before_install, after_install, after_uninstall…")],
    node: Annotated[
        str | None, typer.Option(help="one of the plan's nodes (default: every one)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Snapshot the plan's nodes at PHASE → the `snapshots` dataset (exit 1 if partial)."""
    # Lazily: flows.cli registers these commands, so importing it at the top is circular.
    from flows.cli import _fail, _flows_ready, out

    _flows_ready()
    from flows.snapshot import snapshot

    try:
        summary = snapshot(str(plan), phase, node)
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(summary) + "\n")
        return
    for name, s in summary["nodes"].items():
        out.print(f"{name}: {s['items']} items at {phase!r} ({', '.join(s['kinds'])})")
    out.print(f"run {summary['run_id']}")


def exit_diff_cmd(
    plan: PlanArg,
    from_phase: Annotated[str, typer.Option("--from", help="the earlier phase")],
    to_phase: Annotated[str, typer.Option("--to", help="the later phase")],
    as_json: JsonOpt = False,
) -> None:
    """Leftovers between two phases' snapshots; exit 0 only when the verdict is clean."""
    from flows.cli import _fail, _flows_ready, out

    _flows_ready()
    from flows.exit_diff import exit_diff
    from tasks.exit.exit_diff import LEFTOVER_FIELDS, verdict_line

    try:
        result = exit_diff(str(plan), from_phase, to_phase)
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        leftovers = [{f: item[f] for f in LEFTOVER_FIELDS} for item in result["leftovers"]]
        sys.stdout.write(json.dumps({"verdict": result["verdict"], "leftovers": leftovers}) + "\n")
    else:
        from rich.table import Table

        out.print(f"exit verdict: {verdict_line(result)}", highlight=False)
        if result["leftovers"]:
            table = Table(*LEFTOVER_FIELDS)
            for item in result["leftovers"]:
                table.add_row(*("" if item[f] is None else str(item[f]) for f in LEFTOVER_FIELDS))
            out.print(table)
    if result["leftovers"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `snapshot` and `exit-diff` to the ckpt-poc app (flows/cli.py calls this)."""
    app.command("snapshot")(snapshot_cmd)
    app.command("exit-diff")(exit_diff_cmd)
