"""The six mistakes (DESIGN §5): one check per mistake, each passed or not, with its reason
and the rows it looked at. A gate that never ran is not passed: nothing showed the mistake
avoided."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from tasks.data.plan import Plan
from tasks.poc.record.sources import distinct
from tasks.window.weekly.model import ok_trials

Looked = list[tuple[str, pd.DataFrame]]


@dataclass
class _Rows:
    """What every check reads."""

    plan: Plan
    ok: pd.DataFrame  # ok trials
    gates: pd.DataFrame
    exposure: pd.DataFrame
    jobs: pd.DataFrame
    measures: list[str]  # the trial measures with ok rows


def _gate_rows(gates: pd.DataFrame, match: Callable[[str], bool]) -> pd.DataFrame:
    return gates[gates["expectation"].astype(str).map(match).astype(bool)]


def _from_gates(rows: pd.DataFrame, what: str) -> tuple[bool, str]:
    if rows.empty:
        return False, f"not checked: no {what} gate rows"
    failed = rows[rows["success"] == False]  # noqa: E712 (nullable Arrow booleans)
    if len(failed):
        names = ", ".join(
            sorted({f"{g}/{e}" for g, e in zip(failed["gate"], failed["expectation"], strict=True)})
        )
        return False, f"{len(failed)} of {len(rows)} {what} checks failed: {names}"
    return True, f"{len(rows)} {what} checks held"


def _no_baseline(r: _Rows) -> tuple[bool, str, Looked]:
    """The unmanaged arm has rows for every measure the managed arm has."""
    ok, exposure = r.ok, r.exposure
    counts = {
        m: (int((ok_trials(ok, m, "managed")).shape[0]), len(ok_trials(ok, m, "unmanaged")))
        for m in r.measures
    }
    missing = [m for m, (_, u) in counts.items() if u == 0]
    passed = bool(r.measures) and not missing and len(exposure) > 0
    why = (
        "; ".join(f"{m}: {mm} managed / {u} unmanaged ok trials" for m, (mm, u) in counts.items())
        or "no trials"
    )
    why += f"; baseline exposure rows: {len(exposure)}"
    if missing:
        why = f"no unmanaged rows for {', '.join(missing)}; " + why
    return passed, why, [("trials", ok), ("exposure", exposure)]


def _different_clocks(r: _Rows) -> tuple[bool, str, Looked]:
    """One clock per measure on both arms (and the gate said so)."""
    grows = _gate_rows(r.gates, lambda e: e == "same_clock_both_arms")
    g_ok, g_why = _from_gates(grows, "same-clock")
    clocks = {m: distinct(r.ok[r.ok["measure"] == m]["clock"]) for m in r.measures}
    multi = [m for m, c in clocks.items() if len(c) > 1]
    why = g_why + "; clocks: " + "; ".join(f"{m}: {', '.join(c)}" for m, c in clocks.items())
    return g_ok and not multi, why, [("gates", grows), ("trials", r.ok)]


def _synthetic_workload(r: _Rows) -> tuple[bool, str, Looked]:
    """Named in the accounting history, or a production owner (a warning)."""
    workload = r.plan.workload
    owner = workload.production_owner
    named = bool((r.jobs["job_name"].astype(str) == workload.name).any())
    why = (f"production owner: {owner}" if owner else "no production owner in the plan") + (
        f"; {workload.name!r} is "
        + ("" if named else "not ")
        + "a job name in the accounting history"
    )
    return bool(owner) or named, why, [("jobs", r.jobs)]


def _no_real_interruption(r: _Rows) -> tuple[bool, str, Looked]:
    """A real fault_injected and a measured serving_again per trial."""
    grows = _gate_rows(r.gates, lambda e: e == "real_fault_and_measured_serving_again")
    g_ok, g_why = _from_gates(grows, "real-fault")
    rec = ok_trials(r.ok, "recovery")
    unmeasured = int((rec["fault"].isna() | rec["recovery_s"].isna()).sum())
    why = g_why + f"; {len(rec)} ok recovery trials, {unmeasured} without fault or recovery_s"
    return g_ok and len(rec) > 0 and unmeasured == 0, why, [("gates", grows), ("trials", rec)]


def _one_run_per_configuration(r: _Rows) -> tuple[bool, str, Looked]:
    """At least `repeats` ok trials per (measure, arm)."""
    grows = _gate_rows(r.gates, lambda e: e.startswith("repeats["))
    g_ok, g_why = _from_gates(grows, "repeats")
    repeats = r.plan.repeats
    short = [
        f"{m}/{a}: {n}"
        for m in r.measures
        for a in ("managed", "unmanaged")
        if (n := len(ok_trials(r.ok, m, a))) < repeats
    ]
    why = g_why + f"; plan repeats {repeats}" + (f"; short: {', '.join(short)}" if short else "")
    return g_ok and bool(r.measures) and not short, why, [("gates", grows), ("trials", r.ok)]


def _two_changes_at_once(r: _Rows) -> tuple[bool, str, Looked]:
    """The arms differ only in `managed`."""
    grows = _gate_rows(
        r.gates,
        lambda e: (
            e.startswith("arms_differ_only_in_managed[")
            or e == "no_checkpoint_inside_a_steady_span"
        ),
    )
    g_ok, g_why = _from_gates(grows, "one-difference")
    return g_ok, g_why, [("gates", grows)]


# (gate key, title, check), in the record's order.
MISTAKES: tuple[tuple[str, str, Callable[[_Rows], tuple[bool, str, Looked]]], ...] = (
    ("no_baseline", "1. no baseline", _no_baseline),
    ("different_clocks", "2. different clocks", _different_clocks),
    (
        "synthetic_workload",
        "3. synthetic workload (a warning, not a block)",
        _synthetic_workload,
    ),
    ("no_real_interruption", "4. no real interruption", _no_real_interruption),
    ("one_run_per_configuration", "5. one run per configuration", _one_run_per_configuration),
    ("two_changes_at_once", "6. two changes at once", _two_changes_at_once),
)


def six_mistakes(
    plan: Plan, frames: Mapping[str, pd.DataFrame], jobs: pd.DataFrame
) -> list[dict[str, Any]]:
    """One line per mistake: passed, why, and the rows it looked at (dataset, run ids,
    row count)."""
    trials = frames["trials"]
    ok = trials[trials["status"] == "ok"]
    measures = [m for m in ("recovery", "overhead", "cold_start") if (ok["measure"] == m).any()]
    rows = _Rows(plan, ok, frames["gates"], frames["exposure"], jobs, measures)
    out: list[dict[str, Any]] = []
    for key, title, check in MISTAKES:
        passed, reason, looked = check(rows)
        out.append(
            {
                "gate": key,
                "title": title,
                "passed": bool(passed),
                "reason": reason,
                "rows": [
                    {"dataset": name, "rows": len(df), "run_ids": distinct(df["run_id"])}
                    for name, df in looked
                ],
            }
        )
    return out
