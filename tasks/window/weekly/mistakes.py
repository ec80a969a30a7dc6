"""The six mistakes (docs/design.md §5) as gates that bind the verdicts: one check per mistake, each
passed or not, with its reason, the rows it looked at, and the verdicts its failure guards.

Computed once per week's rows: the weekly report judges its verdicts with these results and the
record prints them as its six lines (never a second computation). A failed check changes only
the verdicts it guards: `blocks` makes them `blocked: <gate>: <why>`, `undecided` (evidence
short of the plan's own minimum) makes a met / not met `undecided: needs N, has M`, `warns`
changes none. A check that found nothing to look at fails (nothing showed the mistake avoided)
and guards nothing: those verdicts already read `no data`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd

from tasks.data.arms import ARMS, MANAGED, UNMANAGED
from tasks.data.checks import (
    ARMS_DIFFER_ONLY_IN_MANAGED,
    NO_CHECKPOINT_IN_A_STEADY_SPAN,
    REAL_FAULT_AND_SERVING_AGAIN,
    SAME_CLOCK,
    Check,
    gate_of_trials,
)
from tasks.data.jsonform import JsonForm
from tasks.data.measures import RECOVERY_S, trial_verdicts
from tasks.data.plan import Plan
from tasks.experiments.clocks import MEASURE_CLOCKS, clock_problems
from tasks.window.weekly.model import distinct, ok_trials

Effect = Literal["blocks", "undecided", "warns"]
Looked = list[tuple[str, pd.DataFrame]]

# trials.measure → the weekly rows judged on it (the verdicts a gate on that measure guards).
TRIAL_MEASURE_ROWS: dict[str, tuple[str, ...]] = trial_verdicts()


@dataclass(frozen=True)
class GateResult(JsonForm):
    gate: str
    title: str
    passed: bool
    reason: str
    effect: Effect
    rows: list[dict[str, Any]] = field(default_factory=list)  # dataset, rows, run_ids
    guards: dict[str, str] = field(default_factory=dict)  # weekly measure → why it is held


@dataclass
class _Rows:
    """What every check reads: the week's pooled trials and the gate rows of their runs."""

    plan: Plan
    ok: pd.DataFrame  # ok trials
    gates: pd.DataFrame
    exposure: pd.DataFrame
    jobs: pd.DataFrame
    measures: list[str]  # the trial measures with ok rows


@dataclass
class _Check:
    passed: bool
    reason: str
    looked: Looked
    guards: dict[str, str] = field(default_factory=dict)


def _guard(guards: dict[str, str], measure: str, why: str) -> None:
    for row in TRIAL_MEASURE_ROWS.get(measure, ()):
        guards[row] = f"{guards[row]}; {why}" if row in guards else why


def _failed_stage_gates(r: _Rows, *checks: Check) -> tuple[pd.DataFrame, dict]:
    """The gate rows of ``checks`` (the catalogue's), and measure → the names of its failed
    ones."""
    ours = r.gates["expectation"].astype(str).map(lambda e: any(c.matches(e) for c in checks))
    rows = r.gates[ours.astype(bool)]
    failed = rows[rows["success"] == False]  # noqa: E712 (nullable Arrow booleans)
    by_measure: dict[str, list[str]] = {}
    for measure in TRIAL_MEASURE_ROWS:
        gate = gate_of_trials(measure)  # the gate whose checks judge its trials
        if gate is None:
            continue
        names = sorted(set(failed[failed["gate"] == gate.name]["expectation"].astype(str)))
        if names:
            by_measure[measure] = names
    return rows, by_measure


def _no_baseline(r: _Rows) -> _Check:
    """The unmanaged arm has rows for every measure the managed arm has."""
    guards: dict[str, str] = {}
    parts = []
    for m in r.measures:
        managed, unmanaged = (
            len(ok_trials(r.ok, m, MANAGED)),
            len(ok_trials(r.ok, m, UNMANAGED)),
        )
        parts.append(f"{m}: {managed} managed / {unmanaged} unmanaged ok trials")
        if unmanaged == 0:
            _guard(guards, m, f"no unmanaged {m} trials to compare with")
    why = "; ".join(parts) or "no trials"
    why += f"; baseline exposure rows: {len(r.exposure)}"
    passed = bool(r.measures) and not guards and len(r.exposure) > 0
    return _Check(passed, why, [("trials", r.ok), ("exposure", r.exposure)], guards)


def _different_clocks(r: _Rows) -> _Check:
    """Every trial on its arm's declared clock (tasks.experiments.clocks), and the stages'
    own same-clock checks held."""
    grows, failed = _failed_stage_gates(r, SAME_CLOCK)
    guards: dict[str, str] = {}
    parts = []
    for m in r.measures:
        rows = r.ok[r.ok["measure"] == m]
        used = {str(a): list(map(str, g["clock"])) for a, g in rows.groupby("arm", observed=True)}
        problems = clock_problems(m, used) + [
            f"{m}: stage gate {n} failed" for n in failed.get(m, [])
        ]
        declared = sorted({c.name for c in MEASURE_CLOCKS.get(m, {}).values()})
        parts.append(
            f"{m}: {' and '.join(declared) or 'undeclared'}"
            + (" (as declared)" if not problems else "")
        )
        if problems:
            _guard(guards, m, "; ".join(problems))
    why = "; ".join(parts) or "no trials"
    if guards:
        why = "; ".join(sorted(set(guards.values()))) + "; declared: " + why
    return _Check(
        bool(r.measures) and not guards, why, [("gates", grows), ("trials", r.ok)], guards
    )


def _synthetic_workload(r: _Rows) -> _Check:
    """Named in the accounting history, or a production owner (a warning)."""
    workload = r.plan.workload
    owner = workload.production_owner
    named = bool((r.jobs["job_name"].astype(str) == workload.name).any())
    why = (f"production owner: {owner}" if owner else "no production owner in the plan") + (
        f"; {workload.name!r} is "
        + ("" if named else "not ")
        + "a job name in the accounting history"
    )
    return _Check(bool(owner) or named, why, [("jobs", r.jobs)])


def _no_real_interruption(r: _Rows) -> _Check:
    """A real fault_injected and a measured serving_again per trial."""
    grows, failed = _failed_stage_gates(r, REAL_FAULT_AND_SERVING_AGAIN)
    rec = ok_trials(r.ok, "recovery")
    unmeasured = int((rec["fault"].isna() | rec[RECOVERY_S.column].isna()).sum())
    why = f"{len(rec)} ok recovery trials, {unmeasured} without fault or recovery_s"
    why += f"; {len(grows)} real-fault gate rows" + (
        ", failed" if failed else ", held" if len(grows) else ""
    )
    guards: dict[str, str] = {}
    if len(rec) and (unmeasured or "recovery" in failed):
        _guard(
            guards, "recovery", f"{unmeasured} trial(s) without a real fault or a measured recovery"
        )
    return _Check(len(rec) > 0 and not guards, why, [("gates", grows), ("trials", rec)], guards)


def _configurations(
    plan: Plan, measure: str
) -> list[tuple[str, Callable[[pd.DataFrame], pd.Series]]]:
    """The configurations `repeats` counts for a measure: (label, row filter)."""
    if measure == "recovery":
        return [(f"fault {f.kind}", lambda t, k=f.kind: t["fault"] == k) for f in plan.faults]
    if measure == "overhead":  # its verdict pools the steady pairs only
        return [("variant steady", lambda t: t["variant"] == "steady")]
    return [("", lambda t: t["measure"] == t["measure"])]


def _one_run_per_configuration(r: _Rows) -> _Check:
    """At least `repeats` ok trials per configuration and arm; short of it a verdict is
    undecided (needs N, has M), never met or not met."""
    repeats = r.plan.repeats
    guards: dict[str, str] = {}
    short = []
    for m in r.measures:
        rows = ok_trials(r.ok, m)
        counts = [
            (f"{label + ' ' if label else ''}{arm}", int((keep(rows) & (rows["arm"] == arm)).sum()))
            for label, keep in _configurations(r.plan, m)
            for arm in ARMS
        ]
        lacking = [(what, n) for what, n in counts if n < repeats]
        if lacking:
            fewest = min(n for _, n in lacking)
            _guard(
                guards,
                m,
                f"needs {repeats}, has {fewest}: ok {m} trials per configuration and arm "
                f"(plan repeats; short: {', '.join(f'{w} {n}' for w, n in lacking)})",
            )
            short += [f"{m}/{w}: {n}" for w, n in lacking]
    why = f"plan repeats {repeats}" + (
        f"; short: {', '.join(short)}" if short else "; every configuration has them"
    )
    return _Check(bool(r.measures) and not short, why, [("trials", r.ok)], guards)


def _two_changes_at_once(r: _Rows) -> _Check:
    """The arms differ only in `managed`, and no checkpoint fell inside a steady span."""
    grows, failed = _failed_stage_gates(
        r, ARMS_DIFFER_ONLY_IN_MANAGED, NO_CHECKPOINT_IN_A_STEADY_SPAN
    )
    if grows.empty:
        return _Check(False, "not checked: no one-difference gate rows", [("gates", grows)])
    guards: dict[str, str] = {}
    for m, names in failed.items():
        _guard(guards, m, f"the arms differed in more than `managed`: {', '.join(names)}")
    n_failed = sum(len(v) for v in failed.values())
    why = (
        f"{n_failed} of {len(grows)} one-difference checks failed"
        if n_failed
        else f"{len(grows)} one-difference checks held"
    )
    return _Check(not guards, why, [("gates", grows)], guards)


# (gate key, title, effect, check), in the record's order.
MISTAKES: tuple[tuple[str, str, Effect, Callable[[_Rows], _Check]], ...] = (
    ("no_baseline", "1. no baseline", "blocks", _no_baseline),
    ("different_clocks", "2. different clocks", "blocks", _different_clocks),
    (
        "synthetic_workload",
        "3. synthetic workload (a warning, not a block)",
        "warns",
        _synthetic_workload,
    ),
    ("no_real_interruption", "4. no real interruption", "blocks", _no_real_interruption),
    (
        "one_run_per_configuration",
        "5. one run per configuration",
        "undecided",
        _one_run_per_configuration,
    ),
    ("two_changes_at_once", "6. two changes at once", "blocks", _two_changes_at_once),
)


def six_mistakes(
    plan: Plan, trials: pd.DataFrame, frames: Mapping[str, pd.DataFrame]
) -> list[GateResult]:
    """The six checks over ``trials`` (the rows a week's verdicts pool) and the gate rows of
    their runs; ``frames`` gives gates, exposure and jobs (job_name; may be empty)."""
    ok = trials[trials["status"] == "ok"]
    measures = [m for m in TRIAL_MEASURE_ROWS if (ok["measure"] == m).any()]
    gates = frames["gates"]
    gates = gates[gates["run_id"].isin(set(trials["run_id"].dropna()))]
    jobs = frames.get("jobs")
    if jobs is None:
        jobs = pd.DataFrame(
            {"run_id": pd.Series([], dtype=str), "job_name": pd.Series([], dtype=str)}
        )
    rows = _Rows(plan, ok, gates, frames["exposure"], jobs, measures)
    out = []
    for key, title, effect, check in MISTAKES:
        c = check(rows)
        out.append(
            GateResult(
                gate=key,
                title=title,
                passed=bool(c.passed),
                reason=c.reason,
                effect=effect,
                rows=[
                    {"dataset": name, "rows": len(df), "run_ids": distinct(df["run_id"])}
                    for name, df in c.looked
                ],
                guards={} if c.passed or effect == "warns" else c.guards,
            )
        )
    return out


def holds(results: list[GateResult]) -> dict[str, list[tuple[Effect, str, str]]]:
    """Weekly measure → the failed checks that hold its verdict: (effect, gate, why)."""
    out: dict[str, list[tuple[Effect, str, str]]] = {}
    for g in results:
        for measure, why in g.guards.items():
            out.setdefault(measure, []).append((g.effect, g.gate, why))
    return out
