"""`ckpt-poc record`: the decision record, HTML and PDF."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from tasks.data.errors import CkptPocError

PlanArg = Annotated[Path, typer.Argument(help="the PoC plan (YAML)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the result as JSON")]
JSON_KEYS = ("html", "pdf", "verdicts", "gates", "exit")


def record_cmd(plan: PlanArg, as_json: JsonOpt = False) -> None:
    """Write the decision record (HTML and PDF) from the committed datasets."""
    # Lazily: flows.cli registers this command, so importing it at the top is circular.
    from flows.cli import _fail, _flows_ready, out

    _flows_ready()
    from flows.record import record

    try:
        result = record(str(plan))
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps({k: result[k] for k in JSON_KEYS}) + "\n")
        return
    for measure, verdict in result["verdicts"].items():
        out.print(f"{measure}: {verdict}", highlight=False)
    failed = [g for g, s in result["gates"].items() if not s["passed"]]
    out.print(f"gates failed: {', '.join(failed) or 'none'}; way out: {result['exit']}")
    out.print(f"HTML {result['html']}\nPDF  {result['pdf']}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add `record` to the ckpt-poc app (flows/cli.py calls this)."""
    app.command("record")(record_cmd)
