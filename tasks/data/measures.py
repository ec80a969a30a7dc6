"""The measure registry: every measure the weekly report and the record show, declared once.

One declaration per measure: its name (the `measure` of its rows), title, unit (which also
decides how it is printed: tasks.data.render.number), direction, the plan's criterion that
judges it and how the plan states it, the dataset and trials it comes from (a trial
measure's clock is declared by tasks.experiments.clocks under the same trials.measure), the
gates it needs (tasks.data.checks), the stage whose runs give its evidence, and the module
that computes it. A measure with a criterion is a verdict; one without is information.

Derived from here, never typed again: the plan's `success:` fields and `decision.criteria`
(tasks.data.plan), the criterion, direction and blocking gates of a weekly row
(tasks.window.weekly.model), the titles of the weekly report's and the record's tables, the
record's verdicts, their lineage and what would settle an open criterion
(tasks.poc.record), and the rows each of the six mistakes holds
(tasks.window.weekly.mistakes). Adding a measure is its declaration here and its
computation. The sampled metrics' info rows (``sampled_<metric>``) are named by their metric
and declared by none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tasks.data.checks import (
    BASELINE_GATE,
    COLD_START_GATE,
    COMPATIBILITY_GATE,
    OVERHEAD_GATE,
    RECOVERY_GATE,
    UTILIZATION_GATE,
    Gate,
)

Direction = Literal["at_most", "at_least"]


@dataclass(frozen=True)
class PlanCriterion:
    """The criterion as the plan states it: its field under `success:` (and its name in
    `decision.criteria`), the field's description, the plan model it takes (``criterion``:
    a statistic and a threshold; ``weeks``: and the weeks it needs; ``restores``: the
    Wilson interval's lower bound), whether a plan may leave it out, and the floor its
    threshold must clear."""

    name: str
    description: str
    model: Literal["criterion", "weeks", "restores"] = "criterion"
    optional: bool = False
    floor: Literal["> 0", "≥ 0"] | None = None  # what its threshold must be


@dataclass(frozen=True)
class Evidence:
    """The stage whose runs give a decision criterion its evidence, and what one more unit of
    it is. ``estimated``: a `needs N, has M` note on its row is an estimate at the measured
    rate, not a plan minimum."""

    stage: str
    unit: str
    estimated: bool = False


_MEASURES_MODULE = "tasks.window.weekly.measures"
_EXTRAPOLATION_MODULE = "tasks.window.weekly.extrapolation"


@dataclass(frozen=True)
class Measure:
    """One measure. ``dataset``: where the record finds the rows behind its figure;
    ``trials``: the trials.measure it pools; ``column``: the column it summarises;
    ``also_reads``: further datasets whose files its lineage lists; ``statistic``: the one it
    always takes (a criterion's statistic is the plan's); ``decided_as``: its name in
    `decision.criteria` when no `success:` criterion judges it; ``per_week``: a row of the
    week alone (the record's figure and lineage), where the others pool the segment's
    weeks."""

    name: str
    title: str
    unit: str
    computed_in: str  # the module that computes it: with this one, the only one spelling it
    dataset: str = "trials"
    trials: str | None = None
    column: str | None = None
    also_reads: tuple[str, ...] = ()
    statistic: str | None = None
    direction: Direction = "at_most"
    criterion: PlanCriterion | None = None
    decided_as: str | None = None
    evidence: Evidence | None = None
    gates: tuple[Gate, ...] = ()
    per_week: bool = False

    @property
    def at_most(self) -> bool:
        """The direction as rows store it: True when met means value ≤ threshold."""
        return self.direction == "at_most"

    @property
    def verdict(self) -> bool:
        """A plan criterion judges it (else its rows are information)."""
        return self.criterion is not None

    @property
    def decision(self) -> str | None:
        """Its name in `decision.criteria`, if the decision rule may name it."""
        return self.criterion.name if self.criterion else self.decided_as

    @property
    def gate_names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.gates)

    def judged_by(self, success: Any) -> Any:
        """Its criterion in a plan's ``success`` (None: information, or an optional criterion
        the plan leaves out)."""
        return getattr(success, self.criterion.name) if self.criterion else None


_RECOVERY_EVIDENCE = Evidence("recovery", "ok recovery trials per fault and arm")
# The extrapolations stand on recovery, checkpoint cost and the baseline's exposure.
_MODEL_GATES = (RECOVERY_GATE, OVERHEAD_GATE, COLD_START_GATE, BASELINE_GATE)
_CHECKPOINT_GATES = (OVERHEAD_GATE, COLD_START_GATE, RECOVERY_GATE)

# --- the verdicts, in the order of the plan's `success:` and `decision.criteria` ---------------

RECOVERY_S = Measure(
    "recovery_s",
    "recovery time",
    "s",
    _MEASURES_MODULE,
    trials="recovery",
    column="recovery_s",
    criterion=PlanCriterion(
        "recovery_time_s", "managed recovery time ≤ threshold seconds", floor="≥ 0"
    ),
    evidence=_RECOVERY_EVIDENCE,
    gates=(RECOVERY_GATE,),
)
WORK_LOST_GPU_H = Measure(
    "work_lost_gpu_h",
    "work lost per interruption",
    "GPU-h",
    _MEASURES_MODULE,
    trials="recovery",
    column="work_lost_gpu_h",
    criterion=PlanCriterion(
        "work_lost_gpu_h", "managed work lost per interruption ≤ GPU-h", floor="≥ 0"
    ),
    evidence=_RECOVERY_EVIDENCE,
    gates=(RECOVERY_GATE,),
)
GOODPUT_GAIN = Measure(
    "goodput_gain",
    "goodput gain (managed − unmanaged)",
    "fraction",
    _MEASURES_MODULE,
    dataset="utilization",
    direction="at_least",
    criterion=PlanCriterion(
        "utilization_gain",
        "managed − unmanaged goodput ≥ threshold (fraction of allocated GPU-hours)",
        model="weeks",
    ),
    evidence=Evidence("window", "weeks with both arms"),
    gates=(UTILIZATION_GATE,),
)
OVERHEAD_PCT = Measure(
    "overhead_pct",
    "steady-state overhead",
    "%",
    _MEASURES_MODULE,
    trials="overhead",
    column="run_s",
    criterion=PlanCriterion(
        "overhead_pct", "steady-state overhead ≤ threshold percent", floor="≥ 0"
    ),
    evidence=Evidence("overhead", "steady pairs"),
    gates=(OVERHEAD_GATE,),
)
COLD_START_SPEEDUP = Measure(
    "cold_start_speedup",
    "cold-start speed-up (native / restore)",
    "×",
    _MEASURES_MODULE,
    trials="cold_start",
    column="ready_s",
    direction="at_least",
    criterion=PlanCriterion(
        "cold_start_speedup", "native / restore ready time ≥ threshold ×", floor="> 0"
    ),
    evidence=Evidence("cold_start", "starts per arm"),
    gates=(COLD_START_GATE,),
)
# Restores are counted from trials and compatibility rows alike: no one trials.measure.
# Optional in a plan: left out, its rows are information.
RESTORE_SUCCESS_RATE = Measure(
    "restore_success_rate",
    "restore success rate (Wilson 95 % lower bound)",
    "fraction",
    "tasks.window.weekly.restores",
    also_reads=("compatibility",),
    direction="at_least",
    criterion=PlanCriterion(
        "restore_success_rate",
        "Wilson 95 % lower bound of restores ok / attempted ≥ threshold",
        model="restores",
        optional=True,
    ),
    evidence=Evidence("compatibility", "restores", estimated=True),
    gates=(COMPATIBILITY_GATE, RECOVERY_GATE, COLD_START_GATE),
)
# Judged by its own rule (every node's newest exit diff clean), not by a success criterion.
EXIT_LEFTOVERS = Measure(
    "exit_leftovers",
    "items left on the nodes after uninstall",
    "items",
    _MEASURES_MODULE,
    dataset="exit_verdicts",
    also_reads=("exit_diff",),
    decided_as="exit",
    evidence=Evidence("exit_diff", "exit diffs of every test node"),
)

# --- information -------------------------------------------------------------------------------

CHECKPOINT_DUMP_S = Measure(
    "checkpoint_dump_s",
    "checkpoint dump",
    "s",
    _MEASURES_MODULE,
    trials="checkpoint",
    column="dump_s",
    statistic="median",
    gates=_CHECKPOINT_GATES,
)
CHECKPOINT_FREEZE_S = Measure(
    "checkpoint_freeze_s",
    "checkpoint freeze",
    "s",
    _MEASURES_MODULE,
    trials="checkpoint",
    column="freeze_s",
    statistic="median",
    gates=_CHECKPOINT_GATES,
)
GOODPUT = Measure(
    "goodput",
    "goodput (of allocated GPU-h)",
    "fraction",
    _MEASURES_MODULE,
    dataset="utilization",
    gates=(UTILIZATION_GATE,),
    per_week=True,
)
# Its rows are utilization's, yet the record has always listed the trials behind it in its
# weeks and lineage (the default source): kept so that the record reads as before.
GOODPUT_JOB_SPAN = Measure(
    "goodput_job_span",
    "goodput (of the job span, queue included)",
    "fraction",
    _MEASURES_MODULE,
    gates=(UTILIZATION_GATE,),
)
# Named "utilization" in the rows; it is the busy fraction (a CPU-only row's unit: cores).
BUSY_FRACTION = Measure(
    "utilization",
    "busy fraction",
    "fraction",
    _MEASURES_MODULE,
    dataset="utilization",
    column="busy_fraction",
    gates=(UTILIZATION_GATE,),
    per_week=True,
)
CHECKPOINT_INTERVAL_S = Measure(
    "checkpoint_interval_s",
    "optimal checkpoint interval (Daly)",
    "s",
    _EXTRAPOLATION_MODULE,
    gates=_MODEL_GATES,
)
WASTE_FRACTION = Measure(
    "waste_fraction",
    "expected waste at the plan's interval",
    "fraction",
    _EXTRAPOLATION_MODULE,
    gates=_MODEL_GATES,
)
GOODPUT_GAIN_EXPECTED = Measure(
    "goodput_gain_expected",
    "expected goodput gain (waste model)",
    "fraction",
    _EXTRAPOLATION_MODULE,
    gates=_MODEL_GATES,
)
# The record's own: each cold-start clock per arm (the weekly rows carry only their ratio).
COLD_START_NATIVE_S = Measure(
    "cold_start_native_s",
    "cold start, native (launch → ready)",
    "s",
    "tasks.poc.record.sources",
    trials="cold_start",
    column="ready_s",
    statistic="median",
)
COLD_START_RESTORE_S = Measure(
    "cold_start_restore_s",
    "cold start, restore (restore start → ready)",
    "s",
    "tasks.poc.record.sources",
    trials="cold_start",
    column="ready_s",
    statistic="median",
)

MEASURES: dict[str, Measure] = {
    m.name: m
    for m in (
        RECOVERY_S,
        WORK_LOST_GPU_H,
        GOODPUT_GAIN,
        OVERHEAD_PCT,
        COLD_START_SPEEDUP,
        RESTORE_SUCCESS_RATE,
        EXIT_LEFTOVERS,
        CHECKPOINT_DUMP_S,
        CHECKPOINT_FREEZE_S,
        GOODPUT,
        GOODPUT_JOB_SPAN,
        BUSY_FRACTION,
        CHECKPOINT_INTERVAL_S,
        WASTE_FRACTION,
        GOODPUT_GAIN_EXPECTED,
        COLD_START_NATIVE_S,
        COLD_START_RESTORE_S,
    )
}
# The plan-judged measures, in the order of the plan's `success:` fields.
VERDICTS: tuple[Measure, ...] = tuple(m for m in MEASURES.values() if m.verdict)
# Their criteria as the plan states them: the plan's `success:` fields, in order.
CRITERIA: tuple[PlanCriterion, ...] = tuple(m.criterion for m in VERDICTS if m.criterion)
# The names a decision rule may list, in order: every criterion, then `exit`.
DECISION_CRITERIA: tuple[str, ...] = tuple(m.decision for m in MEASURES.values() if m.decision)


def by_decision(criterion: str) -> Measure:
    """The measure whose row decides ``criterion`` (a name in `decision.criteria`)."""
    return next(m for m in MEASURES.values() if m.decision == criterion)


def title(name: str) -> str:
    """A measure's title; a name the registry does not hold stands for itself."""
    m = MEASURES.get(name)
    return m.title if m else name


def trial_verdicts() -> dict[str, tuple[str, ...]]:
    """trials.measure → the verdicts judged on its rows (what a gate on it guards)."""
    out: dict[str, tuple[str, ...]] = {}
    for m in VERDICTS:
        if m.trials:
            out[m.trials] = (*out.get(m.trials, ()), m.name)
    return out
