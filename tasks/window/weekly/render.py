"""The weekly report for people: verdict sentences, the table artifact, the markdown, the
extrapolation inputs as tables and the self-contained HTML page (templates/weekly.html.j2:
figures as inline SVG, every text escaped)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.data.errors import CkptPocError
from tasks.data.render import (
    NO_VALUE,
    ci,
    css_class,
    markdown_table,
    number,
    records,
    render_page,
    sig,
    write_atomically,
)
from tasks.experiments.report import verdict_line
from tasks.window.weekly.goodput import HEADS as GOODPUT_HEADS
from tasks.window.weekly.goodput import TITLE as GOODPUT
from tasks.window.weekly.goodput import GoodputSection
from tasks.window.weekly.interruptions import HEADS as LOSS_HEADS
from tasks.window.weekly.interruptions import TITLE as INTERRUPTIONS
from tasks.window.weekly.interruptions import InterruptionSection
from tasks.window.weekly.model import TITLES, compare, verdict_text
from tasks.window.weekly.plots import plots
from tasks.window.weekly.restores import (
    CAUSE_HEADS,
    RESTORE_HEADS,
    WORKLOAD_HEADS,
    CompatSection,
    cause_rows,
    restore_rows,
    restores_line,
    section_markdown,
    workload_rows,
)
from tasks.window.weekly.rows import Series

Rows = pd.DataFrame | Sequence[Mapping[str, Any]]
CHANGE_HEADS = ("week", "segment", "source", "field", "before", "after")
GAP_HEADS = ("node", "source", "entity", "metric", "from", "to", "seconds", "reason")


INPUT_HEADS = ("name", "value", "unit", "source")
# An extrapolation input's key → (name, unit, source); the source may name other keys of the
# same inputs in braces ({delta_from}), filled from them.
_INPUTS: dict[str, tuple[str, str, str]] = {
    "exposure.lambda_per_h": (
        "λ, interruptions per hour of job time",
        "per h",
        "baseline run {run_id}: {lambda_basis}",
    ),
    "exposure.interruptions": (
        "interrupted allocations",
        "",
        "baseline run {run_id}, states {interrupted_states}",
    ),
    "exposure.gpu_hours": ("GPU-hours in the baseline", "GPU-h", "baseline run {run_id}"),
    "exposure.node_hours": ("node-hours in the baseline", "node-h", "baseline run {run_id}"),
    "exposure.states": ("states in the baseline", "", "baseline run {run_id}"),
    "mtbf_s": ("M, mean time between interruptions", "s", "1 / λ"),
    "delta_s": ("δ, checkpoint cost", "s", "{delta_from} of the checkpoint trials"),
    "checkpoint_trials.n": ("checkpoint trials", "", "runs {checkpoint_trials.run_ids}"),
    "R_managed_s": ("R managed, recovery time", "s", "median recovery_s, managed trials"),
    "R_unmanaged_s": ("R unmanaged, recovery time", "s", "median recovery_s, unmanaged trials"),
    "L_unmanaged_s": ("L unmanaged, work lost", "s", "{L_unmanaged_from}"),
    "recovery_trials.managed": ("recovery trials, managed", "", "runs {recovery_trials.run_ids}"),
    "recovery_trials.unmanaged": (
        "recovery trials, unmanaged",
        "",
        "runs {recovery_trials.run_ids}",
    ),
    "tau_plan_s": ("τ, the plan's checkpoint interval", "s", "plan: checkpointer.interval_s"),
    "young_s": ("Young's interval √(2δM)", "s", "Young 1974"),
    "daly_s": ("Daly's optimal interval", "s", "Daly 2006, eq. 37"),
    "waste_at_optimum": ("waste at Daly's interval", "fraction", "δ/τ + λ(τ/2 + R managed)"),
    "waste_at_plan": ("waste at the plan's interval", "fraction", "δ/τ + λ(τ/2 + R managed)"),
    "waste_unmanaged": ("waste, unmanaged", "fraction", "λ(L unmanaged + R unmanaged)"),
    "goodput_managed_expected": ("expected goodput, managed", "fraction", "1 − waste, in [0, 1]"),
    "goodput_unmanaged_expected": (
        "expected goodput, unmanaged",
        "fraction",
        "1 − waste, in [0, 1]",
    ),
    "goodput_gain_measured": ("measured goodput gain", "fraction", "this week's goodput_gain row"),
    "segment": ("comparability segment", "", "the weekly segments"),
}
# Keys shown only inside another input's source.
_SOURCE_ONLY = {
    "delta_from",
    "L_unmanaged_from",
    "exposure.run_id",
    "exposure.lambda_basis",
    "exposure.interrupted_states",
    "checkpoint_trials.run_ids",
    "recovery_trials.run_ids",
}
_UNITS = (("_s", "s"), ("_h", "h"), ("_pct", "%"), ("_bytes", "bytes"))


# A value of parsed JSON that is not an object: what an inputs cell shows.
JsonLeaf = str | int | float | bool | list[Any] | None


def _flat(value: Any, prefix: str = "") -> dict[str, JsonLeaf]:
    """The JSON object's leaves, keyed by their dotted paths."""
    if isinstance(value, Mapping):
        out: dict[str, JsonLeaf] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def _cell(value: Any) -> str:
    if value is None:
        return NO_VALUE
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, list):
            return ", ".join(map(str, value)) or NO_VALUE
        return str(value)
    if isinstance(value, int):
        return str(value)
    return sig(float(value))  # the unit has its own column


def inputs_table_rows(inputs: str | None, where: str = "inputs") -> list[list[str]]:
    """One extrapolated row's ``inputs`` JSON as table rows (INPUT_HEADS: name, value, unit,
    source), never JSON: the waste model's inputs first, in a fixed order, then any other key
    by name. A gate that blocked the row is one line per failed check. ``where`` names the
    row in the error for input that is not a JSON object."""
    if not inputs:
        return []
    try:
        data = json.loads(inputs)
    except json.JSONDecodeError as exc:
        raise CkptPocError(f"{where}: not JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, dict):
        raise CkptPocError(f"{where}: a JSON object expected, got {type(data).__name__}")
    blocked = data.pop("blocked_by", None) or []
    flat = _flat(data)
    fill = {k: _cell(v) for k, v in flat.items()}

    def source(template: str) -> str:
        for key, val in fill.items():
            template = template.replace("{" + key.removeprefix("exposure.") + "}", val)
            template = template.replace("{" + key + "}", val)
        return re.sub(r"\{[^}]*\}", NO_VALUE, template)  # an input the row lacks

    out = []
    for key, (name, unit, src) in _INPUTS.items():
        if key in flat:
            out.append([name, _cell(flat[key]), unit, source(src)])
    for key in sorted(set(flat) - set(_INPUTS) - _SOURCE_ONLY):
        unit = next((u for suffix, u in _UNITS if key.endswith(suffix)), "")
        out.append([key, _cell(flat[key]), unit, "the row's inputs"])
    for b in blocked:
        b = b if isinstance(b, Mapping) else {"gate": str(b)}
        check = f"{b.get('gate', '?')}/{b.get('expectation', '?')}"
        out.append(["blocked by a failed gate", check, "", f"run {b.get('run_id', '?')}"])
    return out


def extrapolation_inputs(rows: Rows) -> list[tuple[list[str], list[list[str]]]]:
    """The extrapolated rows' inputs, one table per distinct set: (the measures sharing it,
    its INPUT_HEADS rows)."""
    groups: dict[str, list[str]] = {}
    for r in records(rows):
        if r["basis"] == "extrapolated" and r.get("inputs"):
            groups.setdefault(r["inputs"], []).append(r["measure"])
    return [
        (measures, inputs_table_rows(raw, f"reports row {measures[0]}: inputs"))
        for raw, measures in groups.items()
    ]


def weekly_verdicts(rows: Rows) -> list[str]:
    """One verdict_line per row that a plan criterion judges."""
    lines = []
    for r in records(rows):
        if not r.get("criterion"):
            continue
        unit = r["unit"]
        verdict = verdict_text(str(r["verdict"]), r.get("note"))
        # A blocked or undecided verdict carries its note; any other shows it as detail.
        note = "" if verdict != r["verdict"] else r.get("note") or ""
        detail = ", ".join(
            p for p in (r["arm"], f"n={r['n']}", f"95% CI {ci(r)}" if ci(r) else "", note) if p
        )
        lines.append(
            verdict_line(
                TITLES.get(r["measure"], r["measure"]),
                r.get("statistic") or "",
                number(r["value"], unit),
                number(r["threshold"], unit),
                verdict,
                at_most=bool(r.get("at_most", True)),
                detail=detail,
                # A verdict that is not the plain comparison (by CI, min_weeks) reads "vs".
                by_ci=r["verdict"] != compare(r["value"], r["threshold"], r["at_most"]),
            )
        )
    return lines


def weekly_table_rows(rows: Rows) -> list[dict[str, Any]]:
    """Rows for a Prefect table artifact: strings people read, one per report row."""
    return [
        {
            "measure": r["measure"],
            "arm": r["arm"],
            "basis": r["basis"],
            "n": int(r["n"]),
            "value": number(r["value"], r["unit"]),
            "95% CI": ci(r),
            "threshold": number(r["threshold"], r["unit"]),
            "verdict": verdict_text(str(r["verdict"]), r.get("note")),
            "segment": int(r["segment"]),
            "note": r.get("note") or "",
        }
        for r in records(rows)
    ]


def change_rows(change_points: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """One row per changed field of each change point (CHANGE_HEADS)."""
    return [
        [cp["week"], cp["segment"], c["source"], c["field"], c["before"], c["after"]]
        for cp in change_points
        for c in cp["changes"]
    ]


def _change_text(cp: Mapping[str, Any]) -> str:
    return "; ".join(
        f"{c['source']} {c['field']}: {c['before']} → {c['after']}" for c in cp["changes"]
    )


# A PoC outlives upgrades of the product: which version of each dataset the report read.
VERSIONS_READ = "Datasets read, by version"


def weekly_markdown(
    rows: Rows,
    change_points: Sequence[Mapping[str, Any]],
    gaps: Sequence[Mapping[str, Any]],
    html_path: str | Path | None,
    compatibility: CompatSection | None = None,
    interruptions: InterruptionSection | None = None,
    goodput: GoodputSection | None = None,
    versions: Sequence[str] = (),
) -> str:
    recs = records(rows)
    week = recs[0]["week"] if recs else "?"
    seg = recs[0]["segment"] if recs else 0
    lines = [
        f"# Weekly report {week} (comparability segment {seg})",
        "",
        "## Verdicts (against the plan)",
        "",
        *[f"- {v}" for v in weekly_verdicts(recs)],
        "",
        "## All rows",
        "",
        "Trial-based rows pool the segment's trials to date; utilization and goodput are this "
        "week's. Extrapolated rows list their inputs below (and in the `reports` dataset).",
        "",
    ]
    table = weekly_table_rows(recs)
    if table:
        lines += markdown_table(list(table[0]), [list(t.values()) for t in table])
    for measures, table_rows in extrapolation_inputs(recs):
        titles = ", ".join(TITLES.get(m, m) for m in measures)
        lines += ["", f"### Inputs of {titles}", "", *markdown_table(INPUT_HEADS, table_rows)]
    lines += ["", "## Change points", ""]
    lines += [
        f"- {cp['week']} (segment {cp['segment']}): {_change_text(cp)}" for cp in change_points
    ]
    if not change_points:
        lines.append("- none")
    lines += ["", "## Sample gaps this week", ""]
    lines += [
        f"- {g['node']} {g['source']} {g.get('metric') or 'all metrics'}: {g['from']} → "
        f"{g['to']} ({g['seconds']:.0f} s): {g['reason']}"
        for g in gaps
    ]
    if not gaps:
        lines.append("- none")
    if compatibility is not None:
        lines += ["", *section_markdown(compatibility)]
    if interruptions is not None:
        lines += ["", f"## {INTERRUPTIONS}", "", interruptions.line, ""]
        lines += markdown_table(LOSS_HEADS, interruptions.rows) if interruptions.rows else []
        lines += [f"- {h}" for h in interruptions.holds]
    if goodput is not None:
        lines += ["", f"## {GOODPUT}", "", goodput.status, ""]
        lines += markdown_table(GOODPUT_HEADS, goodput.rows) if goodput.rows else []
        lines += [f"- excluded: {x}" for x in goodput.exclusions]
    if versions:
        lines += ["", f"## {VERSIONS_READ}", "", *[f"- {v}" for v in versions]]
    if html_path:
        lines += ["", f"The full page (plots): `{html_path}`"]
    return "\n".join(lines)


# a dict: the HTML template's context
def _compat_context(s: CompatSection) -> dict[str, Any]:
    """The Compatibility and Restore reliability sections' lines and rows."""
    return {
        "headline": s.headline,
        "workloads": workload_rows(s) if s.workloads else [],
        "causes": cause_rows(s),
        "restores_line": restores_line(s.restores),
        "restores": restore_rows(s.restores) if s.restores else [],
    }


def weekly_html(
    rows: Rows,
    change_points: Sequence[Mapping[str, Any]],
    gaps: Sequence[Mapping[str, Any]],
    series: Series,
    out_path: str | Path,
    *,
    title: str = "",
    compatibility: CompatSection | None = None,
    interruptions: InterruptionSection | None = None,
    goodput: GoodputSection | None = None,
    versions: Sequence[str] = (),
) -> Path:
    """A self-contained page (templates/weekly.html.j2: figures as inline SVG, every text
    escaped), written atomically."""
    recs = records(rows)
    week = recs[0]["week"] if recs else ""
    table = weekly_table_rows(recs)
    page = render_page(
        __name__.rpartition(".")[0],
        "weekly.html.j2",
        page_title=f"{title} weekly report {week}".strip(),
        title=title,
        week=week,
        verdicts=weekly_verdicts(recs),
        heads=list(table[0]) if table else ["measure"],
        rows=[list(t.values()) for t in table],
        classes=[css_class(t["verdict"].split(":", 1)[0]) for t in table],
        workloads=", ".join(series.workloads) or "none",
        charts=plots(series, recs),
        input_heads=INPUT_HEADS,
        inputs=[
            (", ".join(TITLES.get(m, m) for m in measures), table_rows)
            for measures, table_rows in extrapolation_inputs(recs)
        ],
        change_heads=CHANGE_HEADS,
        change_rows=change_rows(change_points),
        gap_heads=GAP_HEADS,
        gap_rows=[["" if g.get(h) is None else g.get(h) for h in GAP_HEADS] for g in gaps],
        compatibility=None if compatibility is None else _compat_context(compatibility),
        workload_heads=WORKLOAD_HEADS,
        cause_heads=CAUSE_HEADS,
        restore_heads=RESTORE_HEADS,
        interruptions=interruptions,
        interruptions_title=INTERRUPTIONS,
        loss_heads=LOSS_HEADS,
        goodput=goodput,
        goodput_title=GOODPUT,
        goodput_heads=GOODPUT_HEADS,
        versions=list(versions),
        versions_title=VERSIONS_READ,
    )
    return write_atomically(out_path, page.encode("utf-8"))
