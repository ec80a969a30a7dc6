"""`ckpt-poc poc PLAN [--until STAGE]` and `ckpt-poc demo`: the whole PoC from where it
stands, and the embedded default end to end."""

from __future__ import annotations

import datetime as dt
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from cli.common import JsonOpt, PlanArg, command_body, err, out, write_json
from cli.install import run_uninstall
from cli.status import print_state
from flows.results import ExitVerdict
from tasks.baseline.accounting import KEY_ENV
from tasks.data.errors import CkptPocError
from tasks.data.settings import settings
from tasks.poc.stages import STAGE_NAMES

if TYPE_CHECKING:
    from flows.results import UninstallRun
    from tasks.data.plan import Plan
    from tasks.poc.record.build import DecisionRecord

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
        write_json(result.to_json(), default=str)
        return
    out.print(
        f"ran: {', '.join(result.ran)}; skipped (done): "
        f"{', '.join(result.skipped) or 'none'}; stopped {result.stopped}",
        highlight=False,
        markup=False,
    )
    print_state(result.state.to_json())


def demo_cmd(
    plan: Annotated[
        Path, typer.Option("--plan", help="the plan to run the sequence on")
    ] = DEMO_PLAN,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="start a new PoC folder (<data_dir>/<poc>-<UTC time>/, from a copy of the "
            "plan with only its poc changed) and run the demo there; the old one is kept",
        ),
    ] = False,
) -> None:
    """The embedded default, end to end: the whole PoC (flow poc) on plans/demo.yaml with a
    short window. Check the plan, run its baseline over the sample; snapshot the nodes
    (before_install), install CRIU into the demo's own prefix and opt the workload in;
    recovery from real faults, steady-state overhead and cold start on both arms, sampled
    (procfs) meanwhile; the weekly report; uninstall (snapshot after_uninstall, diff: the
    exit verdict); the decision record, whose path is printed last. Exits non-zero only
    when a stage fails: leftovers are the verdict. Run again on the same data it re-runs
    nothing and prints what the PoC already has; --fresh runs it afresh in a new folder."""
    if settings().pseudonym_key is None:
        # The demo has no site secret: a one-off key keeps identities hidden, at the cost of
        # pseudonyms that do not link across runs. Real runs must set the key.
        os.environ[KEY_ENV] = secrets.token_hex(32)
        err.print(f"[yellow]{KEY_ENV} not set: using a one-off key for this demo run[/]")
    plan = plan.resolve()
    os.chdir(DEMO_PLAN.parent.parent)  # the demo plan's relative paths are repo-relative
    if fresh:
        with command_body(prefect=False):
            plan = fresh_plan(plan)
        err.print(f"--fresh: a new PoC folder, its plan {plan}", highlight=False, markup=False)
    # An install is never left behind by a failed demo.
    with command_body(on_error=lambda: _demo_undo_install(plan)):
        from flows.poc import poc

        result = poc(str(plan), short_window=True)
    from tasks.data.plan import load_plan

    loaded = load_plan(plan, check_cluster=False)
    shown = result.to_json()
    print_state(shown["state"])
    print_demo_summary(demo_summary(shown, loaded, plan))


# --- demo --fresh: a new PoC folder ---------------------------------------------------------

# The plan's own top-level `poc: NAME` line (a comment after it allowed).
_POC_LINE = re.compile(r"^poc:[ \t]*[^\s#]+[ \t]*(?:#.*)?$", re.MULTILINE)
FRESH_PLAN = "plan.yaml"


def fresh_plan(plan: Path, now: dt.datetime | None = None) -> Path:
    """A new PoC folder for `demo --fresh`: ``<data_dir>/<poc>-<UTC time>/plan.yaml``, the
    plan with only its top-level ``poc:`` changed. Every stage (and the sampler) loads that
    copy, so all use the new poc; the plan file and the old PoC folder are never touched."""
    from tasks.data.plan import load_plan
    from tasks.data.render import write_atomically

    loaded = load_plan(plan, check_cluster=False)
    stamp = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    name = f"{loaded.poc[:46]}-{stamp:%Y%m%dT%H%M%SZ}"  # a SafeName: 63 characters at most
    text = plan.read_text(encoding="utf-8")
    lines = list(_POC_LINE.finditer(text))
    if len(lines) != 1:
        raise CkptPocError(
            f"{plan}: poc: --fresh needs the plan's one top-level `poc: NAME` line to "
            f"derive the new PoC from; found {len(lines)}"
        )
    folder = Path(loaded.data_dir) / name
    try:
        folder.mkdir(parents=True, exist_ok=False)
    except FileExistsError as exc:
        raise CkptPocError(f"{folder}: already exists: run --fresh again") from exc
    derived = (
        f"# Derived by `ckpt-poc demo --fresh` from {plan} at {stamp.isoformat()}: only "
        "poc differs.\n" + text[: lines[0].start()] + f"poc: {name}" + text[lines[0].end() :]
    )
    path = write_atomically(folder / FRESH_PLAN, derived.encode("utf-8"))
    if load_plan(path, check_cluster=False).poc != name:  # the copy says what it is for
        raise CkptPocError(f"{path}: poc: the derived plan does not name {name}")
    return path


# --- what the demo prints: what the PoC has, run now or before --------------------------------


@dataclass(frozen=True)
class DemoSummary:
    """What a demo run ends with: the stages it ran and skipped, the exit verdict and the
    record's verdicts and decision, each from this run or, when done before, from the
    committed data."""

    poc: str
    data_dir: str
    plan_path: str
    ran: list[str]  # stages this run ran (plan_check always runs: not counted)
    skipped: list[str]  # done before this run started
    exit: dict[str, Any]  # verdict, leftovers, node_own, source
    record: dict[str, Any]  # verdicts, decision, decision_reason, html, pdf, source


@dataclass(frozen=True, slots=True)
class CommittedExit(ExitVerdict):
    """The exit verdict the committed data holds: 'clean' when every node's newest exit diff
    is, its items (the exit_diff rows of those runs), when and by which runs."""

    diffed_at: str
    runs: tuple[str, ...]


def committed_exit(plan: Plan) -> CommittedExit | None:
    """The exit verdict the committed data holds: each node's newest exit diff
    (exit_verdicts) and its items (exit_diff rows of those runs); None when there is none."""
    from tasks.data.datasets import EXIT_DIFF, EXIT_VERDICTS
    from tasks.data.store import read_dataset

    verdicts = read_dataset(EXIT_VERDICTS, data_dir=plan.data_dir, poc=plan.poc)
    if verdicts.empty:
        return None
    latest = verdicts.sort_values("diffed_at").groupby("node", as_index=False).last()
    runs = sorted({str(r) for r in latest["run_id"]})
    diff = read_dataset(EXIT_DIFF, data_dir=plan.data_dir, poc=plan.poc)
    items = [] if diff.empty else diff[diff["run_id"].astype(str).isin(runs)].to_dict("records")
    # A row's class (attributed diffs): the node's own are listed apart, never leftovers.
    own = [i for i in items if i.get("class") == "node_own"]
    return CommittedExit(
        verdict="clean" if (latest["verdict"] == "clean").all() else "leftovers",
        leftovers=[i for i in items if i.get("class") != "node_own"],
        node_own=own,
        diffed_at=str(latest["diffed_at"].max()),
        runs=tuple(runs),
    )


def committed_record(plan: Plan) -> DecisionRecord:
    """The decision record's summary from the committed data (verdicts, decision), read
    without writing the record again, and where its files are."""
    from tasks.poc.record.build import DecisionRecord, build_document, record_dir

    summary = build_document(plan, plan.data_dir)[1]
    folder = record_dir(plan.data_dir, plan.poc).resolve()
    return DecisionRecord(
        html=str(folder / "decision-record.html"),
        pdf=str(folder / "decision-record.pdf"),
        **summary,
    )


def demo_summary(
    result: dict[str, Any],
    plan: Plan,
    plan_path: Path,
    read_exit: Callable[[Plan], CommittedExit | None] = committed_exit,
    read_record: Callable[[Plan], DecisionRecord] = committed_record,
) -> DemoSummary:
    """The demo's ending from the poc flow's result in its JSON form (what `poc --json`
    prints); what this run did not reach again (a stage done before, so skipped) is read
    from the committed data, never taken as missing."""
    ran = [s for s in result.get("ran", []) if s != "plan_check"]
    stages = (result.get("state") or {}).get("stages") or {}
    exit_result = dict(result.get("exit") or {})
    if exit_result:
        exit_result["source"] = "this run"
    elif stages.get("exit_diff", {}).get("status") == "done":
        seen = read_exit(plan)
        exit_result = {**(seen.to_json() if seen else {}), "source": "committed before this run"}
    record = dict(result.get("record") or {})
    if record:  # built now: the flow passes its decision on
        record = {**record, "source": "this run"}
    elif stages.get("record", {}).get("status") == "done":
        record = {**read_record(plan).to_json(), "source": "committed before this run"}
    return DemoSummary(
        poc=plan.poc,
        data_dir=str(Path(plan.data_dir).resolve() / plan.poc),
        plan_path=str(plan_path),
        ran=ran,
        skipped=list(result.get("skipped") or []),
        exit=exit_result,
        record=record,
    )


def _fresh_hint(summary: DemoSummary) -> str:
    return (
        "to run the demo afresh: ckpt-poc demo --fresh (or scripts/demo --fresh): a new PoC "
        f"folder {summary.poc}-<UTC time> beside this one, which is kept as it is"
    )


def demo_summary_lines(summary: DemoSummary) -> list[tuple[str, str]]:
    """The demo's ending as (style, text) lines: 'rule' headings, 'good'/'bad' verdicts,
    'note' and plain ''. A run that re-ran nothing says so first, and how to run afresh."""
    lines: list[tuple[str, str]] = []
    if not summary.ran:
        lines += [
            ("rule", f"PoC {summary.poc}: every stage was already done; nothing was re-run"),
            (
                "note",
                f"what follows is what the PoC already has, from its data in {summary.data_dir}",
            ),
        ]
    elif summary.skipped:
        lines.append(("note", f"already done, not re-run: {', '.join(summary.skipped)}"))
    verdict = summary.exit.get("verdict")
    lines.append(("rule", "the way out: before_install -> after_uninstall"))
    for x in summary.exit.get("leftovers") or []:
        why = f": {x['reason']}" if x.get("reason") else ""
        cls = f" [{x['class']}]" if x.get("class") else ""
        lines.append(
            ("", f"  leftover{cls}: {x['node']} {x['kind']} {x['key']} ({x['change']}){why}")
        )
    own = summary.exit.get("node_own") or []
    if own:
        lines.append(
            ("note", f"  the node's own changes, listed apart (not leftovers): {len(own)}")
        )
    if verdict is None:
        lines.append(("bad", "exit verdict: not reached (uninstall and exit_diff not done)"))
    else:
        source = f" ({summary.exit['source']})" if summary.exit.get("source") else ""
        left = summary.exit.get("leftovers") or []
        # The flow says "leftovers: N" itself; the committed verdict rows say "leftovers".
        said = f"{verdict}: {len(left)}" if verdict == "leftovers" and left else verdict
        lines.append(("good" if verdict == "clean" else "bad", f"exit verdict: {said}{source}"))
    record = summary.record
    if record:
        lines.append(("rule", "the decision record"))
        for measure, v in (record.get("verdicts") or {}).items():
            lines.append(("", f"  {measure}: {v}"))
        if record.get("decision"):
            reason = f": {record['decision_reason']}" if record.get("decision_reason") else ""
            lines.append(("", f"decision: {record['decision']}{reason}"))
        lines.append(("", f"decision record: {record.get('html')}"))
        lines.append(("", f"                 {record.get('pdf')}"))
    if not summary.ran:
        lines.append(("note", _fresh_hint(summary)))
    return lines


def print_demo_summary(summary: DemoSummary) -> None:
    styles = {"good": "green", "bad": "bold red", "note": "yellow"}
    for style, text in demo_summary_lines(summary):
        if style == "rule":
            out.rule(Text(text), characters="─")
        else:
            out.print(Text(text, style=styles.get(style, "")), highlight=False)


def _demo_undo_install(plan: Path) -> None:
    """After a failed stage: uninstall if the demo installed and has not uninstalled yet."""
    from tasks.data.errors import PlanError
    from tasks.data.plan import load_plan
    from tasks.poc.progress import poc_state

    try:
        loaded = load_plan(plan, check_cluster=False)
    except PlanError:  # an invalid plan installed nothing; its problems are said already
        return
    stages = poc_state(loaded, loaded.data_dir, scheduled=False).stages
    if stages["install"].status == "done" and stages["uninstall"].status != "done":
        err.print("[yellow]a stage failed after the install: uninstalling[/]")
        _print_demo_verdict(run_uninstall(plan))


def _print_demo_verdict(result: UninstallRun) -> None:
    verdict = result.verdict
    colour = "green" if verdict == "clean" else "bold red"
    out.rule(Text("the way out: before_install -> after_uninstall", style=colour))
    for x in result.leftovers:
        out.print(f"  leftover: {x['node']} {x['kind']} {x['key']} ({x['change']})", markup=False)
    out.print(Text(f"exit verdict: {verdict}", style=colour), highlight=False)
