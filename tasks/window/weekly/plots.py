"""The weekly report's plots, as PNG data URIs for its self-contained page."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from tasks.data.render import png_data_uri
from tasks.window.weekly.model import ok_trials
from tasks.window.weekly.rows import Series

ARM_ORDER = ("managed", "unmanaged")


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return png_data_uri(buf.getvalue())


def plots(series: Series, rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weeks = series.weeks
    out = []

    def per_week(measure: str, title: str, ylabel: str, arms: Sequence[str]) -> None:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        drawn = False
        for arm in arms:
            s = weeks[(weeks["measure"] == measure) & (weeks["arm"] == arm)]
            s = s.dropna(subset=["value"])
            if s.empty:
                continue
            drawn = True
            lo = (s["value"] - s["ci_low"]).fillna(0).clip(lower=0)
            hi = (s["ci_high"] - s["value"]).fillna(0).clip(lower=0)
            ax.errorbar(s["week"], s["value"], yerr=[lo, hi], marker="o", capsize=3, label=arm)
        thr = [
            r["threshold"] for r in rows if r["measure"] == measure and r["threshold"] is not None
        ]
        if thr:
            ax.axhline(thr[0], linestyle="--", color="grey", label=f"threshold {thr[0]:g}")
        if drawn or thr:
            ax.legend(fontsize=8)
        if not drawn:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        out.append((title, _png(fig)))

    per_week("goodput", "Goodput per arm per week", "delivered / allocated", ARM_ORDER)
    per_week(
        "utilization",
        "Busy per arm per week (GPU: fraction of time; CPU-only: cores)",
        "busy (see the row's unit)",
        ARM_ORDER,
    )

    def distribution(col: str, title: str, ylabel: str) -> None:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        rec = ok_trials(series.trials, "recovery")
        data = [rec[rec["arm"] == a][col].dropna().astype(float).to_numpy() for a in ARM_ORDER]
        if any(len(d) for d in data):
            ax.boxplot([d if len(d) else [np.nan] for d in data], showfliers=False)
            for i, d in enumerate(data, start=1):
                ax.plot(np.full(len(d), i), d, "o", alpha=0.6)
            ax.set_xticks([1, 2], ARM_ORDER)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        out.append((title, _png(fig)))

    distribution("recovery_s", "Recovery time per arm (segment to date)", "seconds")
    distribution("work_lost_gpu_h", "Work lost per interruption per arm", "GPU-hours")
    per_week("overhead_pct", "Steady-state overhead with 95% CI", "%", ("both",))
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for measure, label in (("goodput_gain", "measured"), ("goodput_gain_expected", "extrapolated")):
        s = weeks[weeks["measure"] == measure].dropna(subset=["value"])
        if not s.empty:
            ax.plot(s["week"], s["value"], marker="o", label=label)
    ax.set_title("Goodput gain: measured against the waste model")
    ax.set_ylabel("managed − unmanaged")
    if ax.lines:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    out.append(("Goodput gain: measured against the waste model", _png(fig)))
    return out
