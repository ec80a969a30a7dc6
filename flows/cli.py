"""`ckpt-poc`: every command runs the matching Prefect flow.

With PREFECT_API_URL set, runs show in that server's UI; otherwise Prefect starts its
ephemeral local server for the run.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Annotated

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from flows.cli_samples import samples_app
from tasks.baseline.accounting import KEY_ENV
from tasks.data.errors import CkptPocError, PlanError

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
plan_app = typer.Typer(no_args_is_help=True, help="Check PoC plans.")
app.add_typer(plan_app, name="plan")
app.add_typer(samples_app, name="samples")
# Errors are never wrapped (a log or a CI page has its own width); tables still fit.
err = Console(stderr=True, soft_wrap=True)
# Piped into a log, rich would wrap tables at 80 columns; a log has room for their width.
out = Console() if Console().is_terminal else Console(width=160)

DEMO_PLAN = Path(__file__).resolve().parent.parent / "plans" / "demo.yaml"
PlanArg = Annotated[Path, typer.Argument(help="the PoC plan (YAML)")]
NoWaitOpt = Annotated[
    bool,
    typer.Option(
        "--no-wait",
        help="refuse at once when another experiment holds the plan's nodes (default: wait)",
    ),
]


class _TerminalNoise(logging.Filter):
    """On the terminal, a failed run's error is printed once, by the command; Prefect's own
    "Finished in state Failed(...)" and exception lines still reach the UI (API handler).
    A "View at" link to the command's own server is dropped too: it has no UI, and is gone
    when the command ends."""

    def __init__(self, own_server: bool) -> None:
        super().__init__()
        self.own_server = own_server

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.INFO or not record.name.startswith("prefect."):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        message = record.getMessage()
        return not (
            isinstance(exc, CkptPocError)
            or message.startswith("Finished in state Failed(")
            or message.startswith(("Task run failed with exception:", "Encountered exception"))
            or (self.own_server and message.startswith("View at "))
        )


def _flows_ready() -> None:
    """Before a command's first flow: a Prefect API (PREFECT_API_URL, else the command's
    own server, flows/server.py) and a terminal that shows each error once."""
    from flows.server import ensure_prefect_api, server_pid

    try:
        ensure_prefect_api()
    except CkptPocError as exc:
        _fail(exc)
    from prefect.logging.handlers import PrefectConsoleHandler

    # Prefect builds its console handlers anew whenever it reconfigures logging, so the
    # filter goes on the class (in this CLI process only), not on one handler object.
    if not getattr(PrefectConsoleHandler, "_ckpt_poc_quiet", False):
        quiet = _TerminalNoise(own_server=server_pid() is not None)
        shown = PrefectConsoleHandler.filter
        PrefectConsoleHandler.filter = lambda self, record: bool(  # type: ignore[method-assign]
            shown(self, record) and quiet.filter(record)
        )
        PrefectConsoleHandler._ckpt_poc_quiet = True  # type: ignore[attr-defined]


def _fail(exc: CkptPocError) -> None:
    if isinstance(exc, PlanError):
        err.print(f"[bold red]plan {exc.path} has {len(exc.problems)} problem(s):[/]")
        for problem in exc.problems:
            err.print(f"  {problem}", markup=False, highlight=False)
    else:
        # The message is text, not markup: "[fault,arm]" in a gate's name must survive.
        err.print(Text.assemble(("error: ", "bold red"), str(exc)), highlight=False)
    raise typer.Exit(1)


@plan_app.command("check")
def plan_check_cmd(plan: PlanArg) -> None:
    """Validate a plan: exit 0, or 1 listing every problem as file:line: field: message."""
    if os.environ.get("PREFECT_API_URL"):
        from flows.plan_check import plan_check  # a real server: the check shows in its UI

        try:
            info = plan_check(str(plan))
        except CkptPocError as exc:
            _fail(exc)
    else:  # reading a file needs no Prefect server start-up: answer at once
        from tasks.data.plan import load_plan

        try:
            loaded = load_plan(plan)
        except CkptPocError as exc:
            _fail(exc)
        info = {
            "poc": loaded.poc,
            "cluster": loaded.cluster.kind,
            "checkpointer": loaded.checkpointer.kind,
            "warnings": list(loaded.check_warnings),
        }
    out.print(
        f"[green]plan {plan} is valid[/]: poc={info['poc']} cluster={info['cluster']} "
        f"checkpointer={info['checkpointer']}"
    )
    # A skipped cluster check is logged by tasks.data.plan as it happens (stderr).


@app.command()
def baseline(
    plan: PlanArg,
    sacct_file: Annotated[
        Path | None, typer.Option(help="a sacct -P dump (with or without header) or --json")
    ] = None,
    live: Annotated[bool, typer.Option(help="query sacct on this host")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
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
) -> None:
    """Baseline exposure from accounting history → jobs, exposure, quarantine datasets."""
    if live and sacct_file:
        err.print("[red]give --live or --sacct-file, not both[/]")
        raise typer.Exit(2)
    _run_baseline(plan, sacct_file, live, as_json, dask, delimiter, sacct_format)


def _run_baseline(
    plan: Path,
    sacct_file: Path | None,
    live: bool,
    as_json: bool,
    dask: bool | None,
    delimiter: str | None,
    sacct_format: str | None = None,
) -> None:
    _flows_ready()
    from flows.baseline import baseline as baseline_flow
    from tasks.experiments.report import candidates_table, exposure_table

    try:
        result = baseline_flow(
            str(plan),
            str(sacct_file) if sacct_file else None,
            live,
            dask,
            delimiter,
            sacct_format,
        )
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(result.summary) + "\n")
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


@app.command("side-by-side")
def side_by_side_cmd(
    plan: PlanArg,
    timeout_s: Annotated[float, typer.Option(help="stop both copies after this long")] = 300,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    no_wait: NoWaitOpt = False,
) -> None:
    """Run the plan's workload as a managed (CRIU) and an unmanaged copy, one clock."""
    _flows_ready()
    from flows.side_by_side import side_by_side

    try:
        summary = side_by_side(str(plan), timeout_s, wait_for_nodes=not no_wait)
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(summary) + "\n")
        return
    table = Table(title="Managed and unmanaged copies, side by side")
    for col in ("arm", "slot", "pid", "last step", "exited"):
        table.add_column(col)
    for arm, r in summary["arms"].items():
        table.add_row(arm, r["slot"], str(r["pid"]), str(r["last_step"]), str(r["exited"]))
    dump_s, image = summary["median_dump_s"], summary["median_image_bytes"]
    table.caption = (
        f"CRIU checkpoints {summary['checkpoints']}"
        + (f" (median dump {dump_s:.3f} s, image {image / 1e6:.1f} MB)" if dump_s else "")
        + f" · skipped ticks {summary['skipped_ticks']} · events {summary['events']}"
        + f" · run folder {summary['run_dir']}"
    )
    out.print(table)


@app.command()
def recovery(
    plan: PlanArg,
    timeout_s: Annotated[
        float, typer.Option(help="longest wait for any one step of a trial before it fails")
    ] = 120,
    fault_step: Annotated[
        int | None, typer.Option(help="inject each fault once the copy reports this step")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    no_wait: NoWaitOpt = False,
) -> None:
    """Inject the plan's faults into the unmanaged, then the managed copy; recover both;
    every trial → `trials`, gated, summarised per fault with the plan's verdicts."""
    _flows_ready()
    from flows.recovery import recovery as recovery_flow
    from tasks.experiments.report import recovery_table, recovery_verdicts

    try:
        result = recovery_flow(str(plan), timeout_s, fault_step, wait_for_nodes=not no_wait)
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    for line in recovery_verdicts(result):
        out.print(line, highlight=False, markup=False)
    out.print(recovery_table(result))
    _print_failures(result["failures"])
    out.print(f"trials written: {', '.join(result['trials_files'])}", highlight=False)


@app.command()
def overhead(
    plan: PlanArg,
    pairs: Annotated[
        int | None, typer.Option(help="A/B pairs per variant (default: the plan's repeats)")
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="longest one run may take")] = 600,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    no_wait: NoWaitOpt = False,
) -> None:
    """Steady-state overhead (interleaved A B B A runs, no checkpoint in the timed span) and,
    apart, the cost of checkpointing at the plan's interval; paired statistics, verdict."""
    _flows_ready()
    from flows.overhead import overhead as overhead_flow
    from tasks.experiments.report import checkpoint_lines, overhead_lines

    try:
        result = overhead_flow(str(plan), pairs, timeout_s, wait_for_nodes=not no_wait)
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    _print_lines("Steady-state overhead", overhead_lines(result), result)
    _print_lines("Checkpoints taken", checkpoint_lines(result["checkpoints"]), None)


@app.command("cold-start")
def cold_start_cmd(
    plan: PlanArg,
    repeats: Annotated[
        int | None, typer.Option(help="native/restore pairs (default: the plan's repeats)")
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="longest wait for ready")] = 120,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    no_wait: NoWaitOpt = False,
) -> None:
    """Native launch → ready against restore → ready of the same initialised copy; the
    speed-up with its CI, restore GB/s against checkpoint bytes (table and PNG)."""
    _flows_ready()
    from flows.cold_start import cold_start as cold_start_flow
    from tasks.experiments.report import cold_start_lines

    try:
        result = cold_start_flow(str(plan), repeats, timeout_s, wait_for_nodes=not no_wait)
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    _print_lines("Cold start", cold_start_lines(result), result)
    out.print(f"plot: {result['plot']}", highlight=False)


@app.command("sample")
def sample_cmd(
    plan: PlanArg,
    span_s: Annotated[
        float | None, typer.Option("--span-s", help="seconds to sample (default: the plan's)")
    ] = None,
    interval_s: Annotated[
        float | None,
        typer.Option("--interval-s", help="seconds between reads (default: the plan's)"),
    ] = None,
    node: Annotated[
        str | None, typer.Option(help="one of the plan's nodes (default: all it can read)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """One sampler span on each test node (the plan's window.sampler); gaps since the last
    span become rows of `sample_gaps`."""
    _flows_ready()
    from flows.sample_window import sample_window

    try:
        result = sample_window(str(plan), span_s, interval_s, node)
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    out.print(
        f"[bold]sampled[/] {', '.join(result['nodes'])}: {result['samples']} rows, "
        f"{result['gaps']} gap row(s), {result['reads']} reads from {result['from']} to "
        f"{result['to']}",
        highlight=False,
    )
    if result["salvaged_runs"]:
        out.print(f"kept what killed sampler runs flushed: {', '.join(result['salvaged_runs'])}")


WeekOpt = Annotated[
    str | None, typer.Option("--week", help="ISO week YYYY-Www (default: the current week)")
]


@app.command("utilization")
def utilization_cmd(
    plan: PlanArg,
    week: WeekOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the rows as JSON")] = False,
) -> None:
    """Job-level utilization per arm, week and workload: allocated GPU-hours split into
    delivered, lost and idle; goodput; the samples' busy fraction."""
    _flows_ready()
    from flows.utilization import GPU_HOUR_COLUMNS, utilization

    try:
        result = utilization(str(plan), week)
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")
        return
    table = Table(title="Job-level utilization (GPU-hours)")
    for column in (
        "week",
        "arm",
        "allocated",
        "delivered",
        "lost",
        "idle ckpt",
        "idle recovery",
        "idle other",
        "goodput",
        "busy",
    ):
        table.add_column(column, justify="left" if column in ("week", "arm") else "right")
    for row in result["rows"]:
        table.add_row(
            row["week"],
            row["arm"],
            *(f"{row[c]:.4g}" for c in GPU_HOUR_COLUMNS),
            "—" if row.get("goodput") is None else f"{row['goodput']:.3f}",
            "—"
            if row.get("busy_fraction") is None
            else escape(f"{row['busy_fraction']:.3f} ({row['busy_metric']})"),
        )
    out.print(table if result["rows"] else "no allocations in the window yet")


@app.command("report")
def report_cmd(
    plan: PlanArg,
    week: WeekOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    dask_scheduler: Annotated[
        str | None,
        typer.Option(help="aggregate the samples on this Dask scheduler (tcp://host:port)"),
    ] = None,
) -> None:
    """The weekly report (the weekly_report flow): one row per measure and arm, measured or
    extrapolated, against the plan's thresholds; change points, gaps and the HTML page."""
    _flows_ready()
    from flows.weekly_report import weekly_report

    try:
        result = weekly_report(str(plan), week, dask_scheduler)
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        keys = ("week", "rows", "change_points", "gaps", "html")
        sys.stdout.write(json.dumps({k: result[k] for k in keys}, default=str) + "\n")
        return
    _print_weekly(result)


def _print_weekly(result: dict) -> None:
    table = Table(title=f"Weekly report {result['week']}")
    for column in ("measure", "arm", "n", "value", "95% CI", "basis", "threshold", "verdict"):
        table.add_column(column, justify="right" if column in ("n", "value") else "left")
    for row in result["rows"]:
        value = "—" if row["value"] is None else f"{row['value']:.4g}"
        ci = (
            "—"
            if row["ci_low"] is None or row["ci_high"] is None
            else f"{row['ci_low']:.4g} … {row['ci_high']:.4g}"
        )
        threshold = "—" if row["threshold"] is None else f"{row['threshold']:.4g}"
        table.add_row(
            row["measure"],
            row["arm"],
            str(row["n"]),
            value,
            ci,
            row["basis"],
            threshold,
            row["verdict"],
        )
    out.print(table)
    for point in result["change_points"]:
        out.print(f"[yellow]change point[/] {point}", highlight=False)
    gaps = result["gaps"]
    if gaps:
        total = sum(float(g["seconds"]) for g in gaps)
        out.print(f"gaps in the samples: {len(gaps)}, {total:.0f} s in all", highlight=False)
        for gap in gaps[:5]:
            what = "/".join(str(g) for g in (gap["entity"], gap["metric"]) if g) or "all"
            out.print(
                f"  {gap['node']} {what} {gap['from']} → {gap['to']} "
                f"({float(gap['seconds']):.0f} s): {gap['reason']}",
                highlight=False,
                markup=False,
            )
        if len(gaps) > 5:
            out.print(f"  … and {len(gaps) - 5} more (in the HTML page)", highlight=False)
    out.print(f"html: {result['html']}", highlight=False)


def _print_failures(failures: list[dict], tail_lines: int = 3) -> None:
    """Each failed trial: its reason, then the last lines of the workload's own log."""
    for failure in failures:
        err.print(
            f"[yellow]failed[/] {failure['trial_id']} / {failure['arm']}: {failure['reason']}",
            highlight=False,
        )
        for line in (failure.get("log_tail") or "").splitlines()[-tail_lines:]:
            err.print(f"    | {line}", highlight=False, markup=False)


def _print_lines(title: str, lines: list[str], result: dict | None) -> None:
    out.print(f"[bold]{title}[/]")
    for line in lines:
        out.print(f"  {line}", highlight=False, markup=False)
    _print_failures((result or {}).get("failures", []))
    if result:
        out.print(f"trials written: {', '.join(result['trials_files'])}", highlight=False)


def _plan_data(plan: Path) -> tuple[Path, str]:
    """The plan's data folder and PoC name, read without starting Prefect (these commands
    only read, and answer in well under two seconds)."""
    from tasks.data.plan import load_plan

    try:
        # No sinfo round trip: these commands only read the data folder.
        loaded = load_plan(plan, check_cluster=False)
    except CkptPocError as exc:
        _fail(exc)
    return Path(loaded.data_dir), loaded.poc


@app.command()
def status(
    plan: PlanArg,
    as_json: Annotated[bool, typer.Option("--json", help="print the status as JSON")] = False,
) -> None:
    """Where the PoC's data stands: committed runs per stage, runs in progress, and what
    killed runs left (never read by any reader; `ckpt-poc clean` deletes it)."""
    from flows.cli_poc import print_state
    from tasks.data.plan import load_plan
    from tasks.data.runs import status_summary
    from tasks.poc.progress import poc_state

    data_dir, poc = _plan_data(plan)
    summary = status_summary(data_dir, poc)
    # Each stage done / due / blocked with why (tasks/poc/progress.py), beside the keys above.
    state = poc_state(load_plan(plan, check_cluster=False), data_dir)
    summary["stages"] = state["stages"]
    summary["progress"] = {k: v for k, v in state.items() if k != "stages"}
    if as_json:
        sys.stdout.write(json.dumps(summary, default=str) + "\n")
        return
    out.print(f"[bold]PoC {poc}[/] — data in {summary['data_dir']}", highlight=False)
    for stage, s in summary["committed"].items():
        out.print(
            f"  {stage}: {s['runs']} committed run(s), {s['refused']} refused by a gate; "
            f"last {s['last_committed_at']}",
            highlight=False,
        )
    if not summary["committed"]:
        out.print("  no committed run yet")
    for r in summary["running"]:
        out.print(f"  running: {r['stage']} run {r['run_id']}", highlight=False)
    for r in summary["uncommitted"]:
        out.print(
            f"  [yellow]uncommitted[/] run {r['run_id']} ({r['stage'] or 'stage unknown'}): "
            f"{len(r['files'])} file(s) no reader takes (the run was killed before it "
            f"committed); delete with `ckpt-poc clean {plan}`",
            highlight=False,
        )
    if summary["stale_tmp_files"]:
        out.print(
            f"  {len(summary['stale_tmp_files'])} temp file(s) of killed writes "
            "(the next run of any stage removes them)"
        )
    print_state(state)


@app.command()
def clean(
    plan: PlanArg,
    dry_run: Annotated[bool, typer.Option(help="list what would be deleted")] = False,
) -> None:
    """Delete what killed runs left: files of runs that never committed and no longer run.
    Never a committed run, never a live one."""
    from tasks.data.runs import clean_uncommitted

    data_dir, poc = _plan_data(plan)
    removed = clean_uncommitted(data_dir, poc, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    for path in removed:
        out.print(f"{verb} {path}", highlight=False)
    out.print(f"{verb} {len(removed)} file(s) of uncommitted runs", highlight=False)


@app.command()
def demo(
    plan: Annotated[
        Path, typer.Option("--plan", help="the plan to run the sequence on")
    ] = DEMO_PLAN,
) -> None:
    """The embedded default, end to end: the whole PoC (flow poc) on plans/demo.yaml with a
    short window. Check the plan, run its baseline over the sample; snapshot the nodes
    (before_install), install CRIU into the demo's own prefix and opt the workload in;
    recovery from real faults, steady-state overhead and cold start on both arms, sampled
    (procfs) meanwhile; the weekly report; uninstall (snapshot after_uninstall, diff: the
    exit verdict); the decision record, whose path is printed last. Exits non-zero only
    when a stage fails: leftovers are the verdict."""
    if not os.environ.get(KEY_ENV):
        # The demo has no site secret: a one-off key keeps identities hidden, at the cost of
        # pseudonyms that do not link across runs. Real runs must set the key.
        os.environ[KEY_ENV] = secrets.token_hex(32)
        err.print(f"[yellow]{KEY_ENV} not set: using a one-off key for this demo run[/]")
    plan = plan.resolve()
    os.chdir(DEMO_PLAN.parent.parent)  # the demo plan's relative paths are repo-relative
    _flows_ready()
    from flows.cli_poc import print_state
    from flows.poc import poc

    try:
        result = poc(str(plan), short_window=True)
    except CkptPocError as exc:
        _demo_undo_install(plan)  # an install is never left behind by a failed demo
        _fail(exc)
    print_state(result["state"])
    exit_result = result.get("exit") or {}
    _print_demo_verdict(exit_result)
    record = result.get("record") or {}
    if record:
        out.rule("the decision record")
        for measure, verdict in (record.get("verdicts") or {}).items():
            out.print(f"  {measure}: {verdict}", highlight=False, markup=False)
        out.print(f"decision record: {record['html']}", highlight=False, markup=False)
        out.print(f"                 {record['pdf']}", highlight=False, markup=False)


def _demo_undo_install(plan: Path) -> None:
    """After a failed stage: uninstall if the demo installed and has not uninstalled yet."""
    from flows.cli_install import run_uninstall
    from tasks.data.plan import load_plan
    from tasks.poc.progress import poc_state

    loaded = load_plan(plan, check_cluster=False)
    stages = poc_state(loaded, loaded.data_dir, scheduled=False)["stages"]
    if stages["install"]["status"] == "done" and stages["uninstall"]["status"] != "done":
        err.print("[yellow]a stage failed after the install: uninstalling[/]")
        _print_demo_verdict(run_uninstall(plan))


def _print_demo_verdict(result: dict) -> None:
    verdict = result.get("verdict", "not reached")
    colour = "green" if verdict == "clean" else "bold red"
    out.rule(Text("the way out: before_install -> after_uninstall", style=colour))
    for x in result.get("leftovers") or []:
        out.print(f"  leftover: {x['node']} {x['kind']} {x['key']} ({x['change']})", markup=False)
    out.print(Text(f"exit verdict: {verdict}", style=colour), highlight=False)


def _register_stage_commands() -> None:
    """Commands defined beside their flows (snapshot, exit-diff, install, opt-in, uninstall,
    poc, record)."""
    from flows.cli_exit import register as register_exit
    from flows.cli_install import register as register_install
    from flows.cli_poc import register as register_poc
    from flows.cli_record import register as register_record

    register_exit(app)
    register_install(app)
    register_poc(app)
    register_record(app)


_register_stage_commands()

if __name__ == "__main__":
    app()
