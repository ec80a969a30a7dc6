"""What every figure of the weekly report and the record is drawn with: the Chart (SVG for
the pages, PNG for the PDF, the values drawn), the arms' order and colours, a new figure, a
jittered strip of points, the plan's threshold line and a caption's run list."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tasks.data.arms import ARMS, MANAGED, UNMANAGED
from tasks.data.render import ci, figure_png, figure_svg, number

# The figures draw the managed arm first (left, and first in a legend): ARMS reversed.
ARM_ORDER = tuple(reversed(ARMS))
COLOURS = {MANAGED: "#1f77b4", UNMANAGED: "#d62728", "both": "#555555"}
JITTER = 0.12  # half-width of a strip's spread, in category units
SEED = 0  # the strips' jitter: the same rows draw the same picture
Rows = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class Chart:
    """One figure: its title, a caption saying what it shows and from which rows (n), the
    SVG and (when asked) PNG, and the values drawn per series. No data: no picture, and the
    caption says so in one line."""

    title: str
    caption: str
    svg: str = ""
    png: bytes = b""
    points: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.svg


def new_figure(ncols: int = 1, width: float = 6.4) -> tuple[Any, Any]:
    # A bare Figure, not pyplot: no global figure state to leak or close.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 3.3))
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def finish_chart(
    fig: Any,
    slug: str,
    title: str,
    caption: str,
    points: Mapping[str, Sequence[float]],
    png: bool,
) -> Chart:
    fig.tight_layout()
    return Chart(
        title,
        caption,
        figure_svg(fig, f"{slug}-", title),
        figure_png(fig) if png else b"",
        {k: tuple(float(x) for x in v) for k, v in points.items()},
    )


def report_row(rows: Rows, measure: str, arm: str) -> Mapping[str, Any] | None:
    return next((r for r in rows if r["measure"] == measure and r["arm"] == arm), None)


def runs_of(df: pd.DataFrame) -> str:
    runs = sorted(df["run_id"].dropna().astype(str).unique()) if "run_id" in df else []
    return ", ".join(runs) or "—"


def threshold_line(ax: Any, row: Mapping[str, Any] | None) -> str:
    """The plan's threshold as a dashed line; the caption's words for it."""
    if not row or row.get("threshold") is None:
        return ""
    thr, unit = float(row["threshold"]), row["unit"]
    sense = "≤" if row.get("at_most", True) else "≥"
    ax.axhline(thr, linestyle="--", color="grey", lw=1, label=f"threshold {sense} {thr:g}")
    return f"dashed: the plan's threshold ({row.get('statistic') or 'value'} {sense} " + (
        f"{number(thr, unit)})"
    )


def ci_words(row: Mapping[str, Any]) -> str:
    interval = ci(row)
    return f"95% CI {interval}" if interval else "no CI: fewer than 2 values"


def strip_points(
    ax: Any, groups: Sequence[tuple[str, str, np.ndarray]], gid: str
) -> dict[str, list[float]]:
    """One jittered column of points per group (label, arm, values), its median a black bar."""
    rng = np.random.default_rng(SEED)
    drawn: dict[str, list[float]] = {}
    for i, (label, arm, values) in enumerate(groups):
        xs = i + rng.uniform(-JITTER, JITTER, len(values))
        ax.plot(xs, values, "o", ms=5, alpha=0.7, color=COLOURS[arm], gid=f"{gid}-{i}", label=None)
        if len(values):
            ax.hlines(float(np.median(values)), i - 0.3, i + 0.3, color="black", lw=2)
        drawn[label] = list(values)
    ax.set_xticks(range(len(groups)), [g[0].replace("/", "\n") for g in groups], fontsize=8)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    return drawn


def failed_count(trials: pd.DataFrame, measure: str) -> int:
    return int(((trials["measure"] == measure) & (trials["status"] != "ok")).sum())
