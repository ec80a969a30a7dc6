"""`ckpt-poc samples import PLAN FILE`: the sample history a site already has."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import PlanArg, SummaryJsonOpt, command_body, out, write_json


def import_cmd(
    plan: PlanArg,
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
    as_json: SummaryJsonOpt = False,
) -> None:
    """Import a CSV export of samples → `samples`, `sample_gaps` and `quarantine`."""
    with command_body():
        from flows.samples_import import samples_import, summary_lines

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
    if as_json:
        write_json(result.summary)
        return
    out.print(f"[bold]Samples imported from {file}[/]", highlight=False)
    for line in summary_lines(result):
        out.print(f"  {line}", highlight=False, markup=False)
