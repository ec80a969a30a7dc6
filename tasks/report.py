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


# --- recovery ---------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def recovery_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per fault × arm: the recovery summary flattened for tables."""
    rows = []
    for s in result["summary"]:
        rt, wl = s["recovery_s"], s["work_lost_gpu_h"]
        verdict = s.get("recovery_time_verdict", {}).get("verdict", "")
        rows.append(
            {
                "fault": s["fault"],
                "arm": s["arm"],
                "n": rt["n"],
                "failed": s["failed"],
                "recovery_s_median": rt["median"],
                "recovery_s_p90": rt["p90"],
                "recovery_s_min": rt["min"],
                "recovery_s_max": rt["max"],
                "work_lost_gpu_h_median": wl["median"],
                "work_lost_gpu_h_p90": wl["p90"],
                "steps_lost_median": s["steps_lost"]["median"],
                "managed_over_unmanaged": s["managed_over_unmanaged_recovery"],
                "recovery_verdict": verdict,
                "work_lost_verdict": s.get("work_lost_verdict", {}).get("verdict", ""),
                "detect_latency_ms_max": s["detect_latency_ms"]["max"],
                "serving_latency_ms_max": s["serving_latency_ms"]["max"],
            }
        )
    return rows


def recovery_table(result: dict[str, Any]) -> Table:
    """Compact enough for an 80-column terminal: medians with [min–max], p90 apart."""
    table = Table(title=f"Recovery after real faults — {result['cluster']}")
    for col in ("fault", "arm", "n/failed", "recovery s", "p90", "GPU-h lost", "steps", "m/u"):
        table.add_column(col, justify="left" if col in ("fault", "arm") else "right")
    table.add_column("verdict")
    for r in recovery_rows(result):
        table.add_row(
            r["fault"],
            r["arm"],
            f"{r['n']}/{r['failed']}",
            f"{_num(r['recovery_s_median'], 2)} \\[{_num(r['recovery_s_min'], 2)}–"
            f"{_num(r['recovery_s_max'], 2)}]",
            _num(r["recovery_s_p90"], 2),
            _num(r["work_lost_gpu_h_median"], 5),
            _num(r["steps_lost_median"], 0),
            _num(r["managed_over_unmanaged"], 2),
            f"{r['recovery_verdict']}/{r['work_lost_verdict']}" if r["recovery_verdict"] else "",
        )
    table.caption = (
        f"run {result['run_id']}; medians \\[min–max]; m/u: managed/unmanaged median recovery; "
        "verdict: recovery time/work lost vs the plan. " + "; ".join(result["includes"])
    )
    return table


def recovery_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Recovery after real faults ({result['cluster']})",
        "",
        f"Run `{result['run_id']}`: {result['trials']} trials, {result['failed']} failed "
        "(kept as rows with their reason). Clock: `fault_injected` → `serving_again`.",
        "",
        "| fault | arm | n | failed | recovery s median | p90 | min | max "
        "| work lost GPU-h median | steps lost | managed/unmanaged | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in recovery_rows(result):
        verdict = (
            f"{r['recovery_verdict']} / {r['work_lost_verdict']}" if r["recovery_verdict"] else ""
        )
        lines.append(
            f"| {r['fault']} | {r['arm']} | {r['n']} | {r['failed']} "
            f"| {_num(r['recovery_s_median'])} | {_num(r['recovery_s_p90'])} "
            f"| {_num(r['recovery_s_min'])} | {_num(r['recovery_s_max'])} "
            f"| {_num(r['work_lost_gpu_h_median'], 6)} | {_num(r['steps_lost_median'], 0)} "
            f"| {_num(r['managed_over_unmanaged'], 2)} | {verdict} |"
        )
    lines += ["", "What the numbers include: " + "; ".join(result["includes"]) + "."]
    if result["failures"]:
        lines += ["", "## Failed trials", ""]
        lines += [f"- {f['trial_id']} / {f['arm']}: {f['reason']}" for f in result["failures"]]
    return "\n".join(lines)


# --- overhead and cold start --------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2f} %"


def overhead_lines(result: dict[str, Any]) -> list[str]:
    """The overhead result as plain sentences (terminal and markdown alike)."""
    lines = []
    for variant, v in result["variants"].items():
        c = v["comparison"]
        head = f"{variant}: {v['runs']} runs, {v['failed']} failed"
        if c is None:
            lines.append(f"{head}; no complete pair to compare")
            continue
        lines.append(
            f"{head}; managed vs unmanaged run time over {c['n']} pairs: median "
            f"{_pct(c['overhead_pct'])} (95% CI {_pct(c['ci_low_pct'])} … "
            f"{_pct(c['ci_high_pct'])}), {c['method']} p={c['p_value']:.3g} → "
            f"{c['difference']}; minimum detectable effect "
            + ("— (too few pairs)" if c["mde_pct"] is None else f"{c['mde_pct']:.2f} %")
        )
        if variant == "steady":
            lines.append(
                f"  verdict vs {result['threshold_pct']} %: {c['verdict']} ({c['verdict_reason']})"
            )
        else:
            lines.append(f"  {v['note']}")
        if c.get("spread_warning"):
            lines.append(f"  warning: {c['spread_warning']}")
    return lines


def overhead_markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Steady-state overhead and the cost of checkpointing",
        "",
        f"Run `{result['run_id']}`: interleaved A B B A runs, each timed from its first to its "
        "last progress line.",
        "",
    ]
    lines += [f"- {line.strip()}" for line in overhead_lines(result)]
    lines += ["", "## Checkpoints taken", "", *checkpoint_lines(result["checkpoints"])]
    if result["failures"]:
        lines += ["", "## Failed runs", ""]
        lines += [f"- {f['trial_id']} / {f['arm']}: {f['reason']}" for f in result["failures"]]
    return "\n".join(lines)


def checkpoint_lines(checkpoints: dict[str, Any]) -> list[str]:
    lines = []
    for workload, c in checkpoints.items():
        if not c["dump_s"]:
            lines.append(f"- workload {workload}: {c['n']} dumps, {c['failed']} failed")
            continue
        freeze = c["freeze_s"]["median"] if c["freeze_s"] else None
        lines.append(
            f"- workload {workload}: {c['n']} dumps ({c['failed']} failed); median dump "
            f"{c['dump_s']['median']:.3f} s (min {c['dump_s']['min']:.3f}, max "
            f"{c['dump_s']['max']:.3f}), frozen {_num(freeze)} s, image "
            f"{c['checkpoint_bytes']['median'] / 1e6:.1f} MB"
        )
    return lines or ["- none"]


def cold_start_lines(result: dict[str, Any]) -> list[str]:
    s = result["speedup"]
    lines = []
    if s is None:
        lines.append("no native and restored start to compare")
    else:
        for label, arm in (("native launch → ready", "native"), ("restore → ready", "restore")):
            a = s[arm]
            lines.append(
                f"{label}: n={a['n']}, median {_num(a['median'])} s "
                f"(min {_num(a['min'])}, max {_num(a['max'])})"
            )
        lines.append(
            f"speed-up (native/restore, {s['statistic']}): {_num(s['speedup'], 2)}× "
            f"(95% CI {_num(s['ci_low'], 2)} … {_num(s['ci_high'], 2)}); verdict vs "
            f"{result['threshold']}×: {s['verdict']} ({s['verdict_reason']})"
        )
    fit = result["restore_throughput"]
    if fit:
        lines.append(
            f"restore throughput: {_num(fit['gbps'], 2)} GB/s ({fit['method']}, n={fit['n']})"
            + (f"; {fit['note']}" if fit.get("note") else "")
        )
    lines.append(f"page cache before each timed start: {', '.join(result['page_cache'])}")
    return lines


def cold_start_markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Cold start: native launch against restore",
        "",
        f"Run `{result['run_id']}`: the same ready probe ends both clocks.",
        "",
    ]
    lines += [f"- {line}" for line in cold_start_lines(result)]
    lines += [
        "",
        "| trial | restore → ready s | criu restore s | checkpoint MB | GB/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in result["restores"]:
        lines.append(
            f"| {r['trial_id']} | {_num(r['ready_s'])} | {_num(r['restore_s'])} "
            f"| {r['checkpoint_bytes'] / 1e6:.1f} | {_num(r['restore_gbps'], 2)} |"
        )
    lines += ["", f"Plot: `{result['plot']}`", "", "## Checkpoints taken", ""]
    lines += checkpoint_lines(result["checkpoints"])
    if result["failures"]:
        lines += ["", "## Failed starts", ""]
        lines += [f"- {f['trial_id']} / {f['arm']}: {f['reason']}" for f in result["failures"]]
    return "\n".join(lines)
