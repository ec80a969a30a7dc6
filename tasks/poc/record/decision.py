"""The decision, by the rule the plan states (`decision:`), from the record's verdict rows:
adopt, reject, extend or undecided, with its reason, and for each criterion still open what
would settle it (a gate to fix, runs or weeks still needed, or a stage not yet run)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tasks.data.jsonform import JsonForm
from tasks.data.measures import DECISION_CRITERIA, Evidence, by_decision
from tasks.data.plan import Plan
from tasks.experiments.stats import n_to_decide
from tasks.window.weekly.model import verdict_text

Outcome = Literal["adopt", "reject", "extend", "undecided"]

# Decision criterion → the weekly row that judges it (its managed or both-arm row).
CRITERION_ROWS: dict[str, str] = {c: by_decision(c).name for c in DECISION_CRITERIA}
# Criterion → the stage that gives it evidence, what one more unit of it is, and whether a
# `needs N, has M` note on its row is an estimate at the measured rate, not a plan minimum.
EVIDENCE: dict[str, Evidence] = {
    c: e for c in DECISION_CRITERIA if (e := by_decision(c).evidence) is not None
}


@dataclass(frozen=True)
class OpenCriterion(JsonForm):
    """A criterion the decision still waits on, and what would settle it."""

    criterion: str
    verdict: str  # as people read it: `blocked: <gate>: <why>`, `undecided: …`, `no data`
    settle: str
    basis: str  # "gate" | "plan minimum" | "estimate" | "not run"
    inputs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision(JsonForm):
    decision: Outcome
    reason: str
    rule: str
    criteria: dict[str, str]  # criterion → verdict text
    open: tuple[OpenCriterion, ...] = ()
    extend_to: str | None = None

    _OMIT_NONE = ("extend_to",)


def _needs(note: str) -> tuple[int, int] | None:
    """(needs, has) from a note that opens `needs N, has M`."""
    head = note.split(":", 1)[0]
    parts = head.split(",")
    if not head.startswith("needs ") or len(parts) != 2:
        return None
    try:
        needs, has = (int(part.split()[-1]) for part in parts)
    except (ValueError, IndexError):
        return None
    return needs, has


def _settle(criterion: str, row: Mapping[str, Any] | None) -> OpenCriterion:
    evidence = EVIDENCE[criterion]
    stage, unit, estimated = evidence.stage, evidence.unit, evidence.estimated
    if row is None or row["verdict"] == "no data":
        return OpenCriterion(
            criterion, "no data", f"no evidence yet: run the `{stage}` stage", "not run"
        )
    note = str(row.get("note") or "")
    text = verdict_text(str(row["verdict"]), note)
    if row["verdict"] == "blocked":
        return OpenCriterion(
            criterion, text, f"fix the gate, then run `{stage}` again: {note}", "gate"
        )
    needs = _needs(note)
    if needs is not None:
        n_need, n_has = needs
        return OpenCriterion(
            criterion,
            text,
            f"{n_need - n_has} more {unit} (has {n_has} of the {n_need} the plan asks for)"
            if not estimated
            else f"about {n_need} {unit} in all ({n_need - n_has} more), an estimate: at the "
            "measured rate the Wilson interval narrows until it clears the threshold",
            "plan minimum" if not estimated else "estimate",
            {"needs": n_need, "has": n_has},
        )
    lo, hi, value, n = row.get("ci_low"), row.get("ci_high"), row.get("value"), int(row["n"])
    threshold = row.get("threshold")
    if None not in (lo, hi, value, threshold):
        k = n_to_decide(n, (float(lo), float(hi)), float(value), float(threshold))
        inputs = {"n": n, "value": value, "ci": [lo, hi], "threshold": threshold}
        if k is not None:
            return OpenCriterion(
                criterion,
                text,
                f"about {k} {unit} in all ({k - n} more), an estimate: at the measured spread "
                f"the CI narrows as 1/√n until it clears the threshold",
                "estimate",
                inputs,
            )
        return OpenCriterion(
            criterion,
            text,
            "the value sits on the threshold: no number of runs at this spread decides it",
            "estimate",
            inputs,
        )
    return OpenCriterion(criterion, text, f"more {unit}", "estimate")


def decide(plan: Plan, rows: Mapping[str, Mapping[str, Any]], today: dt.date) -> Decision:
    """The plan's rule applied to ``rows`` (weekly measure → its judged row, as the record
    shows it) on ``today``."""
    rule = plan.decision
    verdicts = {
        c: (str(rows[m]["verdict"]) if (m := CRITERION_ROWS[c]) in rows else "no data")
        for c in rule.criteria
    }
    texts = {
        c: verdict_text(verdicts[c], str(rows[CRITERION_ROWS[c]].get("note") or ""))
        if CRITERION_ROWS[c] in rows
        else "no data"
        for c in rule.criteria
    }
    rule_text = (
        f"adopt when every one of {', '.join(rule.criteria)} is met; reject when "
        + ("any is not met" if rule.reject == "any-not-met" else "every one is not met")
        + "; otherwise "
        + (
            f"extend the window {rule.extend_weeks} week(s) once it has ended"
            if rule.extend_weeks
            else "undecided"
        )
    )
    not_met = [c for c, v in verdicts.items() if v == "not met"]
    rejects = bool(not_met) and (rule.reject == "any-not-met" or len(not_met) == len(verdicts))
    if rejects:
        return Decision("reject", f"not met: {', '.join(not_met)}", rule_text, texts)
    if all(v == "met" for v in verdicts.values()):
        return Decision("adopt", f"every criterion met: {', '.join(verdicts)}", rule_text, texts)
    open_ = tuple(
        _settle(c, rows.get(CRITERION_ROWS[c])) for c, v in verdicts.items() if v != "met"
    )
    names = ", ".join(o.criterion for o in open_)
    end = plan.window.end
    if today < end:
        why = f"the window runs to {end}; still open: {names}"
        return Decision("undecided", why, rule_text, texts, open_)
    to = end + dt.timedelta(weeks=rule.extend_weeks)
    if rule.extend_weeks and today < to:
        why = f"the window ended {end} with {names} open: extended to {to}"
        return Decision("extend", why, rule_text, texts, open_, to.isoformat())
    why = f"the window ended {end}" + (f" and its extension {to}" if rule.extend_weeks else "")
    return Decision("undecided", f"{why} with {names} open", rule_text, texts, open_)
