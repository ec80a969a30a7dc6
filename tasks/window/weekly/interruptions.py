"""The baseline's exposure beside what the trials measured per interruption.

"The accounting history exposed X GPU-h to time limits and preemption; per interruption the
managed arm lost Y (n trials), the unmanaged Z": the exposure from the latest baseline run's
`exposure` rows (kind=state), the loss from the ok recovery trials (`work_lost_gpu_h`),
per fault kind and arm; for a fault with a notice, how many notice checkpoints finished.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.measures import WORK_LOST_GPU_H
from tasks.data.plan import Plan
from tasks.data.render import number
from tasks.experiments.deadline import grace_lines

# The final states whose GPU-hours a notice could have saved: a time limit, a preemption.
NOTICE_STATES = ("TIMEOUT", "PREEMPTED")
HEADS = [
    "fault",
    "arm",
    "ok trials",
    "work lost per interruption (median GPU-h)",
    "steps lost (median)",
    "notice checkpoints",
]


@dataclass(frozen=True)
class Exposure:
    run_id: str
    exposed_gpu_h: float  # every exposed final state
    time_limit_gpu_h: float
    preempted_gpu_h: float


def latest_exposure(exposure: pd.DataFrame) -> Exposure | None:
    if exposure.empty:
        return None
    latest = exposure.sort_values("computed_at")["run_id"].iloc[-1]
    states = exposure[(exposure["run_id"] == latest) & (exposure["kind"] == "state")]
    preempted = states.loc[states["state"] == "PREEMPTED", "exposed_gpu_hours"]
    return Exposure(
        str(latest),
        float(states["exposed_gpu_hours"].sum()),
        float(states["timeout_gpu_hours"].sum()),
        float(preempted.sum()),
    )


def _notices(mine: pd.DataFrame) -> str:
    if "notice_checkpoint" not in mine.columns:
        return "—"
    taken = mine["notice_checkpoint"].dropna()
    if taken.empty:
        return "—"
    counts = taken.value_counts()
    return ", ".join(
        f"{counts.get(k, 0)} {k}" for k in ("finished", "missed", "none") if k in counts
    )


def loss_rows(trials: pd.DataFrame) -> list[list[str]]:
    """One row per (fault, arm) of the ok recovery trials."""
    rec = trials[(trials["measure"] == "recovery") & (trials["status"] == "ok")]
    rows: list[list[str]] = []
    for (fault, arm), mine in rec.groupby(["fault", "arm"], sort=True):
        lost = mine[WORK_LOST_GPU_H.column].dropna().astype(float)
        steps = mine["steps_lost"].dropna().astype(float)
        rows.append(
            [
                str(fault),
                str(arm),
                str(len(mine)),
                number(float(lost.median())) if not lost.empty else "—",
                number(float(steps.median())) if not steps.empty else "—",
                _notices(mine),
            ]
        )
    return rows


def against_baseline(exposure: pd.DataFrame, trials: pd.DataFrame) -> str:
    """The one sentence: the history's exposure, then each arm's median loss per
    interruption over every fault kind (n trials)."""
    ex = latest_exposure(exposure)
    rec = trials[(trials["measure"] == "recovery") & (trials["status"] == "ok")]
    parts = []
    if ex is None:
        parts.append("No baseline exposure to set beside the trials")
    else:
        parts.append(
            f"The accounting history (baseline run {ex.run_id}) exposed "
            f"{number(ex.exposed_gpu_h)} GPU-h to failures, "
            f"{number(ex.time_limit_gpu_h)} of them to time limits and "
            f"{number(ex.preempted_gpu_h)} to preemption"
        )
    arms = []
    for arm in (MANAGED, UNMANAGED):
        lost = rec.loc[rec["arm"] == arm, WORK_LOST_GPU_H.column].dropna().astype(float)
        if not lost.empty:
            arms.append(f"the {arm} arm {number(float(lost.median()))} GPU-h (n={len(lost)})")
    if arms:
        parts.append("per interruption (median work lost) " + ", ".join(arms))
    else:
        parts.append("no recovery trial measured the work lost per interruption yet")
    return "; ".join(parts) + "."


@dataclass(frozen=True)
class InterruptionSection:
    """What the weekly report and the record say of interruptions against the baseline."""

    line: str
    rows: list[list[str]]
    holds: list[str]  # what each notice fault's grace period holds (tasks/experiments/deadline)


def interruption_section(
    plan: Plan, exposure: pd.DataFrame, trials: pd.DataFrame
) -> InterruptionSection:
    return InterruptionSection(
        against_baseline(exposure, trials), loss_rows(trials), grace_lines(plan, trials)
    )


TITLE = "Interruptions against the baseline"
