"""One REPORTS row as the measures build it: its columns, the plan criterion and gates that
judge each measure, the statistic and its bootstrap CI, and the week's row builder."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tasks.data.plan import Plan
from tasks.experiments.stats import bootstrap_ci
from tasks.window.weekly.segments import week_start

# The columns of a REPORTS row as built here; build_weekly_report adds the stamp and computed_at.
ROW_COLUMNS = (
    "week",
    "week_start",
    "measure",
    "arm",
    "n",
    "value",
    "ci_low",
    "ci_high",
    "unit",
    "method",
    "basis",
    "inputs",
    "threshold",
    "verdict",
    "note",
    "segment",
    "provisional",
)
# Extra, not persisted: the plan criterion a row answers.
EXTRA_COLUMNS = ("criterion", "statistic", "at_most")

# Measure → the plan criterion judging it and its direction (True: value ≤ threshold).
CRITERIA: dict[str, tuple[str, bool]] = {
    "recovery_s": ("recovery_time_s", True),
    "work_lost_gpu_h": ("work_lost_gpu_h", True),
    "goodput_gain": ("utilization_gain", False),
    "overhead_pct": ("overhead_pct", True),
    "cold_start_speedup": ("cold_start_speedup", False),
    # Optional in a plan: unset, the row is info (WeekRows.add finds no criterion).
    "restore_success_rate": ("restore_success_rate", False),
}
# Which gates' failures block a measure's row (gate names as the stages record them).
MEASURE_GATES: dict[str, tuple[str, ...]] = {
    "recovery_s": ("recovery",),
    "work_lost_gpu_h": ("recovery",),
    "overhead_pct": ("overhead",),
    "cold_start_speedup": ("cold_start",),
    "restore_success_rate": ("compatibility", "recovery", "cold_start"),
    "checkpoint_dump_s": ("overhead", "cold_start", "recovery"),
    "checkpoint_freeze_s": ("overhead", "cold_start", "recovery"),
    "goodput": ("utilization",),
    "goodput_job_span": ("utilization",),
    "utilization": ("utilization",),
    "goodput_gain": ("utilization",),
    "checkpoint_interval_s": ("recovery", "overhead", "cold_start", "baseline"),
    "waste_fraction": ("recovery", "overhead", "cold_start", "baseline"),
    "goodput_gain_expected": ("recovery", "overhead", "cold_start", "baseline"),
}
TITLES = {
    "recovery_s": "recovery time",
    "work_lost_gpu_h": "work lost per interruption",
    "goodput": "goodput (of allocated GPU-h)",
    "goodput_job_span": "goodput (of the job span, queue included)",
    "utilization": "busy fraction",
    "goodput_gain": "goodput gain (managed − unmanaged)",
    "overhead_pct": "steady-state overhead",
    "cold_start_speedup": "cold-start speed-up (native / restore)",
    "restore_success_rate": "restore success rate (Wilson 95 % lower bound)",
    "checkpoint_dump_s": "checkpoint dump",
    "checkpoint_freeze_s": "checkpoint freeze",
    "checkpoint_interval_s": "optimal checkpoint interval (Daly)",
    "waste_fraction": "expected waste at the plan's interval",
    "exit_leftovers": "items left on the nodes after uninstall",
    "goodput_gain_expected": "expected goodput gain (waste model)",
}
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
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(
        self,
        measure: str,
        arm: str,
        n: int,
        value: float | None,
        unit: str,
        method: str,
        *,
        ci: tuple[float | None, float | None] = (None, None),
        basis: str = "measured",
        inputs: dict[str, Any] | None = None,
        verdict: str | None = None,
        note: str = "",
        run_ids: Sequence[str] = (),
        provisional: str = "",
    ) -> dict[str, Any]:
        """One row judged and appended. ``provisional``: why the figure may still change (a
        chain in it had not ended): a met or not met verdict on it is undecided instead."""
        crit_name, at_most = CRITERIA.get(measure, (None, True))
        crit = getattr(self.plan.success, crit_name) if crit_name else None
        judged = crit is not None and (arm == "both" or arm == "managed")
        if n == 0 or value is None:
            verdict = "no data"
        elif verdict is None:
            verdict = compare(value, crit.threshold, at_most) if judged else "info"
        blocked = [
            {"run_id": r, **c}
            for r in sorted(set(run_ids))
            for c in self.failed_gates.get(r, [])
            # A run short of `repeats` holds no block: the pooled count decides (undecided).
            if c["gate"] in MEASURE_GATES.get(measure, ())
            and not c["expectation"].startswith("repeats[")
        ]
        held = self.held.get(measure, []) if judged else []
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
        row = {
            "week": self.week,
            "week_start": week_start(self.week),
            "measure": measure,
            "arm": arm,
            "n": int(n),
            "value": value,
            "ci_low": ci[0],
            "ci_high": ci[1],
            "unit": unit,
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
