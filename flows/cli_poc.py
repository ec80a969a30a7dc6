"""`ckpt-poc poc PLAN [--until STAGE] [--json]`: the whole PoC from where it stands.

flows/cli.py calls ``register(app)``; ``print_state(state)`` prints the stage table that
`ckpt-poc status` shows. `python -m flows.cli_poc poc PLAN` runs the command on its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from tasks.data.errors import CkptPocError
from tasks.poc.progress import STAGES, state_lines

PlanArg = Annotated[Path, typer.Argument(help="the PoC plan (YAML)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the result as JSON")]


def print_state(state: dict[str, Any]) -> None:
    """The stage table (done / due / blocked with why), the window's weeks and gaps, failed
    gates and the next scheduled runs, as plain text (no markup: reasons quote names)."""
    from flows.cli import out  # lazily: flows.cli imports us

    out.print("stages:", highlight=False, markup=False)
    for line in state_lines(state):
        out.print(line, highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Add `poc` to the `ckpt-poc` app."""

    @app.command("poc")
    def poc_cmd(
        plan: PlanArg,
        until: Annotated[
            str | None,
            typer.Option(help=f"stop after this stage: {', '.join(STAGES)}"),
        ] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Run the PoC's stages in order from where it stands (done ones skipped); stops at
        a refused gate (exit 1, its message), after --until, or when the window starts."""
        from flows.cli import _fail, _flows_ready, out

        _flows_ready()
        from flows.poc import poc

        try:
            result = poc(str(plan), until)
        except CkptPocError as exc:
            _fail(exc)
        if as_json:
            sys.stdout.write(json.dumps(result, default=str) + "\n")
            return
        out.print(
            f"ran: {', '.join(result['ran'])}; skipped (done): "
            f"{', '.join(result['skipped']) or 'none'}; stopped {result['stopped']}",
            highlight=False,
            markup=False,
        )
        print_state(result["state"])


if __name__ == "__main__":
    _app = typer.Typer(add_completion=False)
    register(_app)

    @_app.callback()
    def _main() -> None:
        """ckpt-poc poc, on its own (until flows/cli.py registers it)."""

    _app()
