"""The compatibility stage's rows written to their dataset, then gated (the schema's suite
and the counts), and the matrix written beside the run as markdown."""

from __future__ import annotations

import os
from pathlib import Path

from tasks.data.datasets import COMPATIBILITY
from tasks.data.gates import record_and_enforce, validate_dataset
from tasks.data.runctx import RunContext
from tasks.data.store import write_dataset
from tasks.experiments.compatibility import CompatibilityRun
from tasks.experiments.compatibility_result import (
    GATE,
    CompatibilityResult,
    compatibility_frame,
    compatibility_gate_checks,
    compatibility_markdown,
)

MATRIX = "compatibility.md"


def write_and_gate_compatibility(run: CompatibilityRun, ctx: RunContext) -> list[Path]:
    """Every row (failed cycles and untried workloads too), then its gate; GateFailed on a
    broken row blocks the report (the journal commits the run as refused)."""
    frame = compatibility_frame(run, ctx)
    files = write_dataset(
        frame,
        COMPATIBILITY,
        data_dir=ctx.data_dir,
        poc=ctx.poc,
        run_id=ctx.run_id,
        metadata=ctx.file_metadata,
    )
    record_and_enforce(
        [*validate_dataset(GATE, COMPATIBILITY, frame), *compatibility_gate_checks(frame)], ctx
    )
    return files


def write_matrix(result: CompatibilityResult) -> Path:
    """The markdown matrix in the run's folder (atomically), for a reader without Prefect."""
    path = Path(result.run_dir) / MATRIX
    tmp = path.with_name(f".{MATRIX}.tmp")
    tmp.write_text(compatibility_markdown(result), encoding="utf-8")
    os.replace(tmp, path)
    return path
