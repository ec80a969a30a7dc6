"""The baseline stage's domain logic: accounting in, validated datasets and exposure out.

Two paths with the same results: in memory (one parquet file per dataset and run), and for
histories larger than memory a streaming one that writes the jobs dataset block by block and
aggregates with Dask out of core. ``run_baseline`` picks by input size unless told.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np
import pandas as pd
import pyarrow as pa

from tasks.baseline import accounting as acct
from tasks.baseline.exposure import (
    EXPOSED_STATES,
    EXPOSURE_INPUT_COLUMNS,
    BaselineSummary,
    Exposure,
    combine_parts,
    compute_exposure,
    exposure_part,
)
from tasks.baseline.source_slurmrestd import RestClient, read_slurmrestd
from tasks.baseline.time_formats import file_anchor
from tasks.data.arrow_memory import stage_allocator
from tasks.data.datasets import DATASETS, EXPOSURE, JOBS, QUARANTINE
from tasks.data.errors import AccountingError
from tasks.data.gates import (
    CheckResult,
    plain_check,
    record_and_enforce,
    validate_dataset,
    warmed,
)
from tasks.data.plan import Plan, SlurmrestdSource
from tasks.data.runctx import RunContext
from tasks.data.secret_blocks import load_secret_block
from tasks.data.settings import settings
from tasks.data.store import stage_dataset, write_dataset

log = logging.getLogger(__name__)


@dataclass
class Ingested:
    """Parsed accounting before it is stamped and written."""

    jobs: pa.Table
    quarantine: list[acct.Quarantined]
    rows_read: int
    source: str
    fields: tuple[str, ...] = ()  # the known fields the dump has
    gpu_sources: dict[str, int] = field(default_factory=dict)
    time_formats: dict[str, str] = field(default_factory=dict)  # time field → format read
    short_rows: int = 0  # rows short of trailing fields, read with those fields empty

    @property
    def rows_parsed(self) -> int:
        return self.jobs.num_rows


@dataclass
class BaselineResult:
    summary: BaselineSummary
    exposure: Exposure
    source: str
    path: str  # "memory" or "dask"
    written: dict[str, list[Path]] = field(default_factory=dict)
    key_origin: str = ""
    time_formats: dict[str, str] = field(default_factory=dict)  # time field → format read
    short_rows: int = 0  # rows short of trailing fields, read with those fields empty
    # Parsed allocation rows per source of their GPU count (acct.GPU_SOURCES or "none").
    gpu_sources: dict[str, int] = field(default_factory=dict)


def ingest_stream(
    stream: io.BufferedIOBase,
    source: str,
    pseudonymiser: acct.Pseudonymiser,
    *,
    delimiter: bytes | None = None,
    sacct_format: str | None = None,
    pseudonymise_job_names: bool = False,
    relative_to: tuple[dt.date, str] | None = None,
) -> Ingested:
    tables, quarantine, rows_read, short_rows = [], [], 0, 0
    fields: tuple[str, ...] = ()
    gpu_sources: dict[str, int] = {}
    time_formats: dict[str, str] = {}
    for block in acct.parse_sacct_stream(
        stream,
        source,
        pseudonymiser,
        delimiter=delimiter,
        sacct_format=sacct_format,
        pseudonymise_job_names=pseudonymise_job_names,
        relative_to=relative_to,
    ):
        tables.append(block.jobs)
        quarantine.extend(block.quarantine)
        rows_read += block.rows_read
        short_rows += block.short_rows
        fields, time_formats = block.fields, block.time_formats
        _add_counts(gpu_sources, block.gpu_sources)
    # One dictionary per column across the blocks: exposure needs them so, and unified here
    # the blocks' own index buffers are freed before its peak, not held beside its copies.
    jobs = pa.concat_tables(tables).unify_dictionaries() if tables else _empty_jobs()
    del tables
    return Ingested(
        jobs, quarantine, rows_read, source, fields, gpu_sources, time_formats, short_rows
    )


def _add_counts(total: dict[str, int], more: dict[str, int]) -> None:
    for key, n in more.items():
        total[key] = total.get(key, 0) + n


def _not_computed(fields: tuple[str, ...], rows_read: int) -> dict[str, str]:
    """Measure → "the dump lacks …" (an input without rows has no fields to judge by; the
    gate refuses it for being empty)."""
    return acct.not_computed(fields) if rows_read else {}


def _with_not_computed(exp: Exposure, missing: dict[str, str]) -> Exposure:
    """The exposure marked with what the dump could not give; without account and job name
    every workload would be one pseudonym of nothing, so none is ranked."""
    candidates = exp.candidates.iloc[0:0] if "candidates" in missing else exp.candidates
    return dataclasses.replace(exp, not_computed=missing, candidates=candidates)


def _not_computed_metadata(
    missing: dict[str, str], ctx: RunContext, time_formats: dict[str, str] | None = None
) -> dict[str, str]:
    """File metadata saying which measures the dump could not give (their columns hold
    zeros there, as the declarations take no nulls in them) and, for the jobs, which
    format each time field was read in."""
    metadata = {**ctx.file_metadata, "ckpt_poc.not_computed": json.dumps(missing)}
    if time_formats is not None:
        metadata["ckpt_poc.time_formats"] = json.dumps(time_formats)
    return metadata


def _empty_jobs() -> pa.Table:
    schema = JOBS.arrow_schema
    return pa.table({c: pa.array([], schema.field(c).type) for c in acct.JOB_COLUMNS})


def stamp_jobs(jobs: pa.Table, ctx: RunContext) -> pa.Table:
    """Add run identity and fingerprint columns to parsed job rows.

    Each is one value for the whole run: a dictionary array of that one value, every column
    over the same buffer of zero indices, costs four bytes a row for all of them together,
    where a repeated value would cost its full size a row per column (at 5 M rows the three
    integer ones alone were 120 MB, held through the exposure). Parquet stores the integers
    as their declared type and gives them back plain (store.conform).
    """
    zeros = pa.array(np.zeros(jobs.num_rows, dtype=np.int32))
    for name, value in ctx.stamp().items():
        declared = JOBS.column(name).type
        jobs = jobs.append_column(
            name, pa.DictionaryArray.from_arrays(zeros, pa.array([value], declared))
        )
    return jobs


def quarantine_frame(items: list[acct.Quarantined], source: str, ctx: RunContext) -> pd.DataFrame:
    now = dt.datetime.now(dt.UTC)
    return pd.DataFrame(
        [
            {
                **ctx.stamp(),
                "source": source,
                "source_line": q.source_line,
                "reason": q.reason,
                "raw": q.raw,
                "read_at": now,
            }
            for q in items
        ],
        columns=QUARANTINE.column_names,
    )


def exposure_frame(exp: Exposure, ctx: RunContext) -> pd.DataFrame:
    now = dt.datetime.now(dt.UTC)
    start, end = exp.window
    common = {
        **ctx.stamp(),
        "window_start": start,
        "window_end": end,
        "computed_at": now,
        "provenance": "measured",
    }
    rows = []
    for state, r in exp.by_state.iterrows():
        exposed = state in EXPOSED_STATES
        rows.append(
            {
                **common,
                "kind": "state",
                "state": state,
                "workload": None,
                "allocations": int(r["allocations"]),
                "node_hours": float(r["node_hours"]),
                "gpu_hours": float(r["gpu_hours"]),
                "exposed_gpu_hours": float(r["gpu_hours"]) if exposed else 0.0,
                "timeout_gpu_hours": float(r["gpu_hours"]) if state == "TIMEOUT" else 0.0,
                "exposed_allocations": int(r["allocations"]) if exposed else 0,
                "chains": 0,  # chains are counted per workload (kind=candidate)
                "rank": None,
            }
        )
    for _, r in exp.candidates.iterrows():
        rows.append(
            {
                **common,
                "kind": "candidate",
                "state": None,
                "workload": r["workload"],
                "allocations": int(r["allocations"]),
                "node_hours": float(r["node_hours"]),
                "gpu_hours": float(r["gpu_hours"]),
                "exposed_gpu_hours": float(r["exposed_gpu_hours"]),
                "timeout_gpu_hours": float(r["timeout_gpu_hours"]),
                "exposed_allocations": int(r["exposed_allocations"]),
                "chains": int(r["chains"]),
                "rank": int(r["rank"]),
            }
        )
    return pd.DataFrame(rows, columns=EXPOSURE.column_names)


def baseline_checks(
    ingested_rows: int,
    parsed: int,
    quarantined: int,
    frames: dict[str, pd.DataFrame | pa.Table],
    max_quarantined_share: float = 0.5,
    validated: dict[str, list[CheckResult]] | None = None,
) -> list[CheckResult]:
    """The gate before the baseline reports: declarations hold, the counts reconcile, and
    what was quarantined leaves enough to report on. ``validated``: a frame's declaration
    checks already run (beside other work), in the place its frame has."""
    gate = "baseline"
    share = quarantined / ingested_rows if ingested_rows else 0.0
    checks = [
        plain_check(
            gate,
            "jobs",
            "rows_read_equals_parsed_plus_quarantined",
            ingested_rows == parsed + quarantined,
            rows_read=ingested_rows,
            parsed=parsed,
            quarantined=quarantined,
        ),
        plain_check(gate, "jobs", "input_has_rows", ingested_rows > 0, rows_read=ingested_rows),
        # An input whose every row was quarantined has nothing to report: an empty
        # exposure would read as "no exposure".
        plain_check(
            gate,
            "jobs",
            "input_has_parsed_rows",
            ingested_rows == 0 or parsed > 0,
            rows_read=ingested_rows,
            parsed=parsed,
        ),
        plain_check(
            gate,
            "quarantine",
            "quarantined_share_within_plan_limit",
            share <= max_quarantined_share,
            quarantined_share=round(share, 4),
            max_quarantined_share=max_quarantined_share,
            why=(
                f"{quarantined} of {ingested_rows} rows quarantined ({share:.1%}); the "
                f"plan's baseline.max_quarantined_share is {max_quarantined_share:.1%}"
            ),
        ),
    ]
    for spec_name, df in frames.items():
        if validated and spec_name in validated:
            checks.extend(validated[spec_name])
        else:
            checks.extend(_declaration_checks(spec_name, df))
    return checks


def _declaration_checks(spec_name: str, frame: pd.DataFrame | pa.Table) -> list[CheckResult]:
    """The baseline gate's checks of a frame against its dataset's declaration (none for an
    empty frame: the counts checks speak for it)."""
    return validate_dataset("baseline", DATASETS[spec_name], frame) if len(frame) else []


def open_accounting(
    plan: Plan, sacct_file: str | None, live: bool, now: dt.datetime | None = None
) -> tuple[io.BufferedIOBase, str, int]:
    """The accounting input the plan (or the CLI's override) names: (stream, source, bytes)."""
    if live or (sacct_file is None and plan.baseline.source.kind == "sacct-live"):
        end = now or dt.datetime.now(dt.UTC).replace(tzinfo=None)
        start = end - dt.timedelta(days=plan.baseline.days)
        clusters = getattr(plan.baseline.source, "clusters", [])
        data = acct.run_sacct_live(start, end + dt.timedelta(seconds=1), clusters)
        # Day chunks report a job once per day it spans: keep the first copy of each line.
        lines = list(dict.fromkeys(line for line in data.split(b"\n") if line.strip()))
        data = b"\n".join(lines) + b"\n" if lines else b""
        return io.BytesIO(data), "sacct-live", len(data)
    source = plan.baseline.source
    if sacct_file is None and isinstance(source, SlurmrestdSource):
        return _open_slurmrestd(source, plan.baseline.days, now)
    path = sacct_file or getattr(source, "path", None)
    if path is None:
        raise AccountingError("no accounting input: give --sacct-file, --live or a plan source")
    stream, _kind = acct.open_source(path)
    size = Path(path).stat().st_size
    return stream, str(path), size


def _open_slurmrestd(
    source: SlurmrestdSource, days: int, now: dt.datetime | None
) -> tuple[io.BufferedIOBase, str, int]:
    """The last ``days`` of accounting from slurmrestd, its token from the plan's Secret block."""
    token = load_secret_block(
        source.token_secret, "the slurmrestd token (baseline.source.token_secret)"
    )
    client = RestClient(source.url, token, source.user, source.timeout_s)
    end = now or dt.datetime.now(dt.UTC).replace(tzinfo=None)
    data, requests = read_slurmrestd(
        client, end - dt.timedelta(days=days), end + dt.timedelta(seconds=1), source.window_days
    )
    log.info("slurmrestd %s: %d requests, %d bytes", source.url, requests, len(data))
    return io.BytesIO(data), f"slurmrestd {source.url}", len(data)


def run_baseline(
    plan: Plan,
    ctx: RunContext,
    *,
    sacct_file: str | None = None,
    live: bool = False,
    use_dask: bool | None = None,
    delimiter: bytes | None = None,
    sacct_format: str | None = None,
    dumped_on: dt.date | None = None,
) -> BaselineResult:
    """Ingest, gate, write and summarise; nothing is written unless its gate passes.

    ``delimiter`` overrides the dump's (see acct.detect_layout); ``sacct_format`` names the
    fields of a header-less dump, in sacct's --format syntax; ``dumped_on`` the day sacct
    wrote a dump with relative times, where the file's mtime is not it (a copy without -p).
    """
    key, key_origin = acct.load_pseudonym_key(plan.baseline.pseudonym_key_secret)
    pseudonymiser = acct.Pseudonymiser(key)
    stream, source, size = open_accounting(plan, sacct_file, live)
    # Relative times are dated by the day the dump was written (tasks.baseline.time_formats);
    # live sacct and slurmrestd are read in the standard format, a file has an mtime.
    if dumped_on is not None:
        anchor: tuple[dt.date, str] | None = (dumped_on, f"--dumped-on {dumped_on.isoformat()}")
    else:
        anchor = file_anchor(source) if Path(source).is_file() else None
    reading = _Reading(delimiter, sacct_format, anchor)
    # GX imports in its worker while a big dump is parsed.
    with stream, warmed(size), stage_allocator():
        # Above settings' dask_threshold_bytes, Dask (a 20 M-row history is about 4 GB).
        if use_dask if use_dask is not None else size > settings().dask_threshold_bytes:
            result = _run_dask(stream, source, pseudonymiser, plan, ctx, reading)
        else:
            result = _run_in_memory(stream, source, pseudonymiser, plan, ctx, reading)
    result.key_origin = key_origin
    return result


@dataclass(frozen=True)
class _Reading:
    """How to read the dump, when it does not say itself."""

    delimiter: bytes | None = None
    sacct_format: str | None = None
    relative_to: tuple[dt.date, str] | None = None  # the day sacct ran, and how it is known


class _StoreArgs(TypedDict):
    """write_dataset's and stage_dataset's keyword arguments: where and under which run."""

    data_dir: Path
    poc: str
    run_id: str
    metadata: dict[str, str]


def _store_args(ctx: RunContext) -> _StoreArgs:
    """Where and under which run this stage writes its datasets."""
    return {
        "data_dir": ctx.data_dir,
        "poc": ctx.poc,
        "run_id": ctx.run_id,
        "metadata": ctx.file_metadata,
    }


def _run_in_memory(
    stream: io.BufferedIOBase,
    source: str,
    pseudonymiser: acct.Pseudonymiser,
    plan: Plan,
    ctx: RunContext,
    reading: _Reading,
) -> BaselineResult:
    ingested = ingest_stream(
        stream,
        source,
        pseudonymiser,
        delimiter=reading.delimiter,
        sacct_format=reading.sacct_format,
        pseudonymise_job_names=plan.baseline.pseudonymise_job_names,
        relative_to=reading.relative_to,
    )
    missing = _not_computed(ingested.fields, ingested.rows_read)
    with_states = "State" in ingested.fields or not ingested.rows_read
    jobs = stamp_jobs(ingested.jobs, ctx)
    common = _store_args(ctx)
    jobs_metadata = _not_computed_metadata(missing, ctx, ingested.time_formats)
    # Exposure is one thread's work: the jobs are written (under temp names) and gated beside
    # it, and published only once every gate passes. At 5 M rows the write is about 3 CPU-s
    # and the gate about 1, where a core is free beside the exposure.
    staged_jobs = stage_dataset(jobs, JOBS, **{**common, "metadata": jobs_metadata})
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="jobs-gate") as pool:
            jobs_checks = pool.submit(_declaration_checks, "jobs", jobs)
            exp = compute_exposure(ingested.jobs, "chains" not in missing, with_states)
            exp = _with_not_computed(exp, missing)
            q_df = quarantine_frame(ingested.quarantine, source, ctx)
            e_df = exposure_frame(exp, ctx)
            checks = baseline_checks(
                ingested.rows_read,
                ingested.rows_parsed,
                len(ingested.quarantine),
                {"jobs": jobs, "quarantine": q_df, "exposure": e_df},
                plan.baseline.max_quarantined_share,
                validated={"jobs": jobs_checks.result()},
            )
        record_and_enforce(checks, ctx)
    except BaseException:
        staged_jobs.discard()
        raise
    measured = {**common, "metadata": _not_computed_metadata(missing, ctx)}
    written = {
        "jobs": staged_jobs.publish(),
        "quarantine": write_dataset(q_df, QUARANTINE, **common),
        "exposure": write_dataset(e_df, EXPOSURE, **measured),
    }
    summary = exp.summary(
        ingested.rows_read, len(ingested.quarantine), ingested.time_formats, ingested.short_rows
    )
    return BaselineResult(
        summary,
        exp,
        source,
        "memory",
        written,
        gpu_sources=ingested.gpu_sources,
        time_formats=ingested.time_formats,
        short_rows=ingested.short_rows,
    )


def _run_dask(
    stream: io.BufferedIOBase,
    source: str,
    pseudonymiser: acct.Pseudonymiser,
    plan: Plan,
    ctx: RunContext,
    reading: _Reading,
) -> BaselineResult:
    """Stream blocks to part files, then aggregate the written jobs out of core with Dask."""
    common = _store_args(ctx)
    rows_read, quarantine, parsed, written_jobs, short = 0, [], 0, [], 0
    fields: tuple[str, ...] = ()
    gpu_sources: dict[str, int] = {}
    time_formats: dict[str, str] = {}
    for i, block in enumerate(
        acct.parse_sacct_stream(
            stream,
            source,
            pseudonymiser,
            delimiter=reading.delimiter,
            sacct_format=reading.sacct_format,
            pseudonymise_job_names=plan.baseline.pseudonymise_job_names,
            relative_to=reading.relative_to,
        )
    ):
        rows_read += block.rows_read
        short += block.short_rows
        time_formats = block.time_formats
        parsed += block.jobs.num_rows
        quarantine.extend(block.quarantine)
        fields = block.fields
        _add_counts(gpu_sources, block.gpu_sources)
        # The dump's fields, and so what it lacks, are known from its first block on.
        metadata = _not_computed_metadata(acct.not_computed(fields), ctx, time_formats)
        written_jobs += write_dataset(
            stamp_jobs(block.jobs, ctx), JOBS, part=i, **{**common, "metadata": metadata}
        )
    missing = _not_computed(fields, rows_read)
    with_states = "State" in fields or not rows_read
    exp = exposure_with_dask(written_jobs, "chains" not in missing, with_states)
    exp = _with_not_computed(exp, missing)
    q_df = quarantine_frame(quarantine, source, ctx)
    e_df = exposure_frame(exp, ctx)
    checks = baseline_checks(
        rows_read,
        parsed,
        len(quarantine),
        {"quarantine": q_df, "exposure": e_df},
        plan.baseline.max_quarantined_share,
    )
    record_and_enforce(checks, ctx)
    written = {
        "jobs": written_jobs,
        "quarantine": write_dataset(q_df, QUARANTINE, **common),
        "exposure": write_dataset(
            e_df, EXPOSURE, **{**common, "metadata": _not_computed_metadata(missing, ctx)}
        ),
    }
    summary = exp.summary(rows_read, len(quarantine), time_formats, short)
    return BaselineResult(
        summary,
        exp,
        source,
        "dask",
        written,
        gpu_sources=gpu_sources,
        time_formats=time_formats,
        short_rows=short,
    )


def exposure_with_dask(
    files: list[Path], with_chains: bool = True, with_states: bool = True
) -> Exposure:
    """Exposure over this run's jobs files without loading them whole.

    Allocations are read with only the columns exposure needs and shuffled on disk by
    (user, account, job name), so each partition holds whole chains; each partition's
    exposure is computed alone and the small results are combined.
    """
    import dask
    import dask.dataframe as dd

    ddf = dd.read_parquet(
        [str(f) for f in files],
        columns=[*EXPOSURE_INPUT_COLUMNS, "is_allocation"],
        dtype_backend="pyarrow",
    )
    ddf = ddf.astype({c: JOBS.pandas_dtypes[c] for c in ddf.columns})  # dictionary → plain
    ddf = ddf[ddf["is_allocation"]]
    ddf = ddf.assign(wkey=ddf["user"] + "\x1f" + ddf["account"] + "\x1f" + ddf["job_name"])
    with dask.config.set({"dataframe.shuffle.method": "disk"}):
        shuffled = ddf.shuffle(on="wkey", npartitions=max(1, ddf.npartitions))
        parts = shuffled.map_partitions(
            lambda part: pd.DataFrame(
                {"part": [exposure_part(part.drop(columns="wkey"), with_chains)]}
            ),
            meta={"part": object},
        )
        (result,) = dask.compute(parts)
    return combine_parts(list(result["part"]), with_states=with_states)
