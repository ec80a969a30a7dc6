"""`ckpt-poc samples …`: the sample history a site already has."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from tasks.data.errors import CkptPocError

samples_app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Sample history a site already has."
)


@samples_app.callback()
def _samples() -> None:
    """Sample history a site already has."""
    # A callback keeps `import` a subcommand when this app runs alone (python -m).


@samples_app.command("import")
def import_cmd(
    plan: Annotated[Path, typer.Argument(help="the PoC plan (YAML)")],
    file: Annotated[Path, typer.Argument(help="the CSV export: a header, one sample a line")],
    time_column: Annotated[
        str, typer.Option(help="epoch seconds or ISO 8601 (no zone: read as UTC)")
    ],
    value_column: Annotated[str, typer.Option(help="the sample's value")],
    entity_column: Annotated[str, typer.Option(help="whose it is: a GPU, pod or container")],
    metric: Annotated[
        str | None, typer.Option(help="the metric's name (default: the value column's)")
    ] = None,
    gap_factor: Annotated[
        float, typer.Option(help="a spacing over this × the entity's interval is a gap")
    ] = 5.0,
    node: Annotated[
        str | None, typer.Option(help="one of the plan's cluster.nodes (default: its first)")
    ] = None,
    unit: Annotated[str, typer.Option(help="the value's unit (percent, fraction, …)")] = "percent",
    device: Annotated[str, typer.Option(help="gpu, cpu or unknown")] = "unknown",
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Import a CSV export of samples → `samples`, `sample_gaps` and `quarantine`."""
    # Lazily: flows.cli registers this app, so importing it at the top would be circular.
    from flows.cli import _fail, _flows_ready, out

    _flows_ready()
    from flows.samples_import import samples_import, summary_lines

    try:
        result = samples_import(
            str(plan),
            str(file),
            time_column,
            value_column,
            entity_column,
            metric,
            gap_factor,
            node,
            unit,
            device,
        )
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(result.summary) + "\n")
        return
    out.print(f"[bold]Samples imported from {file}[/]", highlight=False)
    for line in summary_lines(result):
        out.print(f"  {line}", highlight=False, markup=False)


if __name__ == "__main__":
    samples_app()
