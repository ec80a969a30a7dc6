"""The record built: the facts gathered from the committed datasets, the document written and
rendered to HTML and PDF, and the flow's markdown artifact."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.data.arms import MANAGED
from tasks.data.jsonform import JsonForm
from tasks.data.measures import COLD_START_SPEEDUP, EXIT_LEFTOVERS, MEASURES
from tasks.data.plan import Plan
from tasks.data.render import records, write_atomically
from tasks.data.runctx import RunContext
from tasks.data.weeks import current_week
from tasks.poc.record.decision import decide
from tasks.poc.record.document import Doc, render_html, render_pdf
from tasks.poc.record.sections import (
    TITLES_HERE,
    VERDICT_MEASURES,
    Facts,
    table_rows,
    write_document,
)
from tasks.poc.record.sources import (
    cold_start_rows,
    data_weeks,
    exit_state,
    files_by_run,
    restore_weeks,
    source_rows,
    week_trials,
    weeks_of,
)
from tasks.window.weekly.model import distinct, verdict_text
from tasks.window.weekly.restores import MEASURE as RESTORES
from tasks.window.weekly.restores import section_json
from tasks.window.weekly.rows import read_frames, week_report

N_RESAMPLES = 10_000


DECISION_FILE = "decision.json"


def record_dir(data_dir: str | Path, poc: str) -> Path:
    return Path(data_dir) / poc / "record"


# a dict: the decision.json document as read (status prints it)
def read_decision(data_dir: str | Path, poc: str) -> dict[str, Any] | None:
    """The decision the latest record took (week, decision, decision_reason, built_at), or
    None before any record was built."""
    path = record_dir(data_dir, poc) / DECISION_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # a torn or foreign file: said, never guessed at
        return {"decision": "unreadable", "decision_reason": f"{path}: {exc}"}


def _shown_rows(
    rows: pd.DataFrame,
    frames: Mapping[str, pd.DataFrame],
    week: str,
    segment: int,
    seg_weeks: list[str],
    n_resamples: int,
) -> list[dict[str, Any]]:
    """The week's rows with the per-arm cold-start clocks after the speed-up, each with the
    weeks and runs of the rows behind it."""
    recs = records(rows)
    clocks = records(cold_start_rows(week_trials(frames, seg_weeks), week, segment, n_resamples))
    at = next(
        (i + 1 for i, r in enumerate(recs) if r["measure"] == COLD_START_SPEEDUP.name), len(recs)
    )
    recs[at:at] = clocks
    for r in recs:
        # Goodput and busy fraction per arm are the week's own; the rest pool the segment.
        measure = MEASURES.get(r["measure"])
        per_week = measure is not None and measure.per_week
        src = source_rows(r["measure"], r["arm"], frames, [week] if per_week else seg_weeks)
        r["weeks"] = weeks_of(src)
        r["run_ids"] = distinct(src["run_id"]) if "run_id" in src.columns else []
        if r["measure"] == EXIT_LEFTOVERS.name:
            r["run_ids"] = distinct(frames["exit_verdicts"]["run_id"])
        if r["measure"] == RESTORES and r.get("inputs"):
            # The judged version's restores, from trials and compatibility runs alike.
            r["run_ids"] = json.loads(r["inputs"])["versions"][-1]["run_ids"]
            r["weeks"] = restore_weeks(frames, r["run_ids"])
        if r["basis"] == "extrapolated" and r.get("inputs"):
            lam = json.loads(r["inputs"]).get("exposure") or {}
            r["run_ids"] = sorted({*r["run_ids"], *([lam["run_id"]] if lam else [])})
    return recs


def gather(
    plan: Plan,
    data_dir: str | Path,
    *,
    n_resamples: int = N_RESAMPLES,
    today: dt.date | None = None,
) -> Facts:
    """Everything the record shows, from the committed datasets: the verdict rows and the six
    checks are week_report's of the latest week with data; the decision is the plan's rule on
    ``today`` (UTC)."""
    poc = plan.poc
    frames = read_frames(data_dir, poc)
    weeks = data_weeks(frames)
    week = weeks[-1] if weeks else current_week()
    report = week_report(plan, frames, week, n_resamples=n_resamples)
    rows, change_points = report.rows, report.change_points
    segment = int(rows["segment"].max()) if len(rows) else 0
    start = min((cp["week"] for cp in change_points if cp["segment"] == segment), default="")
    seg_weeks = [w for w in weeks if w >= start]
    recs = _shown_rows(rows, frames, week, segment, seg_weeks, n_resamples)
    by_key = {(r["measure"], r["arm"]): r for r in recs}
    judged = {
        m: row
        for m in (*VERDICT_MEASURES, EXIT_LEFTOVERS.name)
        if (row := by_key.get((m, MANAGED)) or by_key.get((m, "both"))) is not None
    }
    verdicts = {
        m: verdict_text(str(judged[m]["verdict"]), judged[m].get("note"))
        if m in judged
        else "no data"
        for m in VERDICT_MEASURES
    }
    state, latest_exit = exit_state(frames["exit_verdicts"])
    return Facts(
        plan=plan,
        data_dir=Path(data_dir),
        frames=frames,
        weeks=weeks,
        week=week,
        rows=rows,
        recs=recs,
        change_points=change_points,
        segment=segment,
        seg_weeks=seg_weeks,
        files=files_by_run(data_dir, poc),
        verdicts=verdicts,
        mistakes=report.gates,
        compatibility=report.compatibility,
        decision=decide(plan, judged, today or dt.datetime.now(dt.UTC).date()),
        exit_state=state,
        latest_exit=latest_exit,
    )


def build_document(
    plan: Plan,
    data_dir: str | Path,
    *,
    n_resamples: int = N_RESAMPLES,
    today: dt.date | None = None,
) -> tuple[Doc, dict[str, Any]]:
    """The record's blocks and its summary (verdicts, gates, exit, the verdict table)."""
    f = gather(plan, data_dir, n_resamples=n_resamples, today=today)
    summary = {
        "week": f.week,
        "decision": f.decision.decision,
        "decision_reason": f.decision.reason,
        "decision_detail": f.decision.to_json(),
        "verdicts": f.verdicts,
        "gates": {
            g.gate: {
                "passed": g.passed,
                "reason": g.reason,
                "effect": g.effect,
                "holds": g.guards,
            }
            for g in f.mistakes
        },
        "exit": f.exit_state,
        "table": table_rows(f.recs),
        "compatibility": section_json(f.compatibility),
    }
    return write_document(f), summary


@dataclass(frozen=True, slots=True)
class DecisionRecord(JsonForm):
    """The record built: its two files and its summary (what the flow hands on)."""

    html: str
    pdf: str
    week: str
    decision: str
    decision_reason: str
    decision_detail: dict[str, Any]  # the decision's own JSON form
    verdicts: dict[str, str]  # measure → verdict
    gates: dict[str, dict[str, Any]]  # gate → passed, reason, effect, holds
    exit: str
    table: list[list[str]]
    compatibility: dict[str, Any]  # section_json's form


def build_record(plan: Plan, ctx: RunContext, *, n_resamples: int = N_RESAMPLES) -> DecisionRecord:
    """Read the committed datasets and write ``<data_dir>/<poc>/record/decision-record.html``
    and ``.pdf`` (atomically; the latest run wins). Writes no dataset rows."""
    doc, summary = build_document(plan, ctx.data_dir, n_resamples=n_resamples)
    title = f"Decision record {plan.poc} / {plan.workload.name}"
    out = record_dir(ctx.data_dir, ctx.poc)
    html_file, pdf_file = out / "decision-record.html", out / "decision-record.pdf"
    write_atomically(html_file, render_html(doc, title).encode("utf-8"))
    write_atomically(pdf_file, render_pdf(doc, title))
    result = DecisionRecord(html=str(html_file), pdf=str(pdf_file), **summary)
    # `status` shows the decision from here, without judging every week again.
    decision: dict[str, Any] = {
        "week": result.week,
        "decision": result.decision,
        "decision_reason": result.decision_reason,
    }
    decision["built_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    write_atomically(out / DECISION_FILE, json.dumps(decision, indent=1).encode("utf-8"))
    return result


def record_markdown(result: Mapping[str, Any]) -> str:
    """The flow's artifact: verdicts first, then gates and the way out."""
    lines = [f"# Decision record (data to {result['week']})", ""]
    lines += [f"**Decision: {result['decision']}**: {result['decision_reason']}", ""]
    lines += [
        f"- to settle {o['criterion']}: {o['settle']} ({o['basis']})"
        for o in result["decision_detail"]["open"]
    ]
    lines += ["", "## Verdicts", ""]
    lines += [f"- {TITLES_HERE.get(m, m)}: **{v}**" for m, v in result["verdicts"].items()]
    lines += ["", "## The six mistakes", ""]
    lines += [
        f"- {g}: {'passed' if s['passed'] else 'FAILED'} ({s['reason']})"
        + (f"; holds {', '.join(s['holds'])}" if s["holds"] else "")
        for g, s in result["gates"].items()
    ]
    compat = result.get("compatibility")
    if compat:
        lines += ["", "## Compatibility", "", f"{compat['headline']}.", ""]
        lines += [
            f"- {w['workload']}: restored {w['restored k/n']} (95 % CI {w['95 % CI (Wilson)']}), "
            f"fidelity {w['fidelity']}, run {w['run']}"
            for w in compat["workloads"]
        ]
        for x in compat["failures"]:
            want = x["CRIU option it asks for"]
            lines.append(
                f"- {x['workload']} {x['phase']} (cycles {x['cycles']}): {x['cause']}"
                + (f" — CRIU asks for {want}" if want != "–" else "")
            )
        lines += ["", f"{compat['restores_line']}"]
    lines += [
        "",
        f"## The way out: {result['exit']}",
        "",
        f"HTML: {result['html']}",
        f"PDF: {result['pdf']}",
    ]
    return "\n".join(lines)
