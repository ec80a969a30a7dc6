"""The decision record: one document (HTML and PDF) that the PoC ends in.

Plain functions, no Prefect (the ``record`` flow wraps ``build_record``). Everything in it is
read from the committed datasets: the verdict rows are ``tasks.window.weekly.weekly_report_rows``
of the latest week with data (trial-based rows pool the comparability segment to date), and
every other figure comes from the rows named beside it. Nothing is typed by hand.

The document is built once as a list of blocks (heading, paragraph, table, preformatted) and
rendered twice, to HTML and to PDF (fpdf2, DejaVu Sans from matplotlib's own data), so both
carry the same sections and the same numbers.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tasks.data.datasets import EXIT_DIFF, JOBS, read_dataset
from tasks.data.plan import Plan
from tasks.data.render import ci as _ci
from tasks.data.render import number as _fmt
from tasks.data.render import records as _records
from tasks.data.runctx import RunContext
from tasks.data.runs import committed_runs
from tasks.data.weeks import current_week
from tasks.experiments.stats import bootstrap_ci
from tasks.window.weekly.model import TITLES
from tasks.window.weekly.rows import read_frames, weekly_report_rows
from tasks.window.weekly.segments import week_label, week_start

# The plan-judged measures, as the record's `verdicts` names them.
VERDICT_MEASURES = (
    "recovery_s",
    "work_lost_gpu_h",
    "goodput_gain",
    "overhead_pct",
    "cold_start_speedup",
)
# The section headings, in order: the test checks each is in the HTML and the PDF text.
SECTIONS = (
    "Verdicts",
    "Measures against the plan",
    "Method",
    "Measured and extrapolated",
    "The six mistakes",
    "Baseline",
    "The way out",
    "Change points and gaps",
    "Weeks",
    "Lineage",
)
VERDICT_HEADS = (
    "measure",
    "arm",
    "basis",
    "n",
    "weeks",
    "value",
    "95% CI",
    "threshold",
    "verdict",
)
# The cold-start clocks, computed here per arm (the weekly rows carry only their ratio).
COLD_START_CLOCKS = {"unmanaged": "cold_start_native_s", "managed": "cold_start_restore_s"}
TITLES_HERE = {
    **TITLES,
    "cold_start_native_s": "cold start, native (launch → ready)",
    "cold_start_restore_s": "cold start, restore (restore start → ready)",
}
# The rows of the weekly report each figure comes from: (dataset, trials.measure or None).
FIGURE_SOURCES: dict[str, tuple[str, str | None]] = {
    "recovery_s": ("trials", "recovery"),
    "work_lost_gpu_h": ("trials", "recovery"),
    "overhead_pct": ("trials", "overhead"),
    "cold_start_speedup": ("trials", "cold_start"),
    "cold_start_native_s": ("trials", "cold_start"),
    "cold_start_restore_s": ("trials", "cold_start"),
    "checkpoint_dump_s": ("trials", "checkpoint"),
    "checkpoint_freeze_s": ("trials", "checkpoint"),
    "goodput": ("utilization", None),
    "utilization": ("utilization", None),
    "goodput_gain": ("utilization", None),
    "checkpoint_interval_s": ("trials", None),
    "waste_fraction": ("trials", None),
    "goodput_gain_expected": ("trials", None),
    "exit_leftovers": ("exit_verdicts", None),
}
N_RESAMPLES = 10_000
HISTORY_RESAMPLES = 1_000  # past weeks' CIs in the weeks table only (months of weeks)


def record_dir(data_dir: str | Path, poc: str) -> Path:
    return Path(data_dir) / poc / "record"


# --- the document model ------------------------------------------------------------------------


@dataclass
class Block:
    kind: str  # h1, h2, h3, p, pre, table
    text: str = ""
    heads: Sequence[str] = ()
    rows: Sequence[Sequence[Any]] = ()
    classes: Sequence[str] = ()


class Doc:
    def __init__(self) -> None:
        self.blocks: list[Block] = []

    def h(self, level: int, text: str) -> None:
        self.blocks.append(Block(f"h{level}", text))

    def p(self, text: str) -> None:
        self.blocks.append(Block("p", text))

    def pre(self, text: str) -> None:
        self.blocks.append(Block("pre", text))

    def table(
        self, heads: Sequence[str], rows: Sequence[Sequence[Any]], classes: Sequence[str] = ()
    ) -> None:
        if not rows:
            self.p("none")
            return
        cells = [["" if c is None else str(c) for c in r] for r in rows]
        self.blocks.append(Block("table", heads=list(heads), rows=cells, classes=list(classes)))


# --- reading the rows --------------------------------------------------------------------------


def _week_col(df: pd.DataFrame, col: str) -> pd.Series:
    return df[col].dropna().map(lambda t: week_label(pd.Timestamp(t).to_pydatetime()))


def data_weeks(frames: Mapping[str, pd.DataFrame]) -> list[str]:
    """Every ISO week from the first to the last that has trials or utilization rows."""
    labels: set[str] = set()
    if len(frames["trials"]):
        labels |= set(_week_col(frames["trials"], "started_at"))
    if len(frames["utilization"]):
        labels |= set(frames["utilization"]["week"].dropna().astype(str))
    if not labels:
        return []
    first, last = week_start(min(labels)), week_start(max(labels))
    out, t = [], first
    while t <= last:
        out.append(week_label(t.to_pydatetime()))
        t += pd.Timedelta(weeks=1)
    return out


def _ok(trials: pd.DataFrame, measure: str, arm: str | None = None) -> pd.DataFrame:
    rows = trials[(trials["measure"] == measure) & (trials["status"] == "ok")]
    return rows if arm is None else rows[rows["arm"] == arm]


def _distinct(series: pd.Series) -> list[str]:
    return sorted(map(str, series.dropna().unique()))


def _cold_start_rows(
    trials: pd.DataFrame, week: str, segment: int, n_resamples: int
) -> list[dict[str, Any]]:
    """The two cold-start clocks per arm: median ready_s with a bootstrap CI (info rows: the
    plan judges their ratio, the speed-up)."""
    rows = []
    for arm, measure in COLD_START_CLOCKS.items():
        ready = _ok(trials, "cold_start", arm)["ready_s"].dropna().to_numpy(float)
        ready = ready[ready > 0]
        lo, hi = bootstrap_ci(ready, np.median, n_resamples=n_resamples) if len(ready) else (0, 0)
        rows.append(
            {
                "week": week,
                "measure": measure,
                "arm": arm,
                "n": len(ready),
                "value": float(np.median(ready)) if len(ready) else None,
                "ci_low": float(lo) if len(ready) else None,
                "ci_high": float(hi) if len(ready) else None,
                "unit": "s",
                "method": "median ready_s of ok cold-start trials to date; 95% CI percentile "
                f"bootstrap, {n_resamples} resamples, seed 0",
                "basis": "measured",
                "inputs": None,
                "threshold": None,
                "verdict": "info" if len(ready) else "no data",
                "note": "",
                "segment": segment,
                "criterion": None,
            }
        )
    return rows


def _source_rows(
    measure: str, arm: str, frames: Mapping[str, pd.DataFrame], weeks_to_date: Sequence[str]
) -> pd.DataFrame:
    """The rows a figure is computed from (for its weeks and lineage)."""
    dataset, trial_measure = FIGURE_SOURCES.get(measure, ("trials", None))
    df = frames[dataset]
    if dataset == "trials":
        df = df[df["status"] == "ok"]
        if trial_measure:
            df = df[df["measure"] == trial_measure]
        df = df[_week_col(df, "started_at").reindex(df.index).isin(weeks_to_date)]
    elif dataset == "utilization":
        df = df[df["week"].isin(weeks_to_date)]
    if arm in ("managed", "unmanaged") and "arm" in df.columns:
        df = df[df["arm"] == arm]
    return df


def _weeks_of(df: pd.DataFrame) -> int:
    if "started_at" in df.columns:
        return int(_week_col(df, "started_at").nunique())
    if "week" in df.columns:
        return int(df["week"].nunique())
    if "diffed_at" in df.columns:
        return int(_week_col(df, "diffed_at").nunique())
    return 0


def _verdict_of(row: Mapping[str, Any] | None) -> str:
    if row is None:
        return "no data"
    # A row a failed gate blocks decides nothing yet: more (gated) runs decide it.
    return "undecided" if row["verdict"] == "blocked" else str(row["verdict"])


def _files_by_run(data_dir: str | Path, poc: str) -> dict[str, list[str]]:
    root = Path(data_dir) / poc
    return {
        run_id: [str(root / f) for f in rec.get("files", [])]
        for run_id, rec in committed_runs(data_dir, poc).items()
    }


def _files_of(files: Mapping[str, list[str]], runs: Sequence[str], dataset: str) -> list[str]:
    return [f for r in runs for f in files.get(r, []) if Path(f).parts[-3] == dataset]


# --- the six mistakes (DESIGN §5) --------------------------------------------------------------


def _gate_rows(gates: pd.DataFrame, match: Callable[[str], bool]) -> pd.DataFrame:
    return gates[gates["expectation"].astype(str).map(match).astype(bool)]


def six_mistakes(
    plan: Plan, frames: Mapping[str, pd.DataFrame], jobs: pd.DataFrame
) -> list[dict[str, Any]]:
    """One line per mistake: passed, why, and the rows it looked at (dataset, run ids,
    row count). A gate that never ran is not passed: nothing showed the mistake avoided."""
    trials, gates, exposure = frames["trials"], frames["gates"], frames["exposure"]
    ok = trials[trials["status"] == "ok"]
    measures = [m for m in ("recovery", "overhead", "cold_start") if (ok["measure"] == m).any()]
    out: list[dict[str, Any]] = []

    def add(
        key: str, title: str, passed: bool, reason: str, looked: list[tuple[str, pd.DataFrame]]
    ) -> None:
        out.append(
            {
                "gate": key,
                "title": title,
                "passed": bool(passed),
                "reason": reason,
                "rows": [
                    {"dataset": name, "rows": len(df), "run_ids": _distinct(df["run_id"])}
                    for name, df in looked
                ],
            }
        )

    def from_gates(rows: pd.DataFrame, what: str) -> tuple[bool, str]:
        if rows.empty:
            return False, f"not checked: no {what} gate rows"
        failed = rows[rows["success"] == False]  # noqa: E712 (nullable Arrow booleans)
        if len(failed):
            names = ", ".join(
                sorted(
                    {f"{g}/{e}" for g, e in zip(failed["gate"], failed["expectation"], strict=True)}
                )
            )
            return False, f"{len(failed)} of {len(rows)} {what} checks failed: {names}"
        return True, f"{len(rows)} {what} checks held"

    # 1. no baseline: the unmanaged arm has rows for every measure the managed arm has.
    counts = {
        m: (int((_ok(ok, m, "managed")).shape[0]), len(_ok(ok, m, "unmanaged"))) for m in measures
    }
    missing = [m for m, (_, u) in counts.items() if u == 0]
    passed = bool(measures) and not missing and len(exposure) > 0
    why = (
        "; ".join(f"{m}: {mm} managed / {u} unmanaged ok trials" for m, (mm, u) in counts.items())
        or "no trials"
    )
    why += f"; baseline exposure rows: {len(exposure)}"
    if missing:
        why = f"no unmanaged rows for {', '.join(missing)}; " + why
    add("no_baseline", "1. no baseline", passed, why, [("trials", ok), ("exposure", exposure)])

    # 2. different clocks: one clock per measure on both arms (and the gate said so).
    grows = _gate_rows(gates, lambda e: e == "same_clock_both_arms")
    g_ok, g_why = from_gates(grows, "same-clock")
    clocks = {m: _distinct(ok[ok["measure"] == m]["clock"]) for m in measures}
    multi = [m for m, c in clocks.items() if len(c) > 1]
    add(
        "different_clocks",
        "2. different clocks",
        g_ok and not multi,
        g_why + "; clocks: " + "; ".join(f"{m}: {', '.join(c)}" for m, c in clocks.items()),
        [("gates", grows), ("trials", ok)],
    )

    # 3. synthetic workload: named in the accounting history, or a production owner (a warning).
    owner = plan.workload.production_owner
    named = bool((jobs["job_name"].astype(str) == plan.workload.name).any())
    add(
        "synthetic_workload",
        "3. synthetic workload (a warning, not a block)",
        bool(owner) or named,
        (f"production owner: {owner}" if owner else "no production owner in the plan")
        + (
            f"; {plan.workload.name!r} is "
            + ("" if named else "not ")
            + "a job name in the accounting history"
        ),
        [("jobs", jobs)],
    )

    # 4. no real interruption: real fault_injected and a measured serving_again per trial.
    grows = _gate_rows(gates, lambda e: e == "real_fault_and_measured_serving_again")
    g_ok, g_why = from_gates(grows, "real-fault")
    rec = _ok(ok, "recovery")
    unmeasured = int((rec["fault"].isna() | rec["recovery_s"].isna()).sum())
    add(
        "no_real_interruption",
        "4. no real interruption",
        g_ok and len(rec) > 0 and unmeasured == 0,
        g_why + f"; {len(rec)} ok recovery trials, {unmeasured} without fault or recovery_s",
        [("gates", grows), ("trials", rec)],
    )

    # 5. one run per configuration: at least `repeats` ok trials per (measure, arm).
    grows = _gate_rows(gates, lambda e: e.startswith("repeats["))
    g_ok, g_why = from_gates(grows, "repeats")
    short = [
        f"{m}/{a}: {n}"
        for m in measures
        for a in ("managed", "unmanaged")
        if (n := len(_ok(ok, m, a))) < plan.repeats
    ]
    add(
        "one_run_per_configuration",
        "5. one run per configuration",
        g_ok and bool(measures) and not short,
        g_why
        + f"; plan repeats {plan.repeats}"
        + (f"; short: {', '.join(short)}" if short else ""),
        [("gates", grows), ("trials", ok)],
    )

    # 6. two changes at once: the arms differ only in `managed`.
    grows = _gate_rows(
        gates,
        lambda e: (
            e.startswith("arms_differ_only_in_managed[")
            or e == "no_checkpoint_inside_a_steady_span"
        ),
    )
    g_ok, g_why = from_gates(grows, "one-difference")
    add("two_changes_at_once", "6. two changes at once", g_ok, g_why, [("gates", grows)])
    return out


# --- sections ----------------------------------------------------------------------------------


def _version_of(fp_versions: Any, package: str) -> str:
    """The package's version from an fp_versions JSON object ('none' when not there)."""
    try:
        versions = json.loads(fp_versions)
    except (TypeError, ValueError):
        return "none"
    return str(versions.get(package, "none")) if isinstance(versions, dict) else "none"


def _hardware(rows: pd.DataFrame, checkpointer: str) -> str:
    if rows.empty:
        return "no rows"
    versions = _distinct(rows["fp_versions"].map(lambda v: _version_of(v, checkpointer)))
    mem = _distinct(rows["fp_mem_bytes"].map(lambda b: f"{int(b) / 2**30:.1f} GiB"))

    def j(col: str) -> str:
        return ", ".join(_distinct(rows[col]))

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
            f"{rows['run_id'].nunique()} run(s): {', '.join(_distinct(rows['run_id']))}",
            f"clock (start → stop events): {', '.join(_distinct(ok['clock'])) or 'none'}",
        ]
        if measure == "recovery":
            faults = ok.groupby(["arm", "fault"], observed=True).size()
            parts.append(
                "killed: "
                + (", ".join(f"{a} {f} ×{n}" for (a, f), n in faults.items()) or "nothing")
            )
            parts.append(f"fault outcome: {', '.join(_distinct(ok['fault_outcome'])) or '—'}")
            parts.append(f"components included: {', '.join(_distinct(ok['includes'])) or '—'}")
            verified = int(ok["steps_lost"].notna().sum())
            parts.append(
                f"resumed step verified (steps_lost recorded) in {verified} of {len(ok)} "
                f"trials; recoverable point: {', '.join(_distinct(ok['recoverable_point']))}"
            )
        if measure == "overhead":
            parts.append(
                f"variants {', '.join(_distinct(ok['variant']))}; {ok['pair'].nunique()} A/B pairs"
            )
        if measure == "cold_start":
            parts.append(f"page cache before start: {', '.join(_distinct(ok['page_cache']))}")
            gbps = ok["restore_gbps"].dropna()
            if len(gbps):
                parts.append(f"restore throughput median {gbps.median():.3g} GB/s")
        parts.append(f"checkpoint size: {_bytes(ok['checkpoint_bytes'])}")
        parts.append(
            f"nodes {', '.join(_distinct(ok['nodes']))}; GPUs per job "
            f"{', '.join(_distinct(ok['gpus']))} (from {', '.join(_distinct(ok['gpus_from']))})"
        )
        parts.append("hardware: " + _hardware(ok, kind))
        out.append((title, "; ".join(parts)))
    out.append(
        (
            "Goodput and utilization",
            f"{len(util)} utilization rows in {util['run_id'].nunique()} run(s), weeks "
            f"{', '.join(_distinct(util['week'])) or 'none'}; workloads "
            f"{', '.join(_distinct(util['workload'])) or 'none'}; busy metric "
            f"{', '.join(_distinct(util['busy_metric'])) or 'none'}; hardware: "
            + _hardware(util, kind),
        )
    )
    return out


def _table_rows(recs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    return [
        [
            TITLES_HERE.get(r["measure"], r["measure"]),
            r["arm"],
            r["basis"],
            str(int(r["n"])),
            str(r["weeks"]),
            _fmt(r["value"], r["unit"]),
            _ci(r),
            _fmt(r["threshold"], r["unit"]),
            r["verdict"],
        ]
        for r in recs
    ]


# Measures with a row per arm, shown as one line: (managed measure, unmanaged measure, title).
PAIRED = (
    ("recovery_s", "recovery_s", "recovery time"),
    ("work_lost_gpu_h", "work_lost_gpu_h", "work lost per interruption"),
    ("goodput", "goodput", "goodput"),
    ("utilization", "utilization", "busy fraction"),
    ("cold_start_restore_s", "cold_start_native_s", "cold start (restore vs native)"),
)


def side_by_side(recs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The per-arm rows paired: managed beside unmanaged, each with its CI."""
    by_key = {(r["measure"], r["arm"]): r for r in recs}

    def cell(r: Mapping[str, Any] | None) -> str:
        if r is None:
            return "—"
        ci = _ci(r)
        return _fmt(r["value"], r["unit"]) + (f" ({ci})" if ci else "")

    out = []
    for m_measure, u_measure, title in PAIRED:
        m, u = by_key.get((m_measure, "managed")), by_key.get((u_measure, "unmanaged"))
        if m is None and u is None:
            continue
        n = f"{int(m['n']) if m else 0} / {int(u['n']) if u else 0}"
        out.append([title, cell(m), cell(u), n])
    return out


def _exit_state(verdicts: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    if verdicts.empty:
        return "not tried", verdicts
    latest = verdicts.sort_values("diffed_at").groupby("node", as_index=False).last()
    leftovers = int(latest["leftovers"].sum())
    return ("clean" if leftovers == 0 else f"leftovers: {leftovers}"), latest


def build_document(
    plan: Plan, data_dir: str | Path, *, n_resamples: int = N_RESAMPLES
) -> tuple[Doc, dict[str, Any]]:
    """The record's blocks and its summary (verdicts, gates, exit, the verdict table)."""
    poc = plan.poc
    frames = read_frames(data_dir, poc)
    weeks = data_weeks(frames)
    week = weeks[-1] if weeks else current_week()
    rows, change_points, _ = weekly_report_rows(plan, frames, week, n_resamples=n_resamples)
    recs = _records(rows)
    segment = int(rows["segment"].max()) if len(rows) else 0
    seg_weeks = [
        w
        for w in weeks
        if w >= min((cp["week"] for cp in change_points if cp["segment"] == segment), default="")
    ]
    clocks = _records(_cold_start_rows(_week_trials(frames, seg_weeks), week, segment, n_resamples))
    at = next(
        (i + 1 for i, r in enumerate(recs) if r["measure"] == "cold_start_speedup"), len(recs)
    )
    recs[at:at] = clocks
    files = _files_by_run(data_dir, poc)
    for r in recs:
        # Goodput and busy fraction per arm are the week's own; the rest pool the segment.
        per_week = r["measure"] in ("goodput", "utilization")
        src = _source_rows(r["measure"], r["arm"], frames, [week] if per_week else seg_weeks)
        r["weeks"] = _weeks_of(src)
        r["run_ids"] = _distinct(src["run_id"]) if "run_id" in src.columns else []
        if r["measure"] == "exit_leftovers":
            r["run_ids"] = _distinct(frames["exit_verdicts"]["run_id"])
        if r["basis"] == "extrapolated" and r.get("inputs"):
            lam = json.loads(r["inputs"]).get("exposure") or {}
            r["run_ids"] = sorted({*r["run_ids"], *([lam["run_id"]] if lam else [])})
    by_key = {(r["measure"], r["arm"]): r for r in recs}
    verdicts = {
        m: _verdict_of(by_key.get((m, "managed")) or by_key.get((m, "both")))
        for m in VERDICT_MEASURES
    }
    jobs = read_dataset(JOBS, data_dir=data_dir, poc=poc, columns=["run_id", "job_name"])
    mistakes = six_mistakes(plan, frames, jobs)
    exit_state, latest_exit = _exit_state(frames["exit_verdicts"])

    d = Doc()
    d.h(1, f"Decision record — {plan.poc} / {plan.workload.name}")
    d.p(
        f"Data to ISO week {week} (comparability segment {segment}, weeks "
        f"{', '.join(seg_weeks) or 'none'}); generated "
        f"{dt.datetime.now(dt.UTC).isoformat(timespec='seconds')} from the committed datasets "
        f"under {Path(data_dir) / poc}."
    )
    d.h(2, "Verdicts")
    d.table(
        ["measure", "verdict"],
        [[TITLES_HERE[m], v] for m, v in verdicts.items()],
        [v.replace(" ", "-") for v in verdicts.values()],
    )
    d.p(
        f"The six mistakes: {sum(m['passed'] for m in mistakes)} of 6 gates passed. "
        f"The way out: {exit_state}."
    )

    d.h(2, "Measures against the plan")
    d.p(
        "Both arms side by side; trial-based rows pool the segment's trials to date, goodput "
        f"and busy fraction are week {week}'s. weeks = ISO weeks of rows behind the figure. "
        "Each figure's method follows the table; its runs and files are under Lineage."
    )
    d.table(VERDICT_HEADS, _table_rows(recs), [r["verdict"].replace(" ", "-") for r in recs])
    d.h(3, "Side by side")
    d.table(
        ["measure", "managed (95% CI)", "unmanaged (95% CI)", "n managed / unmanaged"],
        side_by_side(recs),
    )
    for r in recs:
        note = f" Note: {r['note']}" if r.get("note") else ""
        d.p(f"{TITLES_HERE.get(r['measure'], r['measure'])} ({r['arm']}): {r['method']}.{note}")

    d.h(2, "Method")
    for title, text in method_lines(plan, frames["trials"], frames["utilization"]):
        d.h(3, title)
        d.p(text)

    d.h(2, "Measured and extrapolated")
    measured = [r for r in recs if r["basis"] == "measured"]
    d.p(
        "Measured: "
        + ", ".join(f"{TITLES_HERE.get(r['measure'], r['measure'])} ({r['arm']})" for r in measured)
        + "."
    )
    shown: set[str | None] = set()
    for r in recs:
        if r["basis"] == "extrapolated":
            d.h(
                3,
                f"{TITLES_HERE.get(r['measure'], r['measure'])}: "
                f"{_fmt(r['value'], r['unit'])} (extrapolated)",
            )
            d.p(r["method"])
            if r.get("inputs") in shown:  # the extrapolations share one set of inputs
                d.p("Inputs: as above.")
                continue
            shown.add(r.get("inputs"))
            pretty = json.loads(r["inputs"]) if r.get("inputs") else {}
            d.pre(json.dumps(pretty, indent=1, sort_keys=True, default=str, ensure_ascii=False))

    d.h(2, "The six mistakes")
    d.table(
        ["gate", "result", "why", "rows looked at"],
        [
            [
                m["title"],
                "passed" if m["passed"] else "FAILED",
                m["reason"],
                "; ".join(
                    f"{x['dataset']}: {x['rows']} rows, runs {', '.join(x['run_ids']) or '—'}"
                    for x in m["rows"]
                ),
            ]
            for m in mistakes
        ],
        ["met" if m["passed"] else "not-met" for m in mistakes],
    )

    d.h(2, "Baseline")
    exposure = frames["exposure"]
    if exposure.empty:
        d.p("No baseline exposure rows.")
    else:
        latest = exposure.sort_values("computed_at")["run_id"].iloc[-1]
        ex = exposure[exposure["run_id"] == latest]
        states = ex[ex["kind"] == "state"]
        d.p(
            f"Latest baseline run {latest}: {_fmt(float(states['exposed_gpu_hours'].sum()))} "
            f"exposed GPU-hours of {_fmt(float(states['gpu_hours'].sum()))} GPU-hours "
            f"({int(states['exposed_allocations'].sum())} exposed allocations)."
        )
        d.table(
            ["state", "allocations", "GPU-hours", "exposed GPU-hours", "time-limit GPU-hours"],
            [
                [
                    s.state,
                    s.allocations,
                    _fmt(s.gpu_hours),
                    _fmt(s.exposed_gpu_hours),
                    _fmt(s.timeout_gpu_hours),
                ]
                for s in states.itertuples()
            ],
        )
        cands = ex[ex["kind"] == "candidate"].sort_values("rank")
        d.h(3, "Candidate workloads")
        d.table(
            ["rank", "workload", "allocations", "exposed GPU-hours", "chains"],
            [
                [c.rank, c.workload, c.allocations, _fmt(c.exposed_gpu_hours), c.chains]
                for c in cands.itertuples()
            ],
        )

    d.h(2, "The way out")
    d.p(f"Exit verdict: {exit_state}.")
    d.table(
        ["node", "from", "to", "verdict", "leftovers", "items compared", "diffed at", "run"],
        [
            [
                v.node,
                v.from_phase,
                v.to_phase,
                v.verdict,
                v.leftovers,
                v.items_compared,
                pd.Timestamp(v.diffed_at).isoformat(),
                v.run_id,
            ]
            for v in latest_exit.itertuples()
        ],
    )
    if len(latest_exit):
        diff = read_dataset(EXIT_DIFF, data_dir=data_dir, poc=poc)
        diff = diff[diff["run_id"].isin(set(latest_exit["run_id"]))]
        d.h(3, "Leftovers")
        d.table(
            ["node", "kind", "key", "change", "before", "after"],
            [[x.node, x.kind, x.key, x.change, x.before, x.after] for x in diff.itertuples()],
        )

    d.h(2, "Change points and gaps")
    d.table(
        ["week", "segment", "source", "field", "before", "after"],
        [
            [cp["week"], cp["segment"], c["source"], c["field"], c["before"], c["after"]]
            for cp in change_points
            for c in cp["changes"]
        ],
    )
    gaps = frames["sample_gaps"].drop_duplicates(["node", "source", "entity", "metric", "t_from"])
    d.h(3, "Sample gaps")
    d.table(
        ["node", "source", "metric", "from", "to", "seconds", "reason"],
        [
            [
                g.node,
                g.source,
                g.metric if isinstance(g.metric, str) else "all",
                pd.Timestamp(g.t_from).isoformat(),
                pd.Timestamp(g.t_to).isoformat(),
                f"{g.gap_s:.0f}",
                g.reason,
            ]
            for g in gaps.sort_values("t_from").itertuples()
        ],
    )

    d.h(2, "Weeks")
    d.p(
        "Each week's verdict of the plan-judged measures, as that week's report computed it "
        f"(past weeks' CIs with {HISTORY_RESAMPLES} resamples)."
    )
    history = []
    for w in weeks:
        wrows = (
            rows
            if w == week
            else weekly_report_rows(plan, frames, w, n_resamples=HISTORY_RESAMPLES)[0]
        )
        wrec = {(r["measure"], r["arm"]): r for r in _records(wrows)}
        cells = [w]
        for m in VERDICT_MEASURES:
            r = wrec.get((m, "managed")) or wrec.get((m, "both"))
            cells.append(f"{_fmt(r['value'], r['unit'])} {r['verdict']}" if r else "—")
        history.append(cells)
    d.table(["week", *VERDICT_MEASURES], history)

    d.h(2, "Lineage")
    d.p(
        "Every figure with the runs and parquet files it comes from: read them with pandas or "
        "DuckDB and the dataset declarations (tasks/data/datasets.py) to redo it."
    )
    lineage = []
    for r in recs:
        dataset = FIGURE_SOURCES.get(r["measure"], ("trials", None))[0]
        used = _files_of(files, r["run_ids"], dataset)
        if r["basis"] == "extrapolated":
            used += _files_of(files, r["run_ids"], "exposure")
        if r["measure"] == "exit_leftovers":
            used += _files_of(files, r["run_ids"], "exit_diff")
        lineage.append(
            [
                f"{TITLES_HERE.get(r['measure'], r['measure'])} ({r['arm']})",
                ", ".join(r["run_ids"]) or "—",
                "\n".join(sorted(set(used))) or "—",
            ]
        )
    d.table(["figure", "runs", "files"], lineage)

    summary = {
        "week": week,
        "verdicts": verdicts,
        "gates": {m["gate"]: {"passed": m["passed"], "reason": m["reason"]} for m in mistakes},
        "exit": exit_state,
        "table": _table_rows(recs),
    }
    return d, summary


def _week_trials(frames: Mapping[str, pd.DataFrame], seg_weeks: Sequence[str]) -> pd.DataFrame:
    t = frames["trials"]
    return t[_week_col(t, "started_at").reindex(t.index).isin(seg_weeks).to_numpy()]


# --- rendering ---------------------------------------------------------------------------------

_CSS = (
    "body{font-family:sans-serif;max-width:80em;margin:1em auto}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.2em .5em;"
    "vertical-align:top;white-space:pre-wrap}"
    ".met{background:#dfd}.not-met{background:#fdd}.undecided,.blocked{background:#fec}"
    "pre{background:#f6f6f6;padding:.5em;overflow:auto}"
)


def render_html(doc: Doc, title: str) -> str:
    e = html.escape
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
    ]
    for b in doc.blocks:
        if b.kind in ("h1", "h2", "h3"):
            out.append(f"<{b.kind}>{e(b.text)}</{b.kind}>")
        elif b.kind == "p":
            out.append(f"<p>{e(b.text)}</p>")
        elif b.kind == "pre":
            out.append(f"<pre>{e(b.text)}</pre>")
        else:
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in b.heads) + "</tr>")
            for i, cells in enumerate(b.rows):
                cls = b.classes[i] if i < len(b.classes) else ""
                attr = f" class='{e(cls)}'" if cls else ""
                out.append(f"<tr{attr}>" + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>")
            out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out)


def _font_dir() -> Path:
    """DejaVu Sans ships with matplotlib (a dependency): no Debian font package needed."""
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


def render_pdf(doc: Doc, title: str) -> bytes:
    from fpdf import FPDF
    from fpdf.fonts import FontFace

    pdf = FPDF(orientation="landscape", format="A4")
    pdf.set_title(title)
    pdf.set_auto_page_break(True, margin=12)
    fonts = _font_dir()
    pdf.add_font("DejaVu", "", str(fonts / "DejaVuSans.ttf"))
    pdf.add_font("DejaVu", "B", str(fonts / "DejaVuSans-Bold.ttf"))
    pdf.add_font("DejaVuMono", "", str(fonts / "DejaVuSansMono.ttf"))
    pdf.add_page()
    width = pdf.epw
    sizes = {"h1": 15, "h2": 12, "h3": 10}
    fills = {
        "met": (221, 255, 221),
        "not-met": (255, 221, 221),
        "undecided": (255, 238, 204),
        "blocked": (255, 238, 204),
    }
    for b in doc.blocks:
        if b.kind in sizes:
            if pdf.get_y() > pdf.h - 40:  # no heading alone at the foot of a page
                pdf.add_page()
            pdf.set_font("DejaVu", "B", sizes[b.kind])
            pdf.ln(2)
            pdf.multi_cell(width, sizes[b.kind] * 0.5, b.text, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(1)
        elif b.kind == "p":
            pdf.set_font("DejaVu", "", 8)
            pdf.multi_cell(width, 4, b.text, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(1)
        elif b.kind == "pre":
            pdf.set_font("DejaVuMono", "", 6.5)
            pdf.multi_cell(width, 3, b.text, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(1)
        else:
            pdf.set_font("DejaVu", "", 7)
            # Column widths by content (capped), so long paths wrap instead of numbers.
            lens = [
                min(60, max([len(h) * 1.4 + 1, *(max(map(len, r[i].split("\n"))) for r in b.rows)]))
                for i, h in enumerate(b.heads)
            ]
            with pdf.table(
                col_widths=[max(4, n) for n in lens],
                width=width,
                text_align="LEFT",
                line_height=3.5,
                headings_style=FontFace(emphasis="BOLD", fill_color=(235, 235, 235)),
            ) as table:
                table.row(list(b.heads))
                for i, cells in enumerate(b.rows):
                    cls = b.classes[i] if i < len(b.classes) else ""
                    style = FontFace(fill_color=fills[cls]) if cls in fills else None
                    row = table.row()
                    for c in cells:
                        row.cell(c, style=style)
            pdf.ln(2)
    return bytes(pdf.output())


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def build_record(plan: Plan, ctx: RunContext, *, n_resamples: int = N_RESAMPLES) -> dict[str, Any]:
    """Read the committed datasets and write ``<data_dir>/<poc>/record/decision-record.html``
    and ``.pdf`` (atomically; the latest run wins). Writes no dataset rows."""
    doc, summary = build_document(plan, ctx.data_dir, n_resamples=n_resamples)
    title = f"Decision record {plan.poc} / {plan.workload.name}"
    out = record_dir(ctx.data_dir, ctx.poc)
    html_file, pdf_file = out / "decision-record.html", out / "decision-record.pdf"
    _write_atomically(html_file, render_html(doc, title).encode("utf-8"))
    _write_atomically(pdf_file, render_pdf(doc, title))
    return {"html": str(html_file), "pdf": str(pdf_file), **summary}


def record_markdown(result: Mapping[str, Any]) -> str:
    """The flow's artifact: verdicts first, then gates and the way out."""
    lines = [f"# Decision record (data to {result['week']})", "", "## Verdicts", ""]
    lines += [f"- {TITLES_HERE.get(m, m)}: **{v}**" for m, v in result["verdicts"].items()]
    lines += ["", "## The six mistakes", ""]
    lines += [
        f"- {g}: {'passed' if s['passed'] else 'FAILED'} ({s['reason']})"
        for g, s in result["gates"].items()
    ]
    lines += [
        "",
        f"## The way out: {result['exit']}",
        "",
        f"HTML: {result['html']}",
        f"PDF: {result['pdf']}",
    ]
    return "\n".join(lines)
