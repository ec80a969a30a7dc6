"""The check catalogue: every gate and every check a gate runs, declared once.

A *gate* is a stage's: the checks it runs are stored under its name in the `gates` dataset
(tasks.data.gates.record_and_enforce), and one that failed refuses the stage's report. The
weekly verdicts that pool the run's rows are blocked too, for the measures that need the gate
(their `gates` in the measure registry, tasks.data.measures), unless the check holds no
verdict: a run short of `repeats` leaves the pooled count to decide (undecided, not blocked).

A *check* is one line of a gate: its name as the `expectation` column stores it (a
parametrised one writes ``name[...]``), the dataset it looks at, the gates that run it and
the modules that implement it; no other module spells its name. Readers find a check's rows
through its declaration (``Check.matches``): the six mistakes (tasks.window.weekly.mistakes)
and the weekly rows (tasks.window.weekly.model).

The declaration rules are the checks every dataset declaration implies (a column's
nullability, its set of values, its range; the table's column set): Great Expectations runs
them on the table, or a sample of it, and the exact pass over every row runs the same rules
in pyarrow (tasks.data.gates builds both from COLUMN_RULES).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.data.dataset_spec import Column, DatasetSpec


@dataclass(frozen=True)
class Gate:
    """A stage's gate. ``trials``: the trials.measure whose rows its checks judge (the six
    mistakes find a measure's stage checks by it); None for a gate over other datasets."""

    name: str
    trials: str | None = None


BASELINE_GATE = Gate("baseline")
COMPATIBILITY_GATE = Gate("compatibility")
RECOVERY_GATE = Gate("recovery", trials="recovery")
OVERHEAD_GATE = Gate("overhead", trials="overhead")
COLD_START_GATE = Gate("cold_start", trials="cold_start")
# No stage runs checks under it yet: the goodput and busy rows that need it are blocked by
# none until one does.
UTILIZATION_GATE = Gate("utilization")
GATES = (
    BASELINE_GATE,
    COMPATIBILITY_GATE,
    RECOVERY_GATE,
    OVERHEAD_GATE,
    COLD_START_GATE,
    UTILIZATION_GATE,
)
# The gates that validate a dataset against its declaration (tasks.data.gates).
DECLARATION_GATES = (
    BASELINE_GATE,
    COMPATIBILITY_GATE,
    RECOVERY_GATE,
    OVERHEAD_GATE,
    COLD_START_GATE,
)


@dataclass(frozen=True)
class Check:
    """One check of a gate. ``dataset`` None: whichever dataset it is run on. ``param``: what
    a parametrised check writes in its brackets. ``holds_verdicts`` False: its failure holds
    no weekly verdict (the verdict judges the pooled rows by other means)."""

    name: str
    dataset: str | None
    gates: tuple[Gate, ...]
    modules: tuple[str, ...]  # the modules that implement it: the only ones that spell it
    param: str | None = None
    holds_verdicts: bool = True

    def expectation(self, *values: object) -> str:
        """The name a result of this check is stored under."""
        if self.param is None:
            return self.name
        return f"{self.name}[{','.join(map(str, values))}]"

    def matches(self, expectation: str) -> bool:
        """Whether a stored `expectation` is a result of this check."""
        if self.param is None:
            return expectation == self.name
        return expectation.startswith(f"{self.name}[")


_TRIAL_GATES = (RECOVERY_GATE, OVERHEAD_GATE, COLD_START_GATE)

REPEATS = Check(
    "repeats",
    "trials",
    _TRIAL_GATES,
    (
        "tasks.experiments.recovery",
        "tasks.experiments.overhead",
        "tasks.experiments.cold_start",
    ),
    param="configuration,arm",
    # A run short of `repeats` holds no block: the pooled count decides (undecided).
    holds_verdicts=False,
)
SAME_CLOCK = Check("same_clock_both_arms", "trials", _TRIAL_GATES, ("tasks.experiments.clocks",))
ARMS_DIFFER_ONLY_IN_MANAGED = Check(
    "arms_differ_only_in_managed",
    "trials",
    _TRIAL_GATES,
    ("tasks.experiments.trials",),
    param="column",
)
NO_CHECKPOINT_IN_A_STEADY_SPAN = Check(
    "no_checkpoint_inside_a_steady_span",
    "trials",
    (OVERHEAD_GATE,),
    ("tasks.experiments.overhead",),
)
REAL_FAULT_AND_SERVING_AGAIN = Check(
    "real_fault_and_measured_serving_again",
    "trials",
    (RECOVERY_GATE,),
    ("tasks.experiments.recovery",),
)
RESTORES_HAVE_CHECKPOINT_BYTES = Check(
    "every_restore_has_checkpoint_bytes",
    "trials",
    (COLD_START_GATE,),
    ("tasks.experiments.cold_start",),
)
COUNTS_MATCH_CYCLES = Check(
    "counts_match_cycles",
    "compatibility",
    (COMPATIBILITY_GATE,),
    ("tasks.experiments.compatibility_result",),
    param="workload",
)
_BASELINE_RUN = ("tasks.baseline.run",)
ROWS_RECONCILE = Check(
    "rows_read_equals_parsed_plus_quarantined", "jobs", (BASELINE_GATE,), _BASELINE_RUN
)
INPUT_HAS_ROWS = Check("input_has_rows", "jobs", (BASELINE_GATE,), _BASELINE_RUN)
INPUT_HAS_PARSED_ROWS = Check("input_has_parsed_rows", "jobs", (BASELINE_GATE,), _BASELINE_RUN)
QUARANTINE_WITHIN_LIMIT = Check(
    "quarantined_share_within_plan_limit", "quarantine", (BASELINE_GATE,), _BASELINE_RUN
)

# --- the declaration rules ------------------------------------------------------------------

_GATES_MODULE = ("tasks.data.gates",)


@dataclass(frozen=True)
class TableRule:
    """A rule over the table's shape: GX checks it on the sample (the same columns as the
    whole table, so no exact pass repeats it). ``gx``: the GX expectation class."""

    check: Check
    gx: str
    gx_kwargs: Callable[[DatasetSpec], dict[str, Any]]


@dataclass(frozen=True)
class ColumnRule:
    """A rule a column's declaration implies, where ``applies``: GX runs its expectation
    (``gx`` with ``gx_kwargs``), the exact pass over every row counts the same rule in
    pyarrow (tasks.data.gates, by the check's name)."""

    check: Check
    gx: str
    applies: Callable[[Column], bool]
    gx_kwargs: Callable[[Column], dict[str, Any]]


# Check names are GX's expectation types: what GX stores, and the exact pass alike.
COLUMN_SET = TableRule(
    Check("expect_table_columns_to_match_set", None, DECLARATION_GATES, _GATES_MODULE),
    "ExpectTableColumnsToMatchSet",
    lambda spec: {"column_set": spec.column_names, "exact_match": True},
)
NOT_NULL = ColumnRule(
    Check("expect_column_values_to_not_be_null", None, DECLARATION_GATES, _GATES_MODULE),
    "ExpectColumnValuesToNotBeNull",
    lambda col: not col.nullable,
    lambda col: {"column": col.name},
)
IN_SET = ColumnRule(
    Check("expect_column_values_to_be_in_set", None, DECLARATION_GATES, _GATES_MODULE),
    "ExpectColumnValuesToBeInSet",
    lambda col: col.allowed is not None,
    lambda col: {"column": col.name, "value_set": list(col.allowed or ())},
)
BETWEEN = ColumnRule(
    Check("expect_column_values_to_be_between", None, DECLARATION_GATES, _GATES_MODULE),
    "ExpectColumnValuesToBeBetween",
    lambda col: col.min is not None or col.max is not None,
    lambda col: {"column": col.name, "min_value": col.min, "max_value": col.max},
)
# In the order the suite adds them and the exact pass reports them, per column.
COLUMN_RULES = (NOT_NULL, IN_SET, BETWEEN)

CHECKS: tuple[Check, ...] = (
    REPEATS,
    SAME_CLOCK,
    ARMS_DIFFER_ONLY_IN_MANAGED,
    NO_CHECKPOINT_IN_A_STEADY_SPAN,
    REAL_FAULT_AND_SERVING_AGAIN,
    RESTORES_HAVE_CHECKPOINT_BYTES,
    COUNTS_MATCH_CYCLES,
    ROWS_RECONCILE,
    INPUT_HAS_ROWS,
    INPUT_HAS_PARSED_ROWS,
    QUARANTINE_WITHIN_LIMIT,
    COLUMN_SET.check,
    *(rule.check for rule in COLUMN_RULES),
)


def holds_verdicts(expectation: str) -> bool:
    """Whether a failed result stored as ``expectation`` blocks the verdicts that need its
    gate (an unknown name does: a failure nobody declared is no reason to pass)."""
    return not any(c.matches(expectation) for c in CHECKS if not c.holds_verdicts)


def gate_of_trials(measure: str) -> Gate | None:
    """The gate whose checks judge the trials of ``measure`` (a trials.measure)."""
    return next((g for g in GATES if g.trials == measure), None)
