"""The figures of the weekly report and the decision record, drawn from the same rows by the
same functions: every trial a point, each figure's statistic, CI and plan threshold taken from
the report row it illustrates. A figure is a Chart: inline SVG for the pages, PNG for the PDF,
and the values it drew (what the tests count)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tasks.data.render import ci, figure_png, figure_svg, number
from tasks.window.weekly.model import ok_trials
from tasks.window.weekly.rows import Series

ARM_ORDER = ("managed", "unmanaged")
COLOURS = {"managed": "#1f77b4", "unmanaged": "#d62728", "both": "#555555"}
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


def _new_figure(ncols: int = 1, width: float = 6.4) -> tuple[Any, Any]:
    # A bare Figure, not pyplot: no global figure state to leak or close.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 3.3))
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def _chart(
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


def _row(rows: Rows, measure: str, arm: str) -> Mapping[str, Any] | None:
    return next((r for r in rows if r["measure"] == measure and r["arm"] == arm), None)


def _runs(df: pd.DataFrame) -> str:
    runs = sorted(df["run_id"].dropna().astype(str).unique()) if "run_id" in df else []
    return ", ".join(runs) or "—"


def _threshold(ax: Any, row: Mapping[str, Any] | None) -> str:
    """The plan's threshold as a dashed line; the caption's words for it."""
    if not row or row.get("threshold") is None:
        return ""
    thr, unit = float(row["threshold"]), row["unit"]
    sense = "≤" if row.get("at_most", True) else "≥"
    ax.axhline(thr, linestyle="--", color="grey", lw=1, label=f"threshold {sense} {thr:g}")
    return f"dashed: the plan's threshold ({row.get('statistic') or 'value'} {sense} " + (
        f"{number(thr, unit)})"
    )


def _ci_words(row: Mapping[str, Any]) -> str:
    interval = ci(row)
    return f"95% CI {interval}" if interval else "no CI: fewer than 2 values"


def _strip(
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


def _failed(trials: pd.DataFrame, measure: str) -> int:
    return int(((trials["measure"] == measure) & (trials["status"] != "ok")).sum())


def recovery_chart(trials: pd.DataFrame, rows: Rows, *, png: bool = False) -> Chart:
    """Recovery time per fault and arm, every ok recovery trial a point, medians marked,
    the plan's threshold (it judges the managed arm)."""
    title = "Recovery time per fault and arm (every trial)"
    rec = ok_trials(trials, "recovery").dropna(subset=["recovery_s"])
    if rec.empty:
        return Chart(title, "No ok recovery trial with a recovery time: nothing to draw.")
    faults = rec["fault"].fillna("no fault recorded").astype(str)
    groups = [
        (f"{fault}/{arm}", arm, rec[(faults == fault) & (rec["arm"] == arm)]["recovery_s"])
        for fault in sorted(faults.unique())
        for arm in ARM_ORDER
    ]
    groups = [(g, a, v.to_numpy(float)) for g, a, v in groups if len(v)]
    fig, (ax,) = _new_figure()
    drawn = _strip(ax, groups, "recovery")
    thr = _threshold(ax, _row(rows, "recovery_s", "managed"))
    ax.set_ylabel("recovery time (s)")
    counts = ", ".join(f"{g} {len(v)}" for g, _, v in groups)
    caption = (
        f"Every ok recovery trial of the rows behind the recovery-time verdict, one point each "
        f"(n = {len(rec)}: {counts}; runs {_runs(rec)}); black bar: each group's median"
        + (f"; {thr}" if thr else "")
        + f". Failed trials not drawn: {_failed(trials, 'recovery')}."
    )
    return _chart(fig, "recovery", title, caption, drawn, png)


def work_lost_chart(trials: pd.DataFrame, rows: Rows, *, png: bool = False) -> Chart:
    """Work lost per interruption per arm, every ok recovery trial a point."""
    title = "Work lost per interruption per arm (every trial)"
    rec = ok_trials(trials, "recovery").dropna(subset=["work_lost_gpu_h"])
    if rec.empty:
        return Chart(title, "No ok recovery trial with work lost recorded: nothing to draw.")
    groups = [
        (arm, arm, rec[rec["arm"] == arm]["work_lost_gpu_h"].to_numpy(float)) for arm in ARM_ORDER
    ]
    groups = [g for g in groups if len(g[2])]
    fig, (ax,) = _new_figure()
    drawn = _strip(ax, groups, "work-lost")
    thr = _threshold(ax, _row(rows, "work_lost_gpu_h", "managed"))
    ax.set_ylabel("work lost (GPU-hours)")
    counts = ", ".join(f"{g} {len(v)}" for g, _, v in groups)
    caption = (
        f"Every ok recovery trial with work lost recorded, all faults pooled as the verdict "
        f"pools them (n = {len(rec)}: {counts}; runs {_runs(rec)}); black bar: the median"
        + (f"; {thr}" if thr else "")
        + "."
    )
    return _chart(fig, "work-lost", title, caption, drawn, png)


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
    fig, (left, right) = _new_figure(2, width=9.6)
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
        gains = both["managed"] - both["unmanaged"]
    row = _row(rows, "goodput_gain", "both")
    if len(gains):
        right.plot(range(len(gains)), gains.to_numpy(float), "o", color="black", gid="gain")
        right.set_xticks(range(len(gains)), list(gains.index), rotation=45, fontsize=7)
        drawn["gain"] = list(gains.to_numpy(float))
    if row and row.get("value") is not None:
        right.axhline(float(row["value"]), color=COLOURS["managed"], lw=1.5, label="statistic")
        if row.get("ci_low") is not None:
            right.axhspan(row["ci_low"], row["ci_high"], color=COLOURS["managed"], alpha=0.15)
    thr = _threshold(right, row)
    right.set_ylabel("managed − unmanaged goodput")
    right.set_title("weekly gain (criterion)", fontsize=9)
    right.legend(fontsize=7)
    verdict = (
        f"the gain row: {number(row['value'], row['unit'])} ({_ci_words(row)}; "
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
    return _chart(fig, "goodput", title, caption, drawn, png)


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
    restore = cs[cs["arm"] == "managed"]
    native = cs[cs["arm"] == "unmanaged"]
    size = restore.dropna(subset=["checkpoint_bytes"]).astype({"run_id": str, "trial_id": str})
    size = size.drop_duplicates(["run_id", "trial_id"]).set_index(["run_id", "trial_id"])
    fig, (ax,) = _new_figure()
    drawn: dict[str, list[float]] = {}
    counts = []
    for name, df, arm in (("restore", restore, "managed"), ("native", native, "unmanaged")):
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
    row = _row(rows, "cold_start_speedup", "both")
    speed = (
        f" The speed-up row: {number(row['value'], row['unit'])}, {row['verdict']}."
        if row and row.get("value") is not None
        else ""
    )
    caption = (
        f"Every ok cold-start trial with a ready time ({'; '.join(counts)}; runs {_runs(cs)}): "
        "a restore at its image's size, a native start at the size of its own copy's "
        "checkpoint (the restore of the same trial); dotted: each clock's median over all its "
        f"trials, sized or not.{speed}"
    )
    return _chart(fig, "cold-start", title, caption, drawn, png)


# Where a recovery's seconds go (its clock's parts, in order) and a cold start's: native is
# one span (launch → ready: the workload's own start, not split by the harness); a restore is
# CRIU's forking, the rest of CRIU's restore, and restored → ready.
RECOVERY_PHASES = (
    ("detection_s", "detection"),
    ("scheduling_s", "scheduling"),
    ("restore_s", "restore or relaunch"),
    ("warmup_s", "warm-up to serving"),
)
COLD_START_PHASES = (
    ("native_s", "launch → ready"),
    ("restore_fork_s", "criu: forking"),
    ("restore_rest_s", "criu: restore proper"),
    ("restore_warmup_s", "restored → ready"),
)
PHASE_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52")


def phase_medians(trials: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Median seconds of each phase per (stage, arm): recovery's four parts per arm; cold
    start's on the judged rows (page cache dropped, where a row says)."""
    out: dict[str, dict[str, float]] = {}
    rec = ok_trials(trials, "recovery").dropna(subset=["recovery_s"])
    for arm in ARM_ORDER:
        mine = rec[rec["arm"] == arm]
        if len(mine):
            out[f"recovery/{arm}"] = {
                c: float(mine[c].median()) if mine[c].notna().any() else 0.0
                for c, _ in RECOVERY_PHASES
            }
    cs = ok_trials(trials, "cold_start").dropna(subset=["ready_s"])
    if "page_cache" in cs and (cs["page_cache"] == "dropped").any():
        cs = cs[cs["page_cache"] == "dropped"]
    native, restore = cs[cs["arm"] == "unmanaged"], cs[cs["arm"] == "managed"]
    if len(native):
        out["cold start/native"] = {"native_s": float(native["ready_s"].median())}
    if len(restore):
        fork = restore["restore_fork_s"].fillna(0.0)
        out["cold start/restore"] = {
            "restore_fork_s": float(fork.median()),
            "restore_rest_s": float((restore["restore_s"] - fork).median()),
            "restore_warmup_s": float(restore["restore_warmup_s"].fillna(0.0).median()),
        }
    return out


def phases_chart(trials: pd.DataFrame, rows: Rows, *, png: bool = False) -> Chart:
    """Where the seconds go per arm: a stacked bar of the median of each phase, recovery's
    (detection, scheduling, restore or relaunch, warm-up) and cold start's."""
    title = "Where the seconds go, per arm (medians of each phase)"
    medians = phase_medians(trials)
    if not medians:
        return Chart(title, "No ok recovery or cold-start trial with its phases: nothing to draw.")
    fig, axes = _new_figure(ncols=2, width=8.0)
    drawn: dict[str, list[float]] = {}
    for ax, stage, phases in (
        (axes[0], "recovery", RECOVERY_PHASES),
        (axes[1], "cold start", COLD_START_PHASES),
    ):
        bars = [(k.split("/", 1)[1], v) for k, v in medians.items() if k.startswith(stage + "/")]
        labelled: set[str] = set()  # each phase once in the legend
        for i, (label, parts) in enumerate(bars):
            bottom = 0.0
            for (column, name), colour in zip(phases, PHASE_COLOURS, strict=False):
                if column not in parts:
                    continue
                legend = None if name in labelled else name
                labelled.add(name)
                ax.bar(i, parts[column], bottom=bottom, color=colour, label=legend)
                bottom += parts[column]
            drawn[f"{stage}/{label}"] = [parts.get(c, 0.0) for c, _ in phases]
        ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
        ax.set_title(stage, fontsize=9)
        ax.set_ylabel("seconds (medians)")
        if bars:
            ax.legend(fontsize=7)
    n_rec = len(ok_trials(trials, "recovery"))
    n_cs = len(ok_trials(trials, "cold_start"))
    caption = (
        f"The median of each phase per arm, stacked: recovery ({n_rec} ok trials; the "
        "unmanaged arm's 'restore or relaunch' is its relaunch from its own checkpoint) and "
        f"cold start ({n_cs} ok starts, the page cache dropped where the rows say so; a "
        "native start is one span, the workload's own). Medians of parts need not add up "
        "to the median of the whole."
    )
    return _chart(fig, "phases", title, caption, drawn, png)


def restore_throughput_chart(trials: pd.DataFrame, rows: Rows, *, png: bool = False) -> Chart:
    """Every restore's GB/s against its checkpoint's size (cold start's and recovery's
    managed arm), with cold start's plain read of the same images beside it."""
    title = "Restore throughput against checkpoint size"
    restores = trials[
        (trials["status"] == "ok")
        & (trials["arm"] == "managed")
        & trials["measure"].isin(["cold_start", "recovery"])
    ].dropna(subset=["checkpoint_bytes", "restore_s"])
    restores = restores[restores["restore_s"] > 0]
    if restores.empty:
        return Chart(title, "No ok restore with its bytes and seconds: nothing to draw.")
    fig, (ax,) = _new_figure()
    drawn: dict[str, list[float]] = {}
    for measure, marker in (("cold_start", "o"), ("recovery", "s")):
        mine = restores[restores["measure"] == measure]
        if mine.empty:
            continue
        mb = mine["checkpoint_bytes"].to_numpy(float) / 1e6
        gbps = mine["checkpoint_bytes"].to_numpy(float) / mine["restore_s"].to_numpy(float) / 1e9
        ax.plot(mb, gbps, marker, color=COLOURS["managed"], alpha=0.7, label=f"{measure} restores")
        drawn[f"{measure}_mb"], drawn[f"{measure}_gbps"] = list(mb), list(gbps)
    raw = restores.dropna(subset=["raw_read_gbps"]) if "raw_read_gbps" in restores else restores[:0]
    if len(raw):
        mb = raw["checkpoint_bytes"].to_numpy(float) / 1e6
        ax.plot(
            mb,
            raw["raw_read_gbps"].to_numpy(float),
            "x",
            color="black",
            label="plain read of the same images",
        )
        drawn["raw_read_gbps"] = list(raw["raw_read_gbps"].to_numpy(float))
    ax.set_xlabel("checkpoint size (MB)")
    ax.set_ylabel("GB/s")
    ax.legend(fontsize=7)
    where = (
        sorted(restores["images_fs"].dropna().astype(str).unique())
        if "images_fs" in restores
        else []
    )
    caption = (
        f"Every ok restore with its bytes (n = {len(restores)}; runs {_runs(restores)}): "
        "checkpoint bytes over CRIU's restore seconds, against the checkpoint's size"
        + (f"; crosses: a plain read of the same images ({len(raw)})" if len(raw) else "")
        + (f"; images on {', '.join(where)}" if where else "")
        + "."
    )
    return _chart(fig, "restore-gbps", title, caption, drawn, png)


def overhead_pairs(trials: pd.DataFrame) -> pd.DataFrame:
    """The steady A/B pairs as the overhead row pairs them ((run_id, pair), both arms ok):
    columns run_id, pair, managed, unmanaged, overhead_pct."""
    rows = ok_trials(trials, "overhead")
    rows = rows[rows["variant"] == "steady"].dropna(subset=["pair", "run_s"])
    if rows.empty:
        return pd.DataFrame(columns=["run_id", "pair", *ARM_ORDER, "overhead_pct"])
    wide = rows.pivot_table(
        index=["run_id", "pair"], columns="arm", values="run_s", aggfunc="first", observed=True
    )
    for arm in ARM_ORDER:
        if arm not in wide.columns:
            wide[arm] = np.nan
    wide = wide.dropna(subset=list(ARM_ORDER)).reset_index()
    wide["overhead_pct"] = (wide["managed"] / wide["unmanaged"] - 1) * 100
    return wide[["run_id", "pair", *ARM_ORDER, "overhead_pct"]]


def overhead_chart(trials: pd.DataFrame, rows: Rows, *, png: bool = False) -> Chart:
    """Each steady pair's managed/unmanaged run time as overhead %, the row's median with its
    95% CI band and the plan's threshold."""
    title = "Steady-state overhead per A/B pair"
    pairs = overhead_pairs(trials)
    if pairs.empty:
        return Chart(title, "No complete steady A/B pair (both arms ok): nothing to draw.")
    fig, (ax,) = _new_figure()
    xs = np.arange(1, len(pairs) + 1)
    ax.plot(xs, pairs["overhead_pct"], "o", color="black", gid="overhead-pairs")
    row = _row(rows, "overhead_pct", "both")
    if row and row.get("value") is not None:
        ax.axhline(float(row["value"]), color=COLOURS["managed"], lw=1.5, label="median")
        if row.get("ci_low") is not None:
            ax.axhspan(
                row["ci_low"], row["ci_high"], color=COLOURS["managed"], alpha=0.15, label="95% CI"
            )
    thr = _threshold(ax, row)
    ax.set_xlabel("pair (in run order)")
    ax.set_ylabel("(managed / unmanaged run_s − 1) · 100 (%)")
    ax.legend(fontsize=7)
    verdict = (
        f"the overhead row: {number(row['value'], '%')} ({_ci_words(row)}), {row['verdict']}"
        if row and row.get("value") is not None
        else "no overhead row with a value"
    )
    caption = (
        f"One point per steady A/B pair with both arms ok (n = {len(pairs)} pairs; runs "
        f"{_runs(pairs)}); line and band: {verdict}" + (f"; {thr}" if thr else "") + "."
    )
    return _chart(fig, "overhead", title, caption, {"pairs": list(pairs["overhead_pct"])}, png)


# --- the weekly report's own: trends over the weeks ---------------------------------------------


def _trend_chart(
    weeks: pd.DataFrame, measure: str, arms: Sequence[str], title: str, ylabel: str, rows: Rows
) -> Chart:
    s_all = weeks[weeks["measure"] == measure].dropna(subset=["value"])
    if s_all.empty:
        return Chart(title, f"No week has a {measure} row with a value: nothing to draw.")
    labels = sorted(s_all["week"].astype(str).unique())
    fig, (ax,) = _new_figure()
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
    thr = _threshold(ax, next((r for r in rows if r["measure"] == measure), None))
    ax.set_xticks(range(len(labels)), labels, rotation=45, fontsize=7)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    n = ", ".join(f"{a} {len(v)} week(s)" for a, v in drawn.items())
    caption = (
        f"Each week's {measure} row as that week's report computed it, bars its 95% CI where "
        f"it has one ({n})" + (f"; {thr}" if thr else "") + "."
    )
    return _chart(fig, f"trend-{measure}", title, caption, drawn, False)


def _gain_trend(weeks: pd.DataFrame) -> Chart:
    title = "Goodput gain: measured against the waste model"
    fig, (ax,) = _new_figure()
    drawn: dict[str, list[float]] = {}
    labels = sorted(weeks["week"].astype(str).unique()) if len(weeks) else []
    for measure, label in (("goodput_gain", "measured"), ("goodput_gain_expected", "extrapolated")):
        s = weeks[weeks["measure"] == measure].dropna(subset=["value"]).sort_values("week")
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
    return _chart(fig, "trend-gain", title, caption, drawn, False)


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
    goodput = weeks[weeks["measure"] == "goodput"][["week", "arm", "value"]]
    gain_weeks = sorted(weeks[weeks["segment"] == segment]["week"].astype(str).unique())
    return [
        *shared_charts(series.trials, goodput, gain_weeks, rows),
        _trend_chart(
            weeks,
            "utilization",
            ARM_ORDER,
            "Busy per arm per week (GPU: fraction of time; CPU-only: cores)",
            "busy (see the row's unit)",
            rows,
        ),
        _trend_chart(
            weeks, "overhead_pct", ("both",), "Steady-state overhead per week, 95% CI", "%", rows
        ),
        _gain_trend(weeks),
    ]
