"""Comparability gates: Great Expectations suites built from the dataset declarations.

A gate validates a dataset's rows before a stage reports them. Every check's result is stored
in the ``gates`` dataset, and a failure raises ``GateFailed`` naming the expectation and what
it saw, which blocks the report.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tasks.data.datasets import GATES, DatasetSpec
from tasks.data.errors import GateFailed
from tasks.data.runctx import RunContext
from tasks.data.store import write_dataset

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


@dataclass(frozen=True)
class CheckResult:
    gate: str
    dataset: str
    expectation: str
    column: str | None
    success: bool
    observed: dict[str, Any]

    def describe(self) -> str:
        target = f"{self.dataset}.{self.column}" if self.column else self.dataset
        return f"{self.expectation} on {target}: observed {json.dumps(self.observed, default=str)}"


@functools.cache
def _context() -> Any:
    """One ephemeral GX context per process (nothing written to disk), progress bars off."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


def build_suite(spec: DatasetSpec) -> Any:
    """The GX expectation suite a dataset's declaration implies."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    _context()

    suite = gx.ExpectationSuite(name=f"ckpt_poc.{spec.name}.v{spec.version}")
    suite.add_expectation(
        gxe.ExpectTableColumnsToMatchSet(column_set=spec.column_names, exact_match=True)
    )
    for col in spec.columns:
        if not col.nullable:
            suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(column=col.name))
        if col.allowed is not None:
            suite.add_expectation(
                gxe.ExpectColumnValuesToBeInSet(column=col.name, value_set=list(col.allowed))
            )
        if col.min is not None or col.max is not None:
            suite.add_expectation(
                gxe.ExpectColumnValuesToBeBetween(
                    column=col.name, min_value=col.min, max_value=col.max
                )
            )
    return suite


# Rows GX validates per dataset: larger tables (a long accounting history) are validated on
# a seeded random sample of this many rows, and every check says so in `observed`.
GX_MAX_ROWS = int(os.environ.get("CKPT_POC_GX_MAX_ROWS", 250_000))


def _gx_frame(data: pd.DataFrame | pa.Table, max_rows: int) -> tuple[pd.DataFrame, int]:
    """NumPy-backed pandas (what GX's pandas engine expects), sampled above max_rows."""
    table = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)
    total = table.num_rows
    if total > max_rows:
        rng = np.random.default_rng(0)
        table = table.take(pa.array(np.sort(rng.choice(total, max_rows, replace=False))))
    plain = pa.schema(
        [
            pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type) else f
            for f in table.schema
        ]
    )
    return table.cast(plain).to_pandas(), total


def validate_dataset(
    gate: str, spec: DatasetSpec, data: pd.DataFrame | pa.Table, max_rows: int = GX_MAX_ROWS
) -> list[CheckResult]:
    """Run the declaration's GX suite on ``data``; one CheckResult per expectation."""
    frame, total = _gx_frame(data, max_rows)
    source = _context().data_sources.add_pandas(name=f"{spec.name}-{uuid.uuid4().hex}")
    asset = source.add_dataframe_asset(name=spec.name)
    batch_def = asset.add_batch_definition_whole_dataframe(f"{spec.name}_whole")
    batch = batch_def.get_batch(batch_parameters={"dataframe": frame})
    result = batch.validate(build_suite(spec), result_format="SUMMARY")
    checks = []
    for r in result.results:
        cfg = r.expectation_config
        observed: dict[str, Any] = {
            k: v
            for k, v in (r.result or {}).items()
            if k
            in (
                "element_count",
                "unexpected_count",
                "unexpected_percent",
                "partial_unexpected_list",
                "observed_value",
                "details",
            )
        }
        observed.update(rows_validated=len(frame), rows_total=total)
        if r.exception_info and r.exception_info.get("raised_exception"):
            observed["exception"] = r.exception_info.get("exception_message")
        checks.append(
            CheckResult(
                gate, spec.name, cfg.type, cfg.kwargs.get("column"), bool(r.success), observed
            )
        )
    return checks


def plain_check(gate: str, dataset: str, name: str, success: bool, **observed: Any) -> CheckResult:
    """A gate check that is a domain rule rather than a column expectation."""
    return CheckResult(gate, dataset, name, None, bool(success), observed)


def record_and_enforce(checks: Sequence[CheckResult], ctx: RunContext) -> None:
    """Store every check in the ``gates`` dataset, then raise GateFailed if any failed."""
    now = dt.datetime.now(dt.UTC)
    rows = [
        {
            **ctx.stamp(),
            "gate": c.gate,
            "dataset": c.dataset,
            "expectation": c.expectation,
            "column": c.column,
            "success": c.success,
            "observed": json.dumps(c.observed, default=str),
            "checked_at": now,
        }
        for c in checks
    ]
    if rows:
        write_dataset(
            pd.DataFrame(rows),
            GATES,
            data_dir=ctx.data_dir,
            poc=ctx.poc,
            run_id=ctx.run_id,
            metadata=ctx.file_metadata,
        )
    failed = [c for c in checks if not c.success]
    if failed:
        raise GateFailed(failed[0].gate, [c.describe() for c in failed])
