"""The record's Method section: how each figure group was taken, read from its rows (runs,
clocks, faults, hardware, checkpointer version)."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from tasks.data.plan import Plan
from tasks.window.weekly.model import distinct


def version_of(fp_versions: Any, package: str) -> str:
    """The package's version from an fp_versions JSON object ('none' when not there)."""
    try:
        versions = json.loads(fp_versions)
    except (TypeError, ValueError):
        return "none"
    return str(versions.get(package, "none")) if isinstance(versions, dict) else "none"


def _hardware(rows: pd.DataFrame, checkpointer: str) -> str:
    if rows.empty:
        return "no rows"
    versions = distinct(rows["fp_versions"].map(lambda v: version_of(v, checkpointer)))
    mem = distinct(rows["fp_mem_bytes"].map(lambda b: f"{int(b) / 2**30:.1f} GiB"))

    def j(col: str) -> str:
        return ", ".join(distinct(rows[col]))

    return (
        f"hosts {j('fp_host')}; GPU {j('fp_gpu_model')} × {j('fp_gpu_count')}; "
        f"CPU {j('fp_cpu_model')}, {j('fp_cores')} cores; memory {', '.join(mem)}; "
        f"driver {j('fp_driver')}; CUDA {j('fp_cuda')}; kernel {j('fp_kernel')}; "
        f"OS {j('fp_os')}; {checkpointer} {', '.join(versions)}"
    )


def _bytes(series: pd.Series) -> str:
    b = series.dropna().astype(float)
    if b.empty:
        return "none recorded"
    return f"median {b.median() / 1e6:.1f} MB, max {b.max() / 1e6:.1f} MB ({len(b)} rows)"


def method_lines(plan: Plan, trials: pd.DataFrame, util: pd.DataFrame) -> list[tuple[str, str]]:
    """(figure group, how it was taken), from the rows."""
    kind = plan.checkpointer.kind
    out = []
    every = trials
    for measure, title in (
        ("recovery", "Recovery and work lost"),
        ("overhead", "Steady-state overhead"),
        ("cold_start", "Cold start"),
        ("checkpoint", "Checkpoint cost"),
    ):
        rows = every[every["measure"] == measure]
        ok = rows[rows["status"] == "ok"]
        parts = [
            f"{len(ok)} ok / {len(rows) - len(ok)} failed trials in "
            f"{rows['run_id'].nunique()} run(s): {', '.join(distinct(rows['run_id']))}",
            f"clock (start → stop events): {', '.join(distinct(ok['clock'])) or 'none'}",
        ]
        if measure == "recovery":
            faults = ok.groupby(["arm", "fault"], observed=True).size()
            parts.append(
                "killed: "
                + (", ".join(f"{a} {f} ×{n}" for (a, f), n in faults.items()) or "nothing")
            )
            parts.append(f"fault outcome: {', '.join(distinct(ok['fault_outcome'])) or '—'}")
            parts.append(f"components included: {', '.join(distinct(ok['includes'])) or '—'}")
            verified = int(ok["steps_lost"].notna().sum())
            parts.append(
                f"resumed step verified (steps_lost recorded) in {verified} of {len(ok)} "
                f"trials; recoverable point: {', '.join(distinct(ok['recoverable_point']))}"
            )
        if measure == "overhead":
            parts.append(
                f"variants {', '.join(distinct(ok['variant']))}; {ok['pair'].nunique()} A/B pairs"
            )
        if measure == "cold_start":
            parts.append(f"page cache before start: {', '.join(distinct(ok['page_cache']))}")
            gbps = ok["restore_gbps"].dropna()
            if len(gbps):
                parts.append(f"restore throughput median {gbps.median():.3g} GB/s")
        parts.append(f"checkpoint size: {_bytes(ok['checkpoint_bytes'])}")
        parts.append(
            f"nodes {', '.join(distinct(ok['nodes']))}; GPUs per job "
            f"{', '.join(distinct(ok['gpus']))} (from {', '.join(distinct(ok['gpus_from']))})"
        )
        parts.append("hardware: " + _hardware(ok, kind))
        out.append((title, "; ".join(parts)))
    out.append(
        (
            "Goodput and utilization",
            f"{len(util)} utilization rows in {util['run_id'].nunique()} run(s), weeks "
            f"{', '.join(distinct(util['week'])) or 'none'}; workloads "
            f"{', '.join(distinct(util['workload'])) or 'none'}; busy metric "
            f"{', '.join(distinct(util['busy_metric'])) or 'none'}; hardware: "
            + _hardware(util, kind),
        )
    )
    return out
