"""Where the seconds go per arm, and every restore's GB/s against its bytes: two figures the
weekly report and the record carry beside the verdicts' (tasks/window/weekly/plots.py)."""

from __future__ import annotations

import pandas as pd

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.measures import RECOVERY_S
from tasks.window.weekly.model import ok_trials
from tasks.window.weekly.plots_base import (
    ARM_ORDER,
    COLOURS,
    Chart,
    Rows,
    finish_chart,
    new_figure,
    runs_of,
)

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
    rec = ok_trials(trials, "recovery").dropna(subset=[RECOVERY_S.column])
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
    native, restore = cs[cs["arm"] == UNMANAGED], cs[cs["arm"] == MANAGED]
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
    fig, axes = new_figure(ncols=2, width=8.0)
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
    return finish_chart(fig, "phases", title, caption, drawn, png)


def restore_throughput_chart(trials: pd.DataFrame, rows: Rows, *, png: bool = False) -> Chart:
    """Every restore's GB/s against its checkpoint's size (cold start's and recovery's
    managed arm), with cold start's plain read of the same images beside it."""
    title = "Restore throughput against checkpoint size"
    restores = trials[
        (trials["status"] == "ok")
        & (trials["arm"] == MANAGED)
        & trials["measure"].isin(["cold_start", "recovery"])
    ].dropna(subset=["checkpoint_bytes", "restore_s"])
    restores = restores[restores["restore_s"] > 0]
    if restores.empty:
        return Chart(title, "No ok restore with its bytes and seconds: nothing to draw.")
    fig, (ax,) = new_figure()
    drawn: dict[str, list[float]] = {}
    for measure, marker in (("cold_start", "o"), ("recovery", "s")):
        mine = restores[restores["measure"] == measure]
        if mine.empty:
            continue
        mb = mine["checkpoint_bytes"].to_numpy(float) / 1e6
        gbps = mine["checkpoint_bytes"].to_numpy(float) / mine["restore_s"].to_numpy(float) / 1e9
        ax.plot(mb, gbps, marker, color=COLOURS[MANAGED], alpha=0.7, label=f"{measure} restores")
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
        f"Every ok restore with its bytes (n = {len(restores)}; runs {runs_of(restores)}): "
        "checkpoint bytes over CRIU's restore seconds, against the checkpoint's size"
        + (f"; crosses: a plain read of the same images ({len(raw)})" if len(raw) else "")
        + (f"; images on {', '.join(where)}" if where else "")
        + "."
    )
    return finish_chart(fig, "restore-gbps", title, caption, drawn, png)
