"""Rendering stage results for people: terminal tables (rich) and Prefect markdown."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from tasks.baseline.accounting import DOCUMENTED_STATES, GPU_SOURCE_LABELS
from tasks.baseline.exposure import EXPOSED_STATES, LIMITATIONS, REPORTED_APART
from tasks.baseline.run import BaselineResult
from tasks.data import render
from tasks.data.arms import MANAGED
from tasks.data.render import fixed, markdown_table, pct, sig
from tasks.data.slurm_states import NO_STATE
from tasks.experiments.results import (
    CheckpointSummary,
    Failure,
    OverheadResult,
    RecoveryResult,
)


def _state_note(state: str) -> str:
    if state == NO_STATE:
        return "no state: the dump lacks State"
    if state in EXPOSED_STATES:
        return "exposed"
    if state in REPORTED_APART:
        return "reported apart"
    if state not in DOCUMENTED_STATES:
        return "unknown state (not documented by sacct)"
    return ""


NOT_COMPUTED = "not computed"
# The summary's measures as people name them.
_MEASURE_TITLES = {
    "node_hours_by_state": "node-hours",
    "gpu_hours_by_state": "GPU-hours",
    "exposed_gpu_hours": "exposed GPU-hours",
    "timeout_gpu_hours": "time-limit GPU-hours",
    "chains": "resubmission chains",
    "candidates": "candidate workloads",
}


def _not_computed(result: BaselineResult) -> dict[str, str]:
    return dict(result.summary.not_computed)


def not_computed_lines(result: BaselineResult) -> list[str]:
    """One line per measure the dump could not give: "GPU-hours not computed: the dump
    lacks …"."""
    return [
        f"{_MEASURE_TITLES.get(measure, measure)} {NOT_COMPUTED}: {why}"
        for measure, why in _not_computed(result).items()
    ]


def gpu_sources_line(result: BaselineResult) -> str | None:
    """Where the allocations' GPU counts came from, when not all from AllocTRES."""
    sources = result.gpu_sources
    if not sources or set(sources) <= {"AllocTRES"}:
        return None
    parts = [f"{n} {GPU_SOURCE_LABELS.get(source, source)}" for source, n in sources.items()]
    return "GPU counts of parsed allocation rows: " + ", ".join(parts)


def reading_lines(result: BaselineResult) -> list[str]:
    """How the dump was read: each time field's format, and rows short of fields."""
    lines = []
    formats = result.time_formats
    if formats:
        labels = set(formats.values())
        if len(labels) == 1:
            lines.append(f"times read as {labels.pop()}")
        else:
            lines.append("times read as " + ", ".join(f"{k} {v}" for k, v in formats.items()))
    if result.short_rows:
        lines.append(
            f"{result.short_rows} rows short of trailing fields read with those fields empty"
        )
    return lines


def _hours(value: float | None) -> str:
    return NOT_COMPUTED if value is None else f"{value:.3f}"


def exposure_rows(result: BaselineResult) -> list[dict[str, Any]]:
    s = result.summary
    node_hours = s.node_hours_by_state
    gpu_hours = s.gpu_hours_by_state
    return [
        {
            "state": state,
            "allocations": n,
            "node_hours": NOT_COMPUTED if node_hours is None else round(node_hours[state], 3),
            "gpu_hours": NOT_COMPUTED if gpu_hours is None else round(gpu_hours[state], 3),
            "counts_as": _state_note(state),
        }
        for state, n in s.allocations_by_state.items()
    ]


def _cell(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value:.3f}"


def exposure_table(result: BaselineResult) -> Table:
    s = result.summary
    table = Table(title=f"Baseline exposure — {result.source} ({result.path} path)")
    for col in ("state", "allocations", "node-hours", "GPU-hours", "counts as"):
        table.add_column(col, justify="left" if col in ("state", "counts as") else "right")
    for row in exposure_rows(result):
        table.add_row(
            row["state"],
            str(row["allocations"]),
            _cell(row["node_hours"]),
            _cell(row["gpu_hours"]),
            row["counts_as"],
        )
    chains = s.chains
    caption = [
        f"rows read {s.rows_read}, quarantined {s.rows_quarantined}, duplicate captures "
        f"ignored {result.exposure.duplicates_ignored} · exposed GPU-h "
        f"{_hours(s.exposed_gpu_hours)} (time limit alone {_hours(s.timeout_gpu_hours)})"
        f" · resubmission chains {NOT_COMPUTED if chains is None else len(chains)}",
        *not_computed_lines(result),
    ]
    sources = gpu_sources_line(result)
    if sources:
        caption.append(sources)
    caption += reading_lines(result)
    table.caption = "\n".join(caption)
    if len(caption) > 1:  # lines of their own read better from the left
        table.caption_justify = "left"
    return table


def candidates_table(result: BaselineResult) -> Table:
    missing = _not_computed(result)
    table = Table(title="Candidate workloads, by exposed GPU-hours")
    for col in ("rank", "job name", "account", "exposed GPU-h", "exposed allocs", "chains"):
        table.add_column(
            col, justify="left" if col in ("job name", "account") else "right", overflow="fold"
        )
    for _, r in result.exposure.candidates.iterrows():
        account, _, name = str(r["workload"]).partition("/")
        table.add_row(
            str(r["rank"]),
            name,
            account,
            NOT_COMPUTED if "exposed_gpu_hours" in missing else f"{r['exposed_gpu_hours']:.3f}",
            NOT_COMPUTED
            if "State" in missing.get("exposed_gpu_hours", "")
            else str(r["exposed_allocations"]),
            NOT_COMPUTED if "chains" in missing else str(r["chains"]),
        )
    if "candidates" in missing:
        table.caption = f"{NOT_COMPUTED}: {missing['candidates']}"
    elif "State" in missing.get("exposed_gpu_hours", ""):
        table.caption = f"by GPU-hours: exposure {NOT_COMPUTED}, {missing['exposed_gpu_hours']}"
    return table


def baseline_markdown(result: BaselineResult) -> str:
    s = result.summary
    missing = _not_computed(result)
    lines = [
        f"# Baseline exposure ({result.source})",
        "",
        f"Rows read **{s.rows_read}**, quarantined **{s.rows_quarantined}** "
        f"(see the `quarantine` dataset), duplicate captures ignored "
        f"{result.exposure.duplicates_ignored}. All figures are measured from accounting.",
        "",
    ]
    if missing:
        lines += [f"- **{line}**" for line in not_computed_lines(result)] + [""]
    sources = gpu_sources_line(result)
    if sources:
        lines += [sources + ".", ""]
    lines += [f"{line[0].upper()}{line[1:]}." for line in reading_lines(result)]
    lines += [""] if reading_lines(result) else []
    lines += markdown_table(
        ("state", "allocations", "node-hours", "GPU-hours", "counts as"),
        [
            [
                r["state"],
                r["allocations"],
                _cell(r["node_hours"]),
                _cell(r["gpu_hours"]),
                r["counts_as"],
            ]
            for r in exposure_rows(result)
        ],
        "lrrrl",
    )
    chains = s.chains
    lines += [
        "",
        f"**Exposed GPU-hours: {_hours(s.exposed_gpu_hours)}** "
        f"({', '.join(EXPOSED_STATES)}); time limit alone: {_hours(s.timeout_gpu_hours)}.",
        f"Resubmission chains: {NOT_COMPUTED if chains is None else len(chains)}.",
        "",
        "## Candidate workloads",
        "",
    ]
    if "candidates" in missing:
        lines.append(f"{NOT_COMPUTED}: {missing['candidates']}.")
    else:
        lines += markdown_table(
            ("rank", "workload", "exposed GPU-h", "exposed allocations", "chains"),
            [
                [
                    r["rank"],
                    r["workload"],
                    NOT_COMPUTED
                    if "exposed_gpu_hours" in missing
                    else f"{r['exposed_gpu_hours']:.3f}",
                    NOT_COMPUTED
                    if "State" in missing.get("exposed_gpu_hours", "")
                    else r["exposed_allocations"],
                    NOT_COMPUTED if "chains" in missing else r["chains"],
                ]
                for _, r in result.exposure.candidates.iterrows()
            ],
            "rlrrr",
        )
    lines += ["", "## What these numbers leave out", ""]
    lines += [f"- {text}" for text in LIMITATIONS]
    return "\n".join(lines)


# --- verdicts ---------------------------------------------------------------------------------


def verdict_line(
    criterion: str,
    statistic: str,
    value: str,
    threshold: str,
    verdict: str,
    *,
    at_most: bool = True,
    detail: str = "",
    by_ci: bool = False,
) -> str:
    """One criterion as a sentence: "recovery time median 0.090 s ≤ 30 s: met". A verdict
    decided by a confidence interval (``by_ci``) is not a plain comparison of the value:
    it reads "vs ≤ threshold", with the CI in ``detail``."""
    if verdict == "met" and not by_ci:
        op = "≤" if at_most else "≥"
    elif verdict == "not met" and not by_ci:
        op = ">" if at_most else "<"
    else:
        op = "vs " + ("≤" if at_most else "≥")
    extra = f" ({detail})" if detail else ""
    return f"{criterion} {statistic} {value}{extra} {op} {threshold}: {verdict}"


def _seconds(value: float | None, resolution_s: float) -> str:
    """Seconds to the resolution the clock can observe (1 ms locally, 10 ms on Slurm)."""
    if value is None:
        return "—"
    digits = max(0, round(-math.log10(resolution_s)))
    return f"{value:.{digits}f}"


# --- recovery ---------------------------------------------------------------------------------

# What the recovery clock resolves: its ends are the harness's own events (sub-ms), but
# detection is a poll — every 2 ms locally, every 50 ms of squeue on Slurm.
RESOLUTION_S = {"local": 0.001, "slurm": 0.01}


def recovery_verdicts(result: RecoveryResult) -> list[str]:
    """Per fault, the plan's two recovery criteria judged on the managed arm."""
    res = RESOLUTION_S.get(result.cluster, 0.001)
    lines = []
    for s in result.summary:
        rt, wl = s.recovery_time_verdict, s.work_lost_verdict
        if s.arm != MANAGED or rt is None or wl is None:
            continue
        n = s.recovery_s.n
        detail = f"managed, n={n}" if n else "no managed trial recovered"
        lines.append(
            f"{s.fault}: "
            + verdict_line(
                "recovery time",
                rt.statistic,
                f"{_seconds(rt.value, res)} s",
                f"{rt.threshold:g} s",
                rt.verdict,
                detail=detail,
            )
        )
        lines.append(
            f"{s.fault}: "
            + verdict_line(
                "work lost per interruption",
                wl.statistic,
                f"{sig(wl.value)} GPU-h",
                f"{wl.threshold:g} GPU-h",
                wl.verdict,
                detail=detail,
            )
        )
    return lines


def recovery_rows(result: RecoveryResult) -> list[dict[str, Any]]:
    """One row per fault × arm, few enough columns for a 1600 px window; the verdicts are
    sentences above the table (recovery_verdicts), not a column."""
    res = RESOLUTION_S.get(result.cluster, 0.001)
    rows = []
    for s in result.summary:
        rt, wl = s.recovery_s, s.work_lost_gpu_h
        rows.append(
            {
                "fault": s.fault,
                "arm": s.arm,
                "ok / failed": f"{rt.n} / {s.failed}",
                "recovery s median [min–max]": f"{_seconds(rt.median, res)} "
                f"[{_seconds(rt.min, res)}–{_seconds(rt.max, res)}]",
                "p90 s": _seconds(rt.p90, res),
                "GPU-h lost median": sig(wl.median),
                "steps lost median": fixed(s.steps_lost.median, 0),
            }
        )
    return rows


def recovery_table(result: RecoveryResult) -> Table:
    """Compact enough for an 80-column terminal: medians with [min–max], p90 apart."""
    table = Table(title=f"Recovery after real faults — {result.cluster}")
    heads = ("fault", "arm", "ok/failed", "recovery s [min–max]", "p90", "GPU-h lost", "steps")
    for col in heads:
        table.add_column(col, justify="left" if col in ("fault", "arm") else "right")
    for r in recovery_rows(result):
        table.add_row(*(str(v).replace("[", "\\[") for v in r.values()))
    table.caption = f"run {result.run_id}; medians \\[min–max]. {ratio_line(result)}. " + "; ".join(
        result.includes
    )
    return table


def ratio_line(result: RecoveryResult) -> str:
    """Managed over unmanaged median recovery time, per fault (one number per fault, so
    not a column of the per-arm table)."""
    ratios = {s.fault: s.managed_over_unmanaged_recovery for s in result.summary}
    return "managed / unmanaged median recovery time: " + ", ".join(
        f"{fault} {fixed(r, 2)}" for fault, r in ratios.items()
    )


def _markdown_table(rows: list[dict[str, Any]], right_from: int = 2) -> list[str]:
    if not rows:
        return ["(no rows)"]
    heads = list(rows[0])
    align = "l" * right_from + "r" * (len(heads) - right_from)
    return markdown_table(heads, [[r[h] for h in heads] for r in rows], align)


def failure_lines(failures: Sequence[Failure], heading: str) -> list[str]:
    """Each failed trial with its reason and the tail of the workload's own log."""
    if not failures:
        return []
    lines = ["", f"## {heading}", ""]
    for f in failures:
        lines.append(f"- **{f.trial_id} / {f.arm}**: {f.reason}")
        if f.log_tail:
            lines += ["", "  ```", *[f"  {t}" for t in f.log_tail.splitlines()], "  ```"]
    return lines


def recovery_markdown(result: RecoveryResult) -> str:
    lines = [
        f"# Recovery after real faults ({result.cluster})",
        "",
        "## Verdicts (managed arm, against the plan)",
        "",
        *[f"- {v}" for v in recovery_verdicts(result)],
        "",
        "## Numbers (measured)",
        "",
        f"Run `{result.run_id}`: {result.trials} trials, {result.failed} failed "
        "(kept as rows with their reason). Clock: `fault_injected` → `serving_again`, "
        "the same on both arms.",
        "",
        *_markdown_table(recovery_rows(result)),
        "",
        ratio_line(result) + ".",
        "",
        "What the numbers include: " + "; ".join(result.includes) + ".",
    ]
    lines += failure_lines(result.failures, "Failed trials")
    return "\n".join(lines)


# --- overhead and cold start --------------------------------------------------------------------


def overhead_lines(result: OverheadResult) -> list[str]:
    """The overhead result as plain sentences (terminal and markdown alike)."""
    lines = []
    for variant, v in result.variants.items():
        c = v.comparison
        head = f"{variant}: {v.runs} runs, {v.failed} failed"
        if c is None:
            lines.append(f"{head}; no complete pair to compare")
            continue
        lines.append(
            f"{head}; managed vs unmanaged run time over {c.n} pairs: median "
            f"{pct(c.overhead_pct)} (95% CI {pct(c.ci_low_pct)} … "
            f"{pct(c.ci_high_pct)}), {c.method} p={c.p_value:.3g} → "
            f"{c.difference}; minimum detectable effect "
            + ("— (too few pairs)" if c.mde_pct is None else f"{c.mde_pct:.2f} %")
        )
        if variant == "steady":
            lines.append(f"  verdict vs {result.threshold_pct} %: {c.verdict} ({c.verdict_reason})")
        else:
            lines.append(f"  {v.note}")
        if c.spread_warning:
            lines.append(f"  warning: {c.spread_warning}")
    return lines


def overhead_verdicts(result: OverheadResult) -> list[str]:
    """The plan's overhead criterion, judged on the steady variant only."""
    steady = result.variants.get("steady")
    c = steady.comparison if steady else None
    threshold = f"{result.threshold_pct:g} %"
    if c is None:
        return [
            verdict_line(
                "steady-state overhead",
                "median",
                "—",
                threshold,
                "undecided",
                detail="no complete managed/unmanaged pair",
            )
        ]
    return [
        verdict_line(
            "steady-state overhead",
            "median",
            pct(c.overhead_pct),
            threshold,
            c.verdict,
            detail=f"95% CI {pct(c.ci_low_pct)} … {pct(c.ci_high_pct)}, {c.n} pairs; "
            f"{c.verdict_reason}",
            by_ci=True,
        )
    ]


def overhead_markdown(result: OverheadResult) -> str:
    lines = [
        "# Steady-state overhead and the cost of checkpointing",
        "",
        "## Verdict (against the plan)",
        "",
        *[f"- {v}" for v in overhead_verdicts(result)],
        "",
        "## Numbers (measured)",
        "",
        f"Run `{result.run_id}`: interleaved A B B A runs of the managed and the unmanaged "
        "copy, each timed from its first to its last progress line.",
        "",
    ]
    lines += [f"- {line.strip()}" for line in overhead_lines(result)]
    lines += ["", "## Checkpoints taken", "", *checkpoint_lines(result.checkpoints)]
    lines += failure_lines(result.failures, "Failed runs")
    return "\n".join(lines)


def checkpoint_lines(checkpoints: Mapping[str, CheckpointSummary]) -> list[str]:
    lines = []
    for workload, c in checkpoints.items():
        if not c.dump_s:
            lines.append(f"- workload {workload}: {c.n} dumps, {c.failed} failed")
            continue
        freeze = c.freeze_s.median if c.freeze_s else None
        image_mb = c.checkpoint_bytes.median / 1e6 if c.checkpoint_bytes else None
        lines.append(
            f"- workload {workload}: {c.n} dumps ({c.failed} failed); median dump "
            f"{c.dump_s.median:.3f} s (min {c.dump_s.min:.3f}, max "
            f"{c.dump_s.max:.3f}), frozen {fixed(freeze)} s, image "
            f"{image_mb:.1f} MB"
        )
    return lines or ["- none"]


def png_data_uri(path: str | Path) -> str | None:
    """A PNG as a data: URI, so the Prefect UI shows it inline (None when there is none)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    return render.png_data_uri(data)
