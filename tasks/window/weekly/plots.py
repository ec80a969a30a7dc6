"""The figures of the weekly report and the decision record, drawn from the same rows by the
same functions: every trial a point, each figure's statistic, CI and plan threshold taken from
the report row it illustrates. A figure is a Chart: inline SVG for the pages, PNG for the PDF,
and the values it drew (what the tests count)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.measures import (
    BUSY_FRACTION,
    COLD_START_SPEEDUP,
    GOODPUT,
    GOODPUT_GAIN,
    GOODPUT_GAIN_EXPECTED,
    OVERHEAD_PCT,
    RECOVERY_S,
    WORK_LOST_GPU_H,
)
from tasks.data.render import number
from tasks.window.weekly.model import ok_trials
from tasks.window.weekly.plots_base import (
    ARM_ORDER,
    COLOURS,
    Chart,
    Rows,
    ci_words,
    failed_count,
    finish_chart,
    new_figure,
    report_row,
    runs_of,
    strip_points,
    threshold_line,
)
from tasks.window.weekly.plots_phases import phases_chart, restore_throughput_chart
from tasks.window.weekly.rows import Series


def recovery_chart(trials: pd.DataFrame, rows: Rows, *, png: bool = False) -> Chart:
    """Recovery time per fault and arm, every ok recovery trial a point, medians marked,
    the plan's threshold (it judges the managed arm)."""
    title = "Recovery time per fault and arm (every trial)"
    col = RECOVERY_S.column
    rec = ok_trials(trials, "recovery").dropna(subset=[col])
    if rec.empty:
        return Chart(title, "No ok recovery trial with a recovery time: nothing to draw.")
    faults = rec["fault"].fillna("no fault recorded").astype(str)
    groups = [
        (f"{fault}/{arm}", arm, rec[(faults == fault) & (rec["arm"] == arm)][col])
        for fault in sorted(faults.unique())
        for arm in ARM_ORDER
    ]
    groups = [(g, a, v.to_numpy(float)) for g, a, v in groups if len(v)]
    fig, (ax,) = new_figure()
    drawn = strip_points(ax, groups, "recovery")
    thr = threshold_line(ax, report_row(rows, RECOVERY_S.name, MANAGED))
    ax.set_ylabel("recovery time (s)")
    counts = ", ".join(f"{g} {len(v)}" for g, _, v in groups)
    caption = (
        f"Every ok recovery trial of the rows behind the recovery-time verdict, one point each "
        f"(n = {len(rec)}: {counts}; runs {runs_of(rec)}); black bar: each group's median"
        + (f"; {thr}" if thr else "")
        + f". Failed trials not drawn: {failed_count(trials, 'recovery')}."
    )
    return finish_chart(fig, "recovery", title, caption, drawn, png)


def work_lost_chart(trials: pd.DataFrame, rows: Rows, *, png: bool = False) -> Chart:
    """Work lost per interruption per arm, every ok recovery trial a point."""
    title = "Work lost per interruption per arm (every trial)"
    col = WORK_LOST_GPU_H.column
    rec = ok_trials(trials, "recovery").dropna(subset=[col])
    if rec.empty:
        return Chart(title, "No ok recovery trial with work lost recorded: nothing to draw.")
    groups = [(arm, arm, rec[rec["arm"] == arm][col].to_numpy(float)) for arm in ARM_ORDER]
    groups = [g for g in groups if len(g[2])]
    fig, (ax,) = new_figure()
    drawn = strip_points(ax, groups, "work-lost")
    thr = threshold_line(ax, report_row(rows, WORK_LOST_GPU_H.name, MANAGED))
    ax.set_ylabel("work lost (GPU-hours)")
    counts = ", ".join(f"{g} {len(v)}" for g, _, v in groups)
    caption = (
        f"Every ok recovery trial with work lost recorded, all faults pooled as the verdict "
        f"pools them (n = {len(rec)}: {counts}; runs {runs_of(rec)}); black bar: the median"
        + (f"; {thr}" if thr else "")
        + "."
    )
    return finish_chart(fig, "work-lost", title, caption, drawn, png)


def weekly_goodput(util: pd.DataFrame) -> pd.DataFrame:
    """Goodput per (week, arm) from UTILIZATION rows as the weekly rows compute it: the latest
    row per (week, arm, workload), Σ delivered / Σ allocated GPU-h (weeks with none allocated
    left out). Columns week, arm, value, jobs."""
    cols = ["week", "arm", "value", "jobs"]
    if util.empty:
        return pd.DataFrame(columns=cols)
    latest = util.sort_values("computed_at").drop_duplicates(
        ["week", "arm", "workload"], keep="last"
    )
    g = latest.groupby(["week", "arm"], observed=True)[
        ["delivered_gpu_h", "allocated_gpu_h", "jobs"]
    ].sum()
    g = g[g["allocated_gpu_h"] > 0].reset_index()
    g["value"] = g["delivered_gpu_h"].astype(float) / g["allocated_gpu_h"].astype(float)
    g["week"] = g["week"].astype(str)
    return g[cols].sort_values(["week", "arm"]).reset_index(drop=True)


def goodput_chart(
    per_week: pd.DataFrame, gain_weeks: Sequence[str], rows: Rows, *, png: bool = False
) -> Chart:
    """Left: goodput per arm per week (one ratio of sums a week: no CI of its own). Right: the
    weekly managed − unmanaged gain over the weeks the criterion pools, its statistic with
    the 95% CI and the plan's threshold. ``per_week``: week, arm, value (weekly_goodput)."""
    title = "Goodput per arm per week, and the gain against the plan"
    pw = per_week.dropna(subset=["value"])
    if pw.empty:
        return Chart(title, "No week with allocated GPU time on either arm: nothing to draw.")
    wide = pw.pivot_table(index="week", columns="arm", values="value", aggfunc="first")
    weeks = sorted(wide.index)
    fig, (left, right) = new_figure(2, width=9.6)
    drawn: dict[str, list[float]] = {}
    for arm in ARM_ORDER:
        if arm not in wide.columns:
            continue
        s = wide[arm].dropna()
        left.plot(
            [weeks.index(w) for w in s.index],
            s.to_numpy(float),
            "o-",
            color=COLOURS[arm],
            label=arm,
            gid=f"goodput-{arm}",
        )
        drawn[arm] = list(s.to_numpy(float))
    left.set_xticks(range(len(weeks)), weeks, rotation=45, fontsize=7)
    left.set_ylabel("delivered / allocated GPU-h")
    left.set_title("goodput per arm", fontsize=9)
    left.legend(fontsize=7)
    gains = pd.Series(dtype=float)
    if set(ARM_ORDER) <= set(wide.columns):
        both = wide.dropna(subset=list(ARM_ORDER))
        both = both[both.index.isin(list(gain_weeks))]
        gains = both[MANAGED] - both[UNMANAGED]
    row = report_row(rows, GOODPUT_GAIN.name, "both")
    if len(gains):
        right.plot(range(len(gains)), gains.to_numpy(float), "o", color="black", gid="gain")
        right.set_xticks(range(len(gains)), list(gains.index), rotation=45, fontsize=7)
        drawn["gain"] = list(gains.to_numpy(float))
    if row and row.get("value") is not None:
        right.axhline(float(row["value"]), color=COLOURS[MANAGED], lw=1.5, label="statistic")
        if row.get("ci_low") is not None:
            right.axhspan(row["ci_low"], row["ci_high"], color=COLOURS[MANAGED], alpha=0.15)
    thr = threshold_line(right, row)
    right.set_ylabel("managed − unmanaged goodput")
    right.set_title("weekly gain (criterion)", fontsize=9)
    right.legend(fontsize=7)
    verdict = (
        f"the gain row: {number(row['value'], row['unit'])} ({ci_words(row)}; "
        f"n = {int(row['n'])} week(s) with both arms), {row['verdict']}"
        + (f" — {row['note']}" if row.get("note") else "")
        if row and row.get("value") is not None
        else "no gain row with a value"
    )
    caption = (
        "Left: each week's goodput per arm from the UTILIZATION rows (n = "
        + ", ".join(f"{a} {len(v)} week(s)" for a, v in drawn.items() if a != "gain")
        + "); a week's goodput is one ratio of sums and has no CI of its own. Right: the gain "
        f"of each week with both arms that the criterion pools ({len(gains)}), the statistic "
        f"as a line with its 95% CI shaded; {verdict}" + (f"; {thr}" if thr else "") + "."
    )
    return finish_chart(fig, "goodput", title, caption, drawn, png)


def cold_start_chart(trials: pd.DataFrame, rows: Rows, *, png: bool = False) -> Chart:
    """Cold start against checkpoint size, both clocks: each restore (restore_start → ready)
    at its image's size, each native start (launch → ready) at the size of the checkpoint its
    own copy was dumped to (the restore of the same trial); each clock's median over all its
    trials as a dotted line (a trial without a size is in the median only)."""
    title = "Cold start by checkpoint size, both clocks"
    cs = ok_trials(trials, "cold_start")
    cs = cs[cs["ready_s"].notna() & (cs["ready_s"] > 0)]
    if cs.empty:
        return Chart(title, "No ok cold-start trial with a ready time: nothing to draw.")
    restore = cs[cs["arm"] == MANAGED]
    native = cs[cs["arm"] == UNMANAGED]
    size = restore.dropna(subset=["checkpoint_bytes"]).astype({"run_id": str, "trial_id": str})
    size = size.drop_duplicates(["run_id", "trial_id"]).set_index(["run_id", "trial_id"])
    fig, (ax,) = new_figure()
    drawn: dict[str, list[float]] = {}
    counts = []
    for name, df, arm in (("restore", restore, MANAGED), ("native", native, UNMANAGED)):
        if df.empty:
            continue
        keys = pd.MultiIndex.from_frame(df[["run_id", "trial_id"]].astype(str))
        mb = size["checkpoint_bytes"].reindex(keys).to_numpy(float) / 1e6
        sized = ~np.isnan(mb)
        clock = ", ".join(sorted(df["clock"].dropna().astype(str).unique())) or name
        ready = df["ready_s"].to_numpy(float)
        if sized.any():
            ax.plot(
                mb[sized],
                ready[sized],
                "o",
                color=COLOURS[arm],
                alpha=0.7,
                label=f"{name} ({clock})",
                gid=f"cold-{name}",
            )
            drawn[name], drawn[f"{name}_mb"] = list(ready[sized]), list(mb[sized])
        med = float(np.median(ready))
        ax.axhline(
            med,
            color=COLOURS[arm],
            lw=1,
            linestyle=":",
            label=f"{name} median, all {len(df)} ({med:.3g} s)",
        )
        counts.append(f"{name} {len(df)} on {clock}, {int((~sized).sum())} without a size")
    ax.set_xlabel("checkpoint size (MB)")
    ax.set_ylabel("launch or restore start → ready (s)")
    ax.legend(fontsize=7)
    row = report_row(rows, COLD_START_SPEEDUP.name, "both")
    speed = (
        f" The speed-up row: {number(row['value'], row['unit'])}, {row['verdict']}."
        if row and row.get("value") is not None
        else ""
    )
    caption = (
        f"Every ok cold-start trial with a ready time ({'; '.join(counts)}; runs {runs_of(cs)}): "
        "a restore at its image's size, a native start at the size of its own copy's "
        "checkpoint (the restore of the same trial); dotted: each clock's median over all its "
        f"trials, sized or not.{speed}"
    )
    return finish_chart(fig, "cold-start", title, caption, drawn, png)


def overhead_pairs(trials: pd.DataFrame) -> pd.DataFrame:
    """The steady A/B pairs as the overhead row pairs them ((run_id, pair), both arms ok):
    columns run_id, pair, managed, unmanaged, overhead_pct."""
    pct = OVERHEAD_PCT.name
    rows = ok_trials(trials, "overhead")
    rows = rows[rows["variant"] == "steady"].dropna(subset=["pair", "run_s"])
    if rows.empty:
        return pd.DataFrame(columns=["run_id", "pair", *ARM_ORDER, pct])
    wide = rows.pivot_table(
        index=["run_id", "pair"], columns="arm", values="run_s", aggfunc="first", observed=True
    )
    for arm in ARM_ORDER:
        if arm not in wide.columns:
            wide[arm] = np.nan
    wide = wide.dropna(subset=list(ARM_ORDER)).reset_index()
    wide[pct] = (wide[MANAGED] / wide[UNMANAGED] - 1) * 100
    return wide[["run_id", "pair", *ARM_ORDER, pct]]


def overhead_chart(trials: pd.DataFrame, rows: Rows, *, png: bool = False) -> Chart:
    """Each steady pair's managed/unmanaged run time as overhead %, the row's median with its
    95% CI band and the plan's threshold."""
    title = "Steady-state overhead per A/B pair"
    pairs = overhead_pairs(trials)
    if pairs.empty:
        return Chart(title, "No complete steady A/B pair (both arms ok): nothing to draw.")
    fig, (ax,) = new_figure()
    xs = np.arange(1, len(pairs) + 1)
    ax.plot(xs, pairs[OVERHEAD_PCT.name], "o", color="black", gid="overhead-pairs")
    row = report_row(rows, OVERHEAD_PCT.name, "both")
    if row and row.get("value") is not None:
        ax.axhline(float(row["value"]), color=COLOURS[MANAGED], lw=1.5, label="median")
        if row.get("ci_low") is not None:
            ax.axhspan(
                row["ci_low"], row["ci_high"], color=COLOURS[MANAGED], alpha=0.15, label="95% CI"
            )
    thr = threshold_line(ax, row)
    ax.set_xlabel("pair (in run order)")
    ax.set_ylabel("(managed / unmanaged run_s − 1) · 100 (%)")
    ax.legend(fontsize=7)
    verdict = (
        f"the overhead row: {number(row['value'], '%')} ({ci_words(row)}), {row['verdict']}"
        if row and row.get("value") is not None
        else "no overhead row with a value"
    )
    caption = (
        f"One point per steady A/B pair with both arms ok (n = {len(pairs)} pairs; runs "
        f"{runs_of(pairs)}); line and band: {verdict}" + (f"; {thr}" if thr else "") + "."
    )
    return finish_chart(
        fig, "overhead", title, caption, {"pairs": list(pairs[OVERHEAD_PCT.name])}, png
    )


# --- the weekly report's own: trends over the weeks ---------------------------------------------


def _trend_chart(
    weeks: pd.DataFrame, measure: str, arms: Sequence[str], title: str, ylabel: str, rows: Rows
) -> Chart:
    s_all = weeks[weeks["measure"] == measure].dropna(subset=["value"])
    if s_all.empty:
        return Chart(title, f"No week has a {measure} row with a value: nothing to draw.")
    labels = sorted(s_all["week"].astype(str).unique())
    fig, (ax,) = new_figure()
    drawn: dict[str, list[float]] = {}
    for arm in arms:
        s = s_all[s_all["arm"] == arm].sort_values("week")
        if s.empty:
            continue
        lo = (s["value"] - s["ci_low"]).fillna(0).clip(lower=0)
        hi = (s["ci_high"] - s["value"]).fillna(0).clip(lower=0)
        x = [labels.index(str(w)) for w in s["week"]]
        ax.errorbar(
            x,
            s["value"],
            yerr=[lo, hi],
            marker="o",
            capsize=3,
            label=arm,
            color=COLOURS.get(arm, "black"),
        )
        drawn[arm] = list(s["value"].astype(float))
    thr = threshold_line(ax, next((r for r in rows if r["measure"] == measure), None))
    ax.set_xticks(range(len(labels)), labels, rotation=45, fontsize=7)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    n = ", ".join(f"{a} {len(v)} week(s)" for a, v in drawn.items())
    caption = (
        f"Each week's {measure} row as that week's report computed it, bars its 95% CI where "
        f"it has one ({n})" + (f"; {thr}" if thr else "") + "."
    )
    return finish_chart(fig, f"trend-{measure}", title, caption, drawn, False)


def _gain_trend(weeks: pd.DataFrame) -> Chart:
    title = "Goodput gain: measured against the waste model"
    fig, (ax,) = new_figure()
    drawn: dict[str, list[float]] = {}
    labels = sorted(weeks["week"].astype(str).unique()) if len(weeks) else []
    for measure, label in ((GOODPUT_GAIN, "measured"), (GOODPUT_GAIN_EXPECTED, "extrapolated")):
        s = weeks[weeks["measure"] == measure.name].dropna(subset=["value"]).sort_values("week")
        if not s.empty:
            ax.plot([labels.index(str(w)) for w in s["week"]], s["value"], marker="o", label=label)
            drawn[label] = list(s["value"].astype(float))
    if not drawn:
        return Chart(title, "No week has a measured or an extrapolated gain: nothing to draw.")
    ax.set_xticks(range(len(labels)), labels, rotation=45, fontsize=7)
    ax.set_ylabel("managed − unmanaged")
    ax.legend(fontsize=7)
    caption = (
        "Each week's goodput_gain (measured, the statistic over the segment's weeks to date) "
        "and goodput_gain_expected (the waste model's) rows ("
        + ", ".join(f"{k} {len(v)} week(s)" for k, v in drawn.items())
        + ")."
    )
    return finish_chart(fig, "trend-gain", title, caption, drawn, False)


def shared_charts(
    trials: pd.DataFrame,
    per_week_goodput: pd.DataFrame,
    gain_weeks: Sequence[str],
    rows: Rows,
    *,
    png: bool = False,
) -> list[Chart]:
    """The seven figures both the weekly report and the record carry, in their order."""
    makers: list[Callable[[], Chart]] = [
        lambda: recovery_chart(trials, rows, png=png),
        lambda: work_lost_chart(trials, rows, png=png),
        lambda: goodput_chart(per_week_goodput, gain_weeks, rows, png=png),
        lambda: cold_start_chart(trials, rows, png=png),
        lambda: overhead_chart(trials, rows, png=png),
        lambda: phases_chart(trials, rows, png=png),
        lambda: restore_throughput_chart(trials, rows, png=png),
    ]
    return [make() for make in makers]


def plots(series: Series, rows: Rows) -> list[Chart]:
    """The weekly report's figures: the seven shared ones over the segment's trials to date and
    every week's rows, then the weekly trends (busy fraction, overhead, gain vs the model)."""
    weeks = series.weeks
    segment = max((int(r["segment"]) for r in rows), default=0)
    goodput = weeks[weeks["measure"] == GOODPUT.name][["week", "arm", "value"]]
    gain_weeks = sorted(weeks[weeks["segment"] == segment]["week"].astype(str).unique())
    return [
        *shared_charts(series.trials, goodput, gain_weeks, rows),
        _trend_chart(
            weeks,
            BUSY_FRACTION.name,
            ARM_ORDER,
            "Busy per arm per week (GPU: fraction of time; CPU-only: cores)",
            "busy (see the row's unit)",
            rows,
        ),
        _trend_chart(
            weeks, OVERHEAD_PCT.name, ("both",), "Steady-state overhead per week, 95% CI", "%", rows
        ),
        _gain_trend(weeks),
    ]
