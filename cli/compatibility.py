"""`ckpt-poc sweep PLAN [--json]`: the range of applications, each workload of the plan
through CRIU checkpoint → kill → restore cycles (the compatibility stage)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.common import NoWaitOpt, PlanArg, command_body, out, write_json

SweepJsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help='print exactly {"workloads": [{name, cycles, restored, success_rate, ci, '
        "fidelity, failures, freeze_s_median, image_bytes_median}]}",
    ),
]


def sweep_cmd(
    plan: PlanArg,
    cycles: Annotated[
        int | None,
        typer.Option(min=1, max=1000, help="cycles per workload (default: the plan's)"),
    ] = None,
    workload: Annotated[
        list[str] | None,
        typer.Option("--workload", help="only this workload (repeat for more)"),
    ] = None,
    timeout_s: Annotated[
        float | None,
        typer.Option(help="longest one run of a workload may take (default: the plan's)"),
    ] = None,
    as_json: SweepJsonOpt = False,
    no_wait: NoWaitOpt = False,
) -> None:
    """Each workload: an uninterrupted reference run, then N checkpoint → kill → restore
    cycles (at its own checkpoint, during I/O, steady) and the fidelity check; restores
    k/n with a Wilson 95 % CI, CRIU's own cause for each failure. Exit 0 whatever the
    workloads did: a workload CRIU cannot checkpoint is a result."""
    with command_body():
        from flows.compatibility import compatibility
        from tasks.experiments.compatibility_result import result_lines

        result = compatibility(
            str(plan), cycles, timeout_s, workload or None, wait_for_nodes=not no_wait
        )
    if as_json:
        write_json(result.sweep_json())
        return
    for line in result_lines(result):
        out.print(line, highlight=False, markup=False)
    out.print(f"matrix: {result.run_dir}/compatibility.md", highlight=False)
    out.print(f"rows written: {', '.join(result.files)}", highlight=False)
