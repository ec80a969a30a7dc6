"""The weekly report for people: verdict sentences, the table artifact, the markdown and the
self-contained HTML page (plots inline, every text escaped)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.data.render import (
    ci,
    css_class,
    html_page,
    html_table,
    markdown_table,
    number,
    records,
    write_atomically,
)
from tasks.experiments.report import verdict_line
from tasks.window.weekly.model import TITLES, compare
from tasks.window.weekly.plots import plots
from tasks.window.weekly.rows import Series

Rows = pd.DataFrame | Sequence[Mapping[str, Any]]
_CSS = (
    "body{font-family:sans-serif;max-width:70em;margin:1em auto}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.2em .5em}"
    ".met{background:#dfd}.not-met{background:#fdd}.blocked{background:#fec}"
    "img{max-width:100%}"
)
CHANGE_HEADS = ("week", "segment", "source", "field", "before", "after")
GAP_HEADS = ("node", "source", "entity", "metric", "from", "to", "seconds", "reason")


def weekly_verdicts(rows: Rows) -> list[str]:
    """One verdict_line per row that a plan criterion judges."""
    lines = []
    for r in records(rows):
        if not r.get("criterion"):
            continue
        unit = r["unit"]
        detail = ", ".join(
            p
            for p in (
                r["arm"],
                f"n={r['n']}",
                f"95% CI {ci(r)}" if ci(r) else "",
                r.get("note") or "",
            )
            if p
        )
        lines.append(
            verdict_line(
                TITLES.get(r["measure"], r["measure"]),
                r.get("statistic") or "",
                number(r["value"], unit),
                number(r["threshold"], unit),
                r["verdict"],
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
            "verdict": r["verdict"],
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


def weekly_markdown(
    rows: Rows,
    change_points: Sequence[Mapping[str, Any]],
    gaps: Sequence[Mapping[str, Any]],
    html_path: str | Path | None,
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
        "week's. Extrapolated rows list their inputs in the `reports` dataset.",
        "",
    ]
    table = weekly_table_rows(recs)
    if table:
        lines += markdown_table(list(table[0]), [list(t.values()) for t in table])
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
    if html_path:
        lines += ["", f"The full page (plots): `{html_path}`"]
    return "\n".join(lines)


def weekly_html(
    rows: Rows,
    change_points: Sequence[Mapping[str, Any]],
    gaps: Sequence[Mapping[str, Any]],
    series: Series,
    out_path: str | Path,
    *,
    title: str = "",
) -> Path:
    """A self-contained page (PNG data URIs, every text escaped), written atomically."""
    e = html.escape
    recs = records(rows)
    week = recs[0]["week"] if recs else ""
    table = weekly_table_rows(recs)
    parts = [
        f"<h1>{e(title)} — weekly report {e(week)}</h1>",
        "<h2>Verdicts</h2>",
        "<ul>" + "".join(f"<li>{e(v)}</li>" for v in weekly_verdicts(recs)) + "</ul>",
        html_table(
            list(table[0]) if table else ["measure"],
            [list(t.values()) for t in table],
            [css_class(t["verdict"]) for t in table],
        ),
        f"<p>Workloads this week: {e(', '.join(series.workloads) or 'none')}. Trial-based rows "
        "pool the segment's trials to date; extrapolated rows list their inputs below.</p>",
    ]
    for caption, uri in plots(series, recs):
        parts.append(f"<h2>{e(caption)}</h2><img alt='{e(caption)}' src='{uri}'>")
    parts.append("<h2>Extrapolation inputs</h2>")
    for r in recs:
        if r["basis"] == "extrapolated" and r.get("inputs"):
            pretty = json.dumps(json.loads(r["inputs"]), indent=1, sort_keys=True)
            parts.append(f"<h3>{e(r['measure'])}</h3><pre>{e(pretty)}</pre>")
    parts.append("<h2>Change points</h2>")
    parts.append(
        html_table(CHANGE_HEADS, change_rows(change_points)) if change_points else "<p>none</p>"
    )
    parts.append("<h2>Sample gaps this week</h2>")
    gap_rows = [["" if g.get(h) is None else g.get(h) for h in GAP_HEADS] for g in gaps]
    parts.append(html_table(GAP_HEADS, gap_rows) if gaps else "<p>none</p>")
    page = html_page(f"{title} weekly report {week}".strip(), _CSS, parts)
    return write_atomically(out_path, page.encode("utf-8"))
