"""Rendering for people, shared by the weekly report, the decision record and the stages'
artifacts: numbers with their units and CIs, markdown tables, the jinja2 environment of the
HTML pages (templates/: the page and its tables), figures (inline SVG, PNG bytes and data
URIs) and the atomic write of a rendered file.

Every figure a person reads goes through these, so the same value reads the same in the
terminal, a Prefect artifact, the weekly page and the record.
"""

from __future__ import annotations

import base64
import functools
import html
import io
import math
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from markupsafe import Markup

NO_VALUE = "—"


# --- numbers -----------------------------------------------------------------------------------


def sig(value: float | None, digits: int = 3) -> str:
    """``digits`` significant digits in fixed notation (0.0000974, not 9.74e-05)."""
    if value is None:
        return NO_VALUE
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def fixed(value: float | None, digits: int = 3) -> str:
    """``digits`` decimals."""
    return NO_VALUE if value is None else f"{value:.{digits}f}"


def pct(value: float | None) -> str:
    """A signed percentage: "+2.35 %"."""
    return NO_VALUE if value is None else f"{value:+.2f} %"


def number(value: float | None, unit: str = "") -> str:
    """A value in its unit as the reports print it: % signed to two decimals, × to two,
    a fraction to three, anything else to three significant digits followed by the unit."""
    if value is None:
        return NO_VALUE
    if unit == "%":
        return pct(value)
    if unit == "×":
        return f"{value:.2f}×"
    if unit == "fraction":
        return f"{value:.3f}"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"  # without the unit, as the reports have always printed it
    return sig(value) + (f" {unit}" if unit else "")


def ci(row: Mapping[str, Any]) -> str:
    """A row's 95% CI, "low … high" in its unit (ci_low, ci_high, unit); "" without one."""
    if row.get("ci_low") is None:
        return ""
    return f"{number(row['ci_low'], row['unit'])} … {number(row['ci_high'], row['unit'])}"


def records(rows: pd.DataFrame | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows as plain dicts, NaN/NA from a frame read as None ("no value")."""
    recs = rows.to_dict("records") if isinstance(rows, pd.DataFrame) else [dict(r) for r in rows]
    for r in recs:
        for k, v in r.items():
            if not isinstance(v, (list, dict, str)) and v is not None and pd.isna(v):
                r[k] = None
    return recs


# --- tables ------------------------------------------------------------------------------------


def markdown_table(
    heads: Sequence[str], rows: Sequence[Sequence[Any]], align: str = ""
) -> list[str]:
    """A markdown table's lines. ``align``: one letter a column, "l" or "r" (default "l");
    a "|" in a cell is escaped."""

    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    rule = ["---:" if align[i : i + 1] == "r" else "---" for i in range(len(heads))]
    return [line(heads), "|" + "|".join(rule) + "|", *(line(r) for r in rows)]


def css_class(verdict: str) -> str:
    """A verdict as a CSS class: "not met" → "not-met"."""
    return verdict.replace(" ", "-")


# --- pages and files ---------------------------------------------------------------------------


def _escaped(value: Any) -> Any:
    """Each ``{{ value }}`` as html.escape writes it (&#x27;, &quot;, as the pages always
    have), before autoescape, which leaves the Markup alone; markup (a macro's, ``| safe``)
    as it is."""
    if hasattr(value, "__html__"):
        return value
    return Markup(html.escape(str(value)))


@functools.cache
def html_environment(package: str) -> jinja2.Environment:
    """The HTML templates: ``package``'s templates/ folder first, then the shared ones beside
    this module (page.html.j2, macros.html.j2); every value escaped, an undefined name an
    error."""
    shared = jinja2.PackageLoader(__name__.rpartition(".")[0])
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader([jinja2.PackageLoader(package), shared]),
        autoescape=True,  # the templates are all HTML
        undefined=jinja2.StrictUndefined,
        finalize=_escaped,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_page(package: str, template: str, **context: Any) -> str:
    """``package``'s ``template`` rendered with ``context``: a self-contained page (its CSS in
    the template, its figures inline)."""
    return html_environment(package).get_template(template).render(**context)


def png_data_uri(png: bytes) -> str:
    """PNG bytes as a data: URI (shown inline by browsers and the Prefect UI)."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


# --- figures -----------------------------------------------------------------------------------

# Text stays text (the page's own sans-serif: nothing to fetch), ids hash from a fixed salt and
# no date is written, so the same data draws the same bytes.
_SVG_RC = {"svg.fonttype": "none", "svg.hashsalt": "ckpt-poc"}
_ID = re.compile(r'\bid="([^"]+)"')


def figure_svg(fig: Any, prefix: str, title: str) -> str:
    """A matplotlib figure as SVG to inline in an HTML page: no XML prolog, doctype or
    metadata; every id (and each reference to it) prefixed with ``prefix`` so several figures
    on one page cannot collide; ``title`` as the SVG's accessible name."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(_SVG_RC):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"\s*<metadata>.*?</metadata>", "", text, flags=re.S)
    # matplotlib's one style rule ("*{stroke-…}") would reach the whole page: keep it to SVGs.
    text = text.replace('<style type="text/css">*{', '<style type="text/css">svg *{')
    for ident in set(_ID.findall(text)):
        new = prefix + ident
        text = text.replace(f'id="{ident}"', f'id="{new}"')
        text = text.replace(f"url(#{ident})", f"url(#{new})")
        text = text.replace(f'href="#{ident}"', f'href="#{new}"')
    head_end = text.index(">") + 1
    label = html.escape(title)
    return (
        text[: head_end - 1]
        + f' role="img" aria-label="{label}">'
        + f"<title>{label}</title>"
        + text[head_end:]
    )


def figure_png(fig: Any, dpi: int = 150) -> bytes:
    """A matplotlib figure as PNG bytes (for the PDF, which embeds it as an image)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def write_atomically(path: str | Path, data: bytes) -> Path:
    """Temp file then rename: a reader sees the old file or the new one, never half."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
