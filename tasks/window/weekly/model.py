"""One REPORTS row as the measures build it: its columns, its verdict by the plan criterion
and the gates its measure's declaration names (tasks.data.measures), the statistic and its
bootstrap CI, and the week's row builder."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tasks.data.arms import MANAGED
from tasks.data.checks import holds_verdicts
from tasks.data.measures import MEASURES, Measure
from tasks.data.plan import Plan
from tasks.data.row_types import JudgedRow, ReportCriterion, ReportRow
from tasks.experiments.stats import bootstrap_ci
from tasks.window.weekly.segments import week_start

# The columns of a REPORTS row as built here (build_weekly_report adds the stamp and
# computed_at), and beside them, not persisted, the plan criterion a row answers.
ROW_COLUMNS = tuple(ReportRow.__annotations__)
EXTRA_COLUMNS = tuple(ReportCriterion.__annotations__)

# Measure → its title, for the tables (the registry's, keyed by name).
TITLES = {m.name: m.title for m in MEASURES.values()}
N_RESAMPLES = 10_000


# --- statistics ----------------------------------------------------------------------------------


def _p90(a: np.ndarray, axis: int | None = None) -> Any:
    return np.percentile(a, 90, axis=axis)


STATISTICS: dict[str, Callable[..., Any]] = {
    "median": np.median,
    "mean": np.mean,
    "min": np.min,
    "max": np.max,
    "p90": _p90,
}


def summarize(
    values: pd.Series, statistic: str, n_resamples: int = N_RESAMPLES
) -> tuple[int, float | None, float | None, float | None]:
    """n, statistic and its percentile-bootstrap 95% CI (CI only from 2 values up)."""
    arr = values.dropna().astype(float).to_numpy()
    if len(arr) == 0:
        return 0, None, None, None
    fn = STATISTICS[statistic]
    value = float(fn(arr))
    if len(arr) < 2:
        return len(arr), value, None, None
    lo, hi = bootstrap_ci(arr, fn, n_resamples=n_resamples)
    return len(arr), value, lo, hi


def compare(value: float | None, threshold: float, at_most: bool) -> str:
    if value is None:
        return "no data"
    ok = value <= threshold if at_most else value >= threshold
    return "met" if ok else "not met"


# --- rows ----------------------------------------------------------------------------------------


@dataclass
class WeekRows:
    """The rows of one week as they are built: ``add`` judges and appends one."""

    plan: Plan
    week: str
    segment: int
    trials: pd.DataFrame  # the segment's trials to date
    failed_gates: dict[str, list[dict[str, str]]]  # run_id → failed checks
    n_resamples: int = N_RESAMPLES
    # measure → the six-mistake checks holding its verdict: (effect, gate, why) (mistakes.holds)
    held: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)
    rows: list[JudgedRow] = field(default_factory=list)

    def add(
        self,
        measure: Measure,
        arm: str,
        n: int,
        value: float | None,
        method: str,
        *,
        unit: str | None = None,
        ci: tuple[float | None, float | None] = (None, None),
        basis: str = "measured",
        inputs: dict[str, Any] | None = None,
        verdict: str | None = None,
        note: str = "",
        run_ids: Sequence[str] = (),
        provisional: str = "",
    ) -> JudgedRow:
        """One row of a registered measure judged and appended; its unit is the registry's
        unless the row says otherwise. ``provisional``: why the figure may still change (a
        chain in it had not ended): a met or not met verdict on it is undecided instead."""
        crit_name = measure.criterion.name if measure.criterion else None
        at_most = measure.at_most
        crit = measure.judged_by(self.plan.success)
        judged = crit is not None and (arm == "both" or arm == MANAGED)
        if n == 0 or value is None:
            verdict = "no data"
        elif verdict is None:
            verdict = compare(value, crit.threshold, at_most) if judged else "info"
        gates = measure.gate_names
        blocked = [
            {"run_id": r, **c}
            for r in sorted(set(run_ids))
            for c in self.failed_gates.get(r, [])
            # A check that holds no verdict (a run short of `repeats`) blocks none: the
            # pooled count decides (undecided).
            if c["gate"] in gates and holds_verdicts(c["expectation"])
        ]
        held = self.held.get(measure.name, []) if judged else []
        if blocked and verdict != "no data":
            verdict = "blocked"
            note = "a gate failed on rows it pools: " + "; ".join(
                f"{b['gate']}/{b['expectation']} (run {b['run_id']})" for b in blocked
            )
            inputs = {**(inputs or {}), "blocked_by": blocked}
        elif verdict in ("met", "not met", "undecided") and held:
            blocks = [(g, why) for effect, g, why in held if effect == "blocks"]
            if blocks:
                verdict, note = "blocked", "; ".join(f"{g}: {why}" for g, why in blocks)
            elif verdict != "undecided" or not note.startswith("needs "):
                verdict, note = "undecided", "; ".join(why for _, _, why in held)
        if provisional and verdict in ("met", "not met"):
            verdict, note = "undecided", "; ".join(filter(None, (provisional, note)))
        row: JudgedRow = {
            "week": self.week,
            "week_start": week_start(self.week),
            "measure": measure.name,
            "arm": arm,
            "n": int(n),
            "value": value,
            "ci_low": ci[0],
            "ci_high": ci[1],
            "unit": measure.unit if unit is None else unit,
            "method": method,
            "basis": basis,
            "inputs": json.dumps(inputs, sort_keys=True, default=str) if inputs else None,
            "threshold": float(crit.threshold) if judged else None,
            "verdict": verdict,
            "segment": self.segment,
            "provisional": bool(provisional),
            "criterion": crit_name if judged else None,
            "statistic": crit.statistic if judged else None,
            "at_most": at_most,
            "note": note,
        }
        self.rows.append(row)
        return row


def verdict_text(verdict: str, note: str | None) -> str:
    """A verdict as people read it: `blocked: <gate>: <why>` and `undecided: <why>` carry
    their reason; met, not met, no data and info stand alone."""
    if verdict in ("blocked", "undecided") and note:
        return f"{verdict}: {note}"
    return verdict


def ok_trials(trials: pd.DataFrame, measure: str, arm: str | None = None) -> pd.DataFrame:
    rows = trials[(trials["measure"] == measure) & (trials["status"] == "ok")]
    return rows if arm is None else rows[rows["arm"] == arm]


def distinct(series: pd.Series) -> list[str]:
    """A column's values as sorted strings, nulls dropped."""
    return sorted(map(str, series.dropna().unique()))


def runs_of(rows: pd.DataFrame) -> list[str]:
    return sorted(rows["run_id"].dropna().astype(str).unique())
