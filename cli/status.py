"""`ckpt-poc status | clean PLAN`: where the PoC's data stands, and deleting what killed runs
left. Both only read the plan and the data folder: they never load Prefect."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import PlanArg, StatusJsonOpt, command_body, out, write_json
from tasks.poc.progress import state_lines


def print_state(state: dict[str, Any]) -> None:
    """The stage table (done / due / blocked with why), the window's weeks and gaps, failed
    gates and the next scheduled runs, as plain text (no markup: reasons quote names)."""
    out.print("stages:", highlight=False, markup=False)
    for line in state_lines(state):
        out.print(line, highlight=False, markup=False)


def _plan_data(plan: Path) -> tuple[Path, str]:
    """The plan's data folder and PoC name, read without starting Prefect (these commands
    only read, and answer in well under two seconds)."""
    from tasks.data.plan import load_plan

    with command_body(prefect=False):
        # No sinfo round trip: these commands only read the data folder.
        loaded = load_plan(plan, check_cluster=False)
    return Path(loaded.data_dir), loaded.poc


def status_cmd(plan: PlanArg, as_json: StatusJsonOpt = False) -> None:
    """Where the PoC's data stands: committed runs per stage, runs in progress, and what
    killed runs left (never read by any reader; `ckpt-poc clean` deletes it)."""
    from tasks.data.plan import load_plan
    from tasks.data.runs import status_summary
    from tasks.poc.progress import poc_state

    data_dir, poc = _plan_data(plan)
    summary = status_summary(data_dir, poc).to_json()
    # Each stage done / due / blocked with why (tasks/poc/progress.py), beside the keys above.
    state = poc_state(load_plan(plan, check_cluster=False), data_dir).to_json()
    summary["stages"] = state["stages"]
    summary["progress"] = {k: v for k, v in state.items() if k != "stages"}
    if as_json:
        write_json(summary, default=str)
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


def clean_cmd(
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
