"""`ckpt-poc baseline PLAN`: baseline exposure from the site's accounting history."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import PlanArg, SummaryJsonOpt, command_body, err, out, write_json


def baseline_cmd(
    plan: PlanArg,
    sacct_file: Annotated[
        Path | None, typer.Option(help="a sacct -P dump (with or without header) or --json")
    ] = None,
    live: Annotated[bool, typer.Option(help="query sacct on this host")] = False,
    as_json: SummaryJsonOpt = False,
    dask: Annotated[
        bool | None, typer.Option("--dask/--no-dask", help="force the out-of-core path")
    ] = None,
    delimiter: Annotated[
        str | None,
        typer.Option(help="the dump's delimiter, if its header does not show it or not '|'"),
    ] = None,
    sacct_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            metavar="FIELDS",
            help="the fields a header-less dump was taken with, as sacct's --format "
            "(comma-separated: JobID,State,Elapsed,AllocTRES,…)",
        ),
    ] = None,
    dumped_on: Annotated[
        str | None,
        typer.Option(
            metavar="YYYY-MM-DD",
            help="the day (UTC) sacct wrote a dump with SLURM_TIME_FORMAT=relative times; "
            "by default the file's mtime",
        ),
    ] = None,
) -> None:
    """Baseline exposure from accounting history → jobs, exposure, quarantine datasets."""
    if live and sacct_file:
        err.print("[red]give --live or --sacct-file, not both[/]")
        raise typer.Exit(2)
    with command_body():
        from flows.baseline import baseline
        from tasks.experiments.report import candidates_table, exposure_table

        result = baseline(
            str(plan),
            str(sacct_file) if sacct_file else None,
            live,
            dask,
            delimiter,
            sacct_format,
            dumped_on,
        )
    if as_json:
        write_json(result.summary.to_json())
        return
    out.print(exposure_table(result))
    out.print(candidates_table(result))
    written = {name: len(files) for name, files in result.written.items() if files}
    first = next(iter(f for files in result.written.values() for f in files), None)
    out.print(f"pseudonymisation key from {result.key_origin}")
    out.print(
        f"files written under {first.parents[2] if first else 'nowhere'}: {written}",
        highlight=False,
    )
