"""`ckpt-poc poc PLAN [--until STAGE]` and `ckpt-poc demo`: the whole PoC from where it
stands, and the embedded default end to end."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from cli.common import JsonOpt, PlanArg, command_body, err, out, write_json
from cli.install import run_uninstall
from cli.status import print_state
from tasks.baseline.accounting import KEY_ENV
from tasks.poc.stages import STAGE_NAMES

DEMO_PLAN = Path(__file__).resolve().parent.parent / "plans" / "demo.yaml"


def poc_cmd(
    plan: PlanArg,
    until: Annotated[
        str | None,
        typer.Option(help=f"stop after this stage: {', '.join(STAGE_NAMES)}"),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the PoC's stages in order from where it stands (done ones skipped); stops at
    a refused gate (exit 1, its message), after --until, or when the window starts."""
    with command_body():
        from flows.poc import poc

        result = poc(str(plan), until)
    if as_json:
        write_json(result, default=str)
        return
    out.print(
        f"ran: {', '.join(result['ran'])}; skipped (done): "
        f"{', '.join(result['skipped']) or 'none'}; stopped {result['stopped']}",
        highlight=False,
        markup=False,
    )
    print_state(result["state"])


def demo_cmd(
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
    # An install is never left behind by a failed demo.
    with command_body(on_error=lambda: _demo_undo_install(plan)):
        from flows.poc import poc

        result = poc(str(plan), short_window=True)
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
    from tasks.data.plan import load_plan
    from tasks.poc.progress import poc_state

    loaded = load_plan(plan, check_cluster=False)
    stages = poc_state(loaded, loaded.data_dir, scheduled=False)["stages"]
    if stages["install"]["status"] == "done" and stages["uninstall"]["status"] != "done":
        err.print("[yellow]a stage failed after the install: uninstalling[/]")
        _print_demo_verdict(run_uninstall(plan))


def _print_demo_verdict(result: dict[str, Any]) -> None:
    verdict = result.get("verdict", "not reached")
    colour = "green" if verdict == "clean" else "bold red"
    out.rule(Text("the way out: before_install -> after_uninstall", style=colour))
    for x in result.get("leftovers") or []:
        out.print(f"  leftover: {x['node']} {x['kind']} {x['key']} ({x['change']})", markup=False)
    out.print(Text(f"exit verdict: {verdict}", style=colour), highlight=False)
