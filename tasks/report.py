"""Rendering stage results for people: terminal tables (rich) and Prefect markdown."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from tasks.baseline import BaselineResult
from tasks.exposure import EXPOSED_STATES, LIMITATIONS, REPORTED_APART


def _state_note(state: str) -> str:
    if state in EXPOSED_STATES:
        return "exposed"
    if state in REPORTED_APART:
        return "reported apart"
    return ""


def exposure_rows(result: BaselineResult) -> list[dict[str, Any]]:
    s = result.summary
    return [
        {
            "state": state,
            "allocations": n,
            "node_hours": round(s["node_hours_by_state"][state], 3),
            "gpu_hours": round(s["gpu_hours_by_state"][state], 3),
            "counts_as": _state_note(state),
        }
        for state, n in s["allocations_by_state"].items()
    ]


def exposure_table(result: BaselineResult) -> Table:
    s = result.summary
    table = Table(title=f"Baseline exposure — {result.source} ({result.path} path)")
    for col in ("state", "allocations", "node-hours", "GPU-hours", "counts as"):
        table.add_column(col, justify="left" if col in ("state", "counts as") else "right")
    for row in exposure_rows(result):
        table.add_row(
            row["state"],
            str(row["allocations"]),
            f"{row['node_hours']:.3f}",
            f"{row['gpu_hours']:.3f}",
            row["counts_as"],
        )
    table.caption = (
        f"rows read {s['rows_read']}, quarantined {s['rows_quarantined']}, duplicate captures "
        f"ignored {result.exposure.duplicates_ignored} · exposed GPU-h "
        f"{s['exposed_gpu_hours']:.3f} (time limit alone {s['timeout_gpu_hours']:.3f}) · "
        f"resubmission chains {len(s['chains'])}"
    )
    return table


def candidates_table(result: BaselineResult) -> Table:
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
            f"{r['exposed_gpu_hours']:.3f}",
            str(r["exposed_allocations"]),
            str(r["chains"]),
        )
    return table


def baseline_markdown(result: BaselineResult) -> str:
    s = result.summary
    lines = [
        f"# Baseline exposure ({result.source})",
        "",
        f"Rows read **{s['rows_read']}**, quarantined **{s['rows_quarantined']}** "
        f"(see the `quarantine` dataset), duplicate captures ignored "
        f"{result.exposure.duplicates_ignored}. All figures are measured from accounting.",
        "",
        "| state | allocations | node-hours | GPU-hours | counts as |",
        "|---|---:|---:|---:|---|",
    ]
    for row in exposure_rows(result):
        lines.append(
            f"| {row['state']} | {row['allocations']} | {row['node_hours']:.3f} | "
            f"{row['gpu_hours']:.3f} | {row['counts_as']} |"
        )
    lines += [
        "",
        f"**Exposed GPU-hours: {s['exposed_gpu_hours']:.3f}** "
        f"({', '.join(EXPOSED_STATES)}); time limit alone: {s['timeout_gpu_hours']:.3f}.",
        f"Resubmission chains: {len(s['chains'])}.",
        "",
        "## Candidate workloads",
        "",
        "| rank | workload | exposed GPU-h | exposed allocations | chains |",
        "|---:|---|---:|---:|---:|",
    ]
    for _, r in result.exposure.candidates.iterrows():
        lines.append(
            f"| {r['rank']} | {r['workload']} | {r['exposed_gpu_hours']:.3f} | "
            f"{r['exposed_allocations']} | {r['chains']} |"
        )
    lines += ["", "## What these numbers leave out", ""]
    lines += [f"- {text}" for text in LIMITATIONS]
    return "\n".join(lines)
