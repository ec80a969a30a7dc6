"""Comparability gates: Great Expectations suites built from the dataset declarations.

A gate validates a dataset's rows before a stage reports them. Every check's result is stored
in the ``gates`` dataset, and a failure raises ``GateFailed`` naming the expectation and what
it saw, which blocks the report.

A large table is validated twice over: GX runs the suite on a seeded sample, and the same
column expectations are checked exactly over every row in pyarrow (``exact_checks``), so a
rare bad row the sample misses still fails the gate. Both run the declaration rules of the
check catalogue (tasks.data.checks), one declaration each. Importing GX and building its context
costs seconds: inside ``warmed()`` that happens in a worker process (tasks.data.gx_worker)
while the caller parses its input, and the suites run there.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tasks.data import gx_worker
from tasks.data.checks import BETWEEN, COLUMN_RULES, COLUMN_SET, IN_SET, NOT_NULL
from tasks.data.cpus import usable_cpus
from tasks.data.dataset_spec import Column
from tasks.data.datasets import DATASETS, GATES, DatasetSpec
from tasks.data.errors import GateFailed
from tasks.data.runctx import RunContext
from tasks.data.settings import settings
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


_CONTEXT_LOCK = threading.Lock()
_CONTEXT: list[Any] = []  # the one context, once built


def _context() -> Any:
    """One ephemeral GX context per process (nothing written to disk), progress bars off.
    The lock makes a caller wait for a warm-up thread's build rather than start a second."""
    with _CONTEXT_LOCK:
        if not _CONTEXT:
            _CONTEXT.append(_build_context())
        return _CONTEXT[0]


def _build_context() -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


_ACTIVE: list[gx_worker.GxWorker] = []  # the worker of the warmed() block running, if any


@contextlib.contextmanager
def warmed(input_bytes: int | None = None) -> Iterator[None]:
    """Gates inside run on GX warmed in a worker process, started now so that its import
    overlaps the caller's work on an input of ``input_bytes`` (see _worker_wanted).
    ``CKPT_POC_GX_WORKER=1`` or ``0`` decides instead."""
    if _CONTEXT or _ACTIVE or not _worker_wanted(input_bytes):
        yield
        return
    try:
        worker = gx_worker.start()
    except OSError as exc:  # no interpreter to start: the gates validate in process
        logging.getLogger(__name__).warning("GX worker not started (%s)", exc)
        yield
        return
    _ACTIVE.append(worker)
    try:
        yield
    finally:
        _ACTIVE.remove(worker)
        gx_worker.stop(worker)


def _worker_wanted(input_bytes: int | None = None) -> bool:
    """With 4 cores, always. With fewer, for an input big enough to keep this process busy
    through GX's import: 2 cores, ours at 1 M rows (-P) 8.1 → 6.0 s with the worker, the
    same jobs as sacct --json 18.2 → 14.6 s, 5 M rows 25.9 → 20.4 s (the parse, which
    uses both cores, no slower). A small input has no work to hide the import behind, and a
    context built in this process serves every later gate of the process."""
    asked = settings().gx_worker
    if asked is not None:
        return asked
    if usable_cpus() >= _WORKER_MIN_CORES:
        return True
    return input_bytes is not None and input_bytes >= _WORKER_MIN_INPUT_BYTES


_WORKER_MIN_CORES = 4
_WORKER_MIN_INPUT_BYTES = 64 << 20  # -P: about 300 k rows, a second of parsing on 2 cores


def build_suite(spec: DatasetSpec) -> Any:
    """The GX expectation suite a dataset's declaration implies."""
    import great_expectations as gx
    import great_expectations.expectations as gxe

    _context()

    suite = gx.ExpectationSuite(name=f"ckpt_poc.{spec.name}.v{spec.version}")
    suite.add_expectation(getattr(gxe, COLUMN_SET.gx)(**COLUMN_SET.gx_kwargs(spec)))
    for col in spec.columns:
        for rule in COLUMN_RULES:
            if rule.applies(col):
                suite.add_expectation(getattr(gxe, rule.gx)(**rule.gx_kwargs(col)))
    return suite


# Rows GX validates per dataset: a larger table (a long accounting history) is validated by GX
# on a seeded random sample of this many rows, and checked exactly over every row in pyarrow
# (exact_checks); every check says which in `observed`.
GX_MAX_ROWS = settings().gx_max_rows
_UNEXPECTED_SHOWN = 20  # unexpected values named in a failed exact check, as GX's partial list


def _sample(data: pd.DataFrame | pa.Table, max_rows: int) -> tuple[pa.Table, int]:
    """The rows GX sees (a seeded sample above max_rows), dictionaries decoded (GX's pandas
    engine expects NumPy-backed columns), and the table's row count."""
    table = _as_table(data)
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
    return table.cast(plain), total


def _as_table(data: pd.DataFrame | pa.Table) -> pa.Table:
    return data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)


def validate_dataset(
    gate: str, spec: DatasetSpec, data: pd.DataFrame | pa.Table, max_rows: int = GX_MAX_ROWS
) -> list[CheckResult]:
    """Run the declaration's GX suite on ``data`` (a sample above ``max_rows``, then with the
    column expectations checked exactly on every row as well); one CheckResult per check."""
    sample, total = _sample(data, max_rows)
    checks = None
    if _ACTIVE and DATASETS.get(spec.name) is spec:  # the worker knows the declared ones
        checks = _worker_checks(_ACTIVE[-1], gate, spec, sample, total)
    if checks is None:
        checks = _gx_checks(gate, spec, sample.to_pandas(), total)
    if total > sample.num_rows:
        checks.extend(exact_checks(gate, spec, _as_table(data)))
    return checks


def _worker_checks(
    worker: gx_worker.GxWorker, gate: str, spec: DatasetSpec, sample: pa.Table, total: int
) -> list[CheckResult] | None:
    return worker.checks(gate, spec.name, sample, total)


def _gx_checks(gate: str, spec: DatasetSpec, frame: pd.DataFrame, total: int) -> list[CheckResult]:
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


def exact_checks(gate: str, spec: DatasetSpec, table: pa.Table) -> list[CheckResult]:
    """The suite's column rules (the catalogue's COLUMN_RULES, as build_suite adds them) over
    every row, in pyarrow (nulls are not judged by the set and range checks, as in GX).
    Column set: GX's check on the sample is the same."""
    checks = []
    total = table.num_rows
    for col in spec.columns:
        values = table.column(col.name) if col.name in table.column_names else None
        if values is None:
            continue  # GX's column-set check on the sample fails for it
        found = [
            (rule.check.name, *_EXACT[rule.check.name](values, col))
            for rule in COLUMN_RULES
            if rule.applies(col)
        ]
        for name, bad, shown in found:
            observed = {
                "element_count": total,
                "unexpected_count": bad,
                "unexpected_percent": 100.0 * bad / total if total else 0.0,
                "partial_unexpected_list": shown,
                "rows_validated": total,
                "rows_total": total,
                "engine": "pyarrow (every row)",
            }
            checks.append(CheckResult(gate, spec.name, name, col.name, bad == 0, observed))
    return checks


def _not_in_set(values: pa.ChunkedArray, allowed: Sequence[str]) -> tuple[int, list[Any]]:
    """(rows outside the set, a few of those values); a dictionary column is judged by its
    dictionary entries, weighted by how many rows use each."""
    counts = pc.value_counts(values)
    distinct, n = counts.field("values"), counts.field("counts")
    if pa.types.is_dictionary(distinct.type):
        distinct = distinct.cast(distinct.type.value_type)
    bad = pc.fill_null(pc.invert(pc.is_in(distinct, pa.array(list(allowed)))), False)
    bad = pc.and_(pc.is_valid(distinct), bad)
    shown = distinct.filter(bad).to_pylist()[:_UNEXPECTED_SHOWN]
    return int(pc.sum(n.filter(bad)).as_py() or 0), shown


def _out_of_range(
    values: pa.ChunkedArray, low: float | None, high: float | None
) -> tuple[int, list[Any]]:
    """(rows below ``low`` or above ``high``, a few of those values); bounds are inclusive."""
    if pa.types.is_dictionary(values.type):  # a run's stamp: one value over every row
        values = values.cast(values.type.value_type)
    limits = pc.min_max(values)
    lo, hi = limits["min"].as_py(), limits["max"].as_py()
    if lo is None or ((low is None or lo >= low) and (high is None or hi <= high)):
        return 0, []  # the common case: min and max inside, nothing to count
    below = pc.less(values, low) if low is not None else None
    above = pc.greater(values, high) if high is not None else None
    outside = below if above is None else above if below is None else pc.or_(below, above)
    bad = values.filter(pc.fill_null(outside, False))
    return len(bad), bad.slice(0, _UNEXPECTED_SHOWN).to_pylist()


# Each column rule's exact pass: (rows that break it, a few of their values).
_EXACT: dict[str, Callable[[pa.ChunkedArray, Column], tuple[int, list[Any]]]] = {
    NOT_NULL.check.name: lambda values, col: (values.null_count, []),
    IN_SET.check.name: lambda values, col: _not_in_set(values, col.allowed or ()),
    BETWEEN.check.name: lambda values, col: _out_of_range(values, col.min, col.max),
}


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
