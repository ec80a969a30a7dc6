"""`ckpt-poc side-by-side | recovery | overhead | cold-start PLAN`: the experiments that run
both arms (managed and unmanaged) of the plan's workload."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from cli.common import (
    JsonOpt,
    NoWaitOpt,
    PlanArg,
    SummaryJsonOpt,
    command_body,
    err,
    out,
    write_json,
)

if TYPE_CHECKING:
    from tasks.experiments.results import ColdStartResult, Failure, OverheadResult


def side_by_side_cmd(
    plan: PlanArg,
    timeout_s: Annotated[float, typer.Option(help="stop both copies after this long")] = 300,
    as_json: SummaryJsonOpt = False,
    no_wait: NoWaitOpt = False,
) -> None:
    """Run the plan's workload as a managed (CRIU) and an unmanaged copy, one clock."""
    with command_body():
        from flows.side_by_side import side_by_side

        summary = side_by_side(str(plan), timeout_s, wait_for_nodes=not no_wait)
    if as_json:
        write_json(summary.to_json())
        return
    table = Table(title="Managed and unmanaged copies, side by side")
    for col in ("arm", "slot", "pid", "last step", "exited"):
        table.add_column(col)
    for arm, r in summary.arms.items():
        table.add_row(arm, r.slot, str(r.pid), str(r.last_step), str(r.exited))
    dump_s, image = summary.median_dump_s, summary.median_image_bytes
    table.caption = (
        f"CRIU checkpoints {summary.checkpoints}"
        + (f" (median dump {dump_s:.3f} s, image {image / 1e6:.1f} MB)" if dump_s else "")
        + f" · skipped ticks {summary.skipped_ticks} · events {summary.events}"
        + f" · run folder {summary.run_dir}"
    )
    out.print(table)


def recovery_cmd(
    plan: PlanArg,
    timeout_s: Annotated[
        float, typer.Option(help="longest wait for any one step of a trial before it fails")
    ] = 120,
    fault_step: Annotated[
        int | None, typer.Option(help="inject each fault once the copy reports this step")
    ] = None,
    as_json: SummaryJsonOpt = False,
    no_wait: NoWaitOpt = False,
) -> None:
    """Inject the plan's faults into the unmanaged, then the managed copy; recover both;
    every trial → `trials`, gated, summarised per fault with the plan's verdicts."""
    with command_body():
        from flows.recovery import recovery
        from tasks.experiments.report import recovery_table, recovery_verdicts

        result = recovery(str(plan), timeout_s, fault_step, wait_for_nodes=not no_wait)
    if as_json:
        write_json(result.to_json())
        return
    for line in recovery_verdicts(result):
        out.print(line, highlight=False, markup=False)
    out.print(recovery_table(result))
    _print_failures(result.failures)
    out.print(f"trials written: {', '.join(result.trials_files)}", highlight=False)


def overhead_cmd(
    plan: PlanArg,
    pairs: Annotated[
        int | None, typer.Option(help="A/B pairs per variant (default: the plan's repeats)")
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="longest one run may take")] = 600,
    as_json: JsonOpt = False,
    no_wait: NoWaitOpt = False,
) -> None:
    """Steady-state overhead (interleaved A B B A runs, no checkpoint in the timed span) and,
    apart, the cost of checkpointing at the plan's interval; paired statistics, verdict."""
    with command_body():
        from flows.overhead import overhead
        from tasks.experiments.report import checkpoint_lines, overhead_lines

        result = overhead(str(plan), pairs, timeout_s, wait_for_nodes=not no_wait)
    if as_json:
        write_json(result.to_json())
        return
    _print_lines("Steady-state overhead", overhead_lines(result), result)
    _print_lines("Checkpoints taken", checkpoint_lines(result.checkpoints), None)


def cold_start_cmd(
    plan: PlanArg,
    repeats: Annotated[
        int | None, typer.Option(help="native/restore pairs (default: the plan's repeats)")
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="longest wait for ready")] = 120,
    as_json: JsonOpt = False,
    no_wait: NoWaitOpt = False,
) -> None:
    """Native launch → ready against restore → ready of the same initialised copy; the
    speed-up with its CI, restore GB/s against checkpoint bytes (table and PNG)."""
    with command_body():
        from flows.cold_start import cold_start
        from tasks.experiments.report_cold_start import cold_start_lines

        result = cold_start(str(plan), repeats, timeout_s, wait_for_nodes=not no_wait)
    if as_json:
        write_json(result.to_json())
        return
    _print_lines("Cold start", cold_start_lines(result), result)
    out.print(f"plot: {result.plot}", highlight=False)


def _print_failures(failures: Sequence[Failure], tail_lines: int = 3) -> None:
    """Each failed trial: its reason, then the last lines of the workload's own log."""
    for failure in failures:
        err.print(
            f"[yellow]failed[/] {failure.trial_id} / {failure.arm}: {failure.reason}",
            highlight=False,
        )
        for line in (failure.log_tail or "").splitlines()[-tail_lines:]:
            err.print(f"    | {line}", highlight=False, markup=False)


def _print_lines(
    title: str, lines: list[str], result: OverheadResult | ColdStartResult | None
) -> None:
    out.print(f"[bold]{title}[/]")
    for line in lines:
        out.print(f"  {line}", highlight=False, markup=False)
    if result is not None:
        _print_failures(result.failures)
        out.print(f"trials written: {', '.join(result.trials_files)}", highlight=False)
