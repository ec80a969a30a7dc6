"""The record's figures and its extrapolation inputs as tables, drawn by the weekly report's
own functions (tasks.window.weekly.plots, .render) from the record's facts, so the record
and the weekly page show the same points, statistics, CIs and thresholds.

The facts are read through FigureFacts (the record's Facts has these fields), so the
sections can call these without an import circle."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import pandas as pd

from tasks.poc.record.document import Doc
from tasks.poc.record.sources import week_trials
from tasks.window.weekly.model import TITLES
from tasks.window.weekly.plots import Chart, shared_charts, weekly_goodput
from tasks.window.weekly.render import INPUT_HEADS, extrapolation_inputs

__all__ = [
    "INPUT_HEADS",
    "FigureFacts",
    "add_extrapolation_inputs",
    "add_figures",
    "record_charts",
]


class FigureFacts(Protocol):
    """What the figures read of the record's Facts."""

    @property
    def frames(self) -> Mapping[str, pd.DataFrame]: ...

    @property
    def week(self) -> str: ...

    @property
    def seg_weeks(self) -> Sequence[str]: ...

    @property
    def recs(self) -> Sequence[Mapping[str, Any]]: ...


def record_charts(f: FigureFacts) -> list[Chart]:
    """The five figures over the rows behind the verdicts: the segment's trials to date, each
    week's goodput to the record's week, the gain over the segment's weeks; with PNGs."""
    trials = week_trials(f.frames, list(f.seg_weeks))
    per_week = weekly_goodput(f.frames["utilization"])
    per_week = per_week[per_week["week"] <= f.week]
    return shared_charts(trials, per_week, list(f.seg_weeks), f.recs, png=True)


def add_figures(d: Doc, f: FigureFacts) -> None:
    """Each figure under an h3: the picture and its caption (what it shows, from which rows,
    n), or, without data, the caption's one line instead of an empty axis."""
    for chart in record_charts(f):
        d.h(3, chart.title)
        if chart.empty:
            d.p(chart.caption)
        else:
            d.figure(chart.svg, chart.png, chart.caption)


def add_extrapolation_inputs(d: Doc, f: FigureFacts) -> None:
    """The extrapolated rows' inputs, one table (name, value, unit, source) per distinct set,
    under an h3 naming the rows that share it; one line when no row is extrapolated."""
    groups = extrapolation_inputs(f.recs)
    if not groups:
        d.p("No extrapolated row carries inputs.")
        return
    for measures, rows in groups:
        d.h(3, "Inputs of " + ", ".join(TITLES.get(m, m) for m in measures))
        d.table(INPUT_HEADS, rows)
