"""What every experiment does with its rows: write them all, then gate them."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.data.datasets import TRIALS
from tasks.data.errors import CkptPocError
from tasks.data.fingerprint import FINGERPRINT_COLUMNS
from tasks.data.gates import CheckResult, plain_check, record_and_enforce, validate_dataset
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext
from tasks.data.store import write_dataset


def workload_hash(plan: Plan) -> str:
    """Names the workload exactly: any change to its command, probes or checkpoints shows."""
    return hashlib.sha256(plan.workload.model_dump_json().encode()).hexdigest()[:16]


def require_command_and_progress(plan: Plan, experiment: str) -> None:
    """Every experiment starts copies from an argv list and times them by their progress."""
    if plan.workload.command is None:
        raise CkptPocError(f"{experiment} needs workload.command (an argv list) for its copies")
    if plan.workload.progress_probe is None or plan.workload.progress_probe.log_regex is None:
        raise CkptPocError(f"{experiment} needs workload.progress_probe.log_regex")


# A failed row's dict may carry the tail of its workload's log under this key: for the flow
# run's logs and the report, never a `trials` column (as_trials drops it).
LOG_TAIL = "log_tail"


def failures_of(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each failed row's trial, arm, reason and workload log tail (for logs and reports)."""
    return [
        {k: r.get(k) for k in ("trial_id", "arm", "reason", LOG_TAIL)}
        for r in rows
        if r.get("status") == "failed"
    ]


def as_trials(parts: list[pd.DataFrame], ctx: RunContext) -> pd.DataFrame:
    """An experiment's rows, stamped with the run, in the `trials` column order. A row that
    carries its node's fingerprint (read inside a Slurm job) keeps it; the others get the
    run's (read on the harness's host, which is the node for a local cluster)."""
    frame = pd.concat([p for p in parts if not p.empty] or [pd.DataFrame()], ignore_index=True)
    for name, value in ctx.stamp().items():
        if name in FINGERPRINT_COLUMNS and name in frame.columns:
            frame[name] = frame[name].astype(object).where(frame[name].notna(), value)
        else:
            frame[name] = value
    return frame.reindex(columns=TRIALS.column_names)


def arms_differ_only_in_managed(gate: str, rows: pd.DataFrame) -> list[CheckResult]:
    """One check per column that must hold a single value across both arms' rows: the nodes,
    the workload and the whole run fingerprint (docs/design.md §5.6)."""
    checks = []
    for column in ("nodes", "workload_hash", *FINGERPRINT_COLUMNS):
        distinct = sorted(map(str, rows[column].unique()))
        checks.append(
            plain_check(
                gate,
                "trials",
                f"arms_differ_only_in_managed[{column}]",
                len(distinct) == 1,
                values=distinct,
            )
        )
    return checks


def write_trials(trials: pd.DataFrame, ctx: RunContext) -> list[Path]:
    """Write an experiment's rows to `trials` (every row, failed ones too)."""
    return write_dataset(
        trials,
        TRIALS,
        data_dir=ctx.data_dir,
        poc=ctx.poc,
        run_id=ctx.run_id,
        metadata=ctx.file_metadata,
    )


def write_and_gate(
    trials: pd.DataFrame, ctx: RunContext, gate: str, rule_checks: list[CheckResult]
) -> list[Path]:
    """Write every row (failed ones too: a run is recorded whatever its gates say), then run
    the `trials` schema's suite and the experiment's comparability rules; a failed check
    raises GateFailed, which blocks the report (the run's journal commits it as refused)."""
    files = write_trials(trials, ctx)
    record_and_enforce([*validate_dataset(gate, TRIALS, trials), *rule_checks], ctx)
    return files
