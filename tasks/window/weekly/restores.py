"""Restore reliability and the range of applications, as the weekly report and the record show
them: every restore the product attempted, counted per checkpointer version with its Wilson
95 % interval (and the plan's restore_success_rate verdict on the latest version), and the
latest compatibility result of each workload ("N applications tried; M restored faithfully").

Where a restore is counted (a restore not attempted is not counted either way):

- **compatibility** cycle rows whose `restore` is ok or failed ("not tried": the dump failed);
  ok means the restored copy logged a new step (or ended where it was frozen at its end);
- **recovery** and **cold start** trials of the managed arm whose `restore` is ok or failed
  (null: none attempted, as in rows written before the column existed); ok means the
  restored copy served again at the step its checkpoint held (recovery) or was ready (cold
  start).

Versions: a trial's is ``fp_versions[<plan checkpointer kind>]``; a compatibility cycle's is
its ``criu_version`` (the stage drives CRIU). All restores to the end of the week are pooled
per version, never across versions; the criterion judges the latest version's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import pandas as pd

from tasks.data.arms import MANAGED
from tasks.data.fingerprint import bare_version
from tasks.data.measures import RESTORE_SUCCESS_RATE
from tasks.data.render import markdown_table
from tasks.experiments.compatibility_result import wilson
from tasks.window.weekly.model import WeekRows
from tasks.window.weekly.segments import week_start

MEASURE = RESTORE_SUCCESS_RATE.name  # the name its rows carry
TRIAL_MEASURES = ("recovery", "cold_start")
SOURCES = ("compatibility", *TRIAL_MEASURES)
MAX_RESTORES = 10**9  # beyond this no estimate is given


def _week_end(week: str) -> pd.Timestamp:
    return week_start(week) + pd.Timedelta(weeks=1)


def version_label(kind: str, raw: Any) -> str:
    """'criu 4.2.1' from 'Version: 4.2.1' (the fingerprint's first line of `criu --version`)
    or '4.2.1' (the compatibility row's); '<kind> unknown' when there is none."""
    text = "" if raw is None or pd.isna(raw) else bare_version(str(raw), kind)
    return f"{kind} {text or 'unknown'}"


def _trial_version(raw: Any, kind: str) -> str:
    try:
        versions = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        versions = {}
    return version_label(kind, versions.get(kind) if isinstance(versions, dict) else None)


def restore_attempts(
    trials: pd.DataFrame, compat: pd.DataFrame, kind: str, week: str
) -> pd.DataFrame:
    """One row per restore attempted before the end of ``week``: source, version, ok, at,
    run_id."""
    end = _week_end(week)
    cols = ["source", "version", "ok", "at", "run_id"]
    parts = []
    if len(trials) and "restore" in trials.columns:
        t = trials[
            trials["measure"].isin(TRIAL_MEASURES)
            & (trials["arm"] == MANAGED)
            & trials["restore"].isin(["ok", "failed"]).fillna(False)
            & (trials["started_at"] < end)
        ]
        parts.append(
            pd.DataFrame(
                {
                    "source": t["measure"].astype(str),
                    "version": [_trial_version(v, kind) for v in t["fp_versions"]],
                    "ok": (t["restore"] == "ok").astype(bool),
                    "at": t["started_at"],
                    "run_id": t["run_id"].astype(str),
                }
            )
        )
    if len(compat):
        c = compat[
            (compat["row"] == "cycle")
            & compat["restore"].isin(["ok", "failed"]).fillna(False)
            & (compat["started_at"] < end)
        ]
        parts.append(
            pd.DataFrame(
                {
                    "source": "compatibility",
                    "version": [version_label("criu", v) for v in c["criu_version"]],
                    "ok": (c["restore"] == "ok").astype(bool),
                    "at": c["started_at"],
                    "run_id": c["run_id"].astype(str),
                }
            )
        )
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


@dataclass(frozen=True)
class VersionRestores:
    """The restores one checkpointer version did: ok of attempted, per source too."""

    version: str
    ok: int
    attempted: int
    ci: tuple[float, float] | None  # Wilson 95 %
    by_source: dict[str, tuple[int, int]]  # source → (ok, attempted)
    last_at: pd.Timestamp
    run_ids: tuple[str, ...]

    @property
    def rate(self) -> float | None:
        return self.ok / self.attempted if self.attempted else None

    # a dict: not the fields: the rate derived among them, last_at left out
    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "ok": self.ok,
            "attempted": self.attempted,
            "rate": self.rate,
            "ci": list(self.ci) if self.ci else None,
            "by_source": {s: list(v) for s, v in self.by_source.items()},
            "run_ids": list(self.run_ids),
        }


def restores_by_version(attempts: pd.DataFrame) -> list[VersionRestores]:
    """Per version, oldest to newest (by its latest restore)."""
    out = []
    for version, rows in attempts.groupby("version", sort=False):
        k, n = int(rows["ok"].sum()), len(rows)
        by_source = {
            s: (int(g["ok"].sum()), len(g)) for s in SOURCES if len(g := rows[rows["source"] == s])
        }
        out.append(
            VersionRestores(
                str(version),
                k,
                n,
                wilson(k, n),
                by_source,
                pd.Timestamp(rows["at"].max()),
                tuple(sorted(rows["run_id"].unique())),
            )
        )
    return sorted(out, key=lambda v: (v.last_at, v.version))


def restores_to_decide(ok: int, attempted: int, threshold: float) -> int | None:
    """Restores in all, at the measured rate, for the Wilson 95 % interval to clear
    ``threshold`` (lower end ≥ it, or upper end below it); None when no number does (the
    rate sits on the threshold, or a threshold of 1 that only a lower end of 1 could meet)."""
    if attempted <= 0:
        return None
    rate = ok / attempted

    def decided(n: int) -> bool:
        lo, hi = wilson(round(rate * n), n) or (0.0, 1.0)
        return lo >= threshold if rate > threshold else hi < threshold

    if rate == threshold or not decided(MAX_RESTORES):
        return None
    lo_n, hi_n = attempted, attempted
    while not decided(hi_n):  # the interval narrows as n grows: bracket, then bisect
        lo_n, hi_n = hi_n, hi_n * 2
    while hi_n - lo_n > 1:
        mid = (lo_n + hi_n) // 2
        lo_n, hi_n = (lo_n, mid) if decided(mid) else (mid, hi_n)
    return max(hi_n, attempted + 1)


def _fraction(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"


def version_text(v: VersionRestores) -> str:
    """'criu 4.2.1: 19/20 restores ok (0.950, 95 % CI 0.764–0.991; compatibility 9/10, …)'."""
    ci = f"95 % CI {v.ci[0]:.3f}–{v.ci[1]:.3f}" if v.ci else "no CI"
    parts = ", ".join(f"{s} {k}/{n}" for s, (k, n) in v.by_source.items())
    return f"{v.version}: {v.ok}/{v.attempted} restores ok ({_fraction(v.rate)}, {ci}; {parts})"


def restore_row(c: WeekRows, versions: Sequence[VersionRestores]) -> None:
    """The restore_success_rate row: the Wilson lower bound of the latest version's restores,
    judged when the plan sets the criterion (met: lower ≥ threshold; not met: upper below
    it; else undecided with the restores still needed)."""
    method = (
        "Wilson 95 % lower bound of restores ok / attempted (compatibility cycles, managed "
        "recovery and cold-start trials) to the end of the week, of the latest checkpointer "
        "version; versions never pooled"
    )
    if not versions:
        c.add(RESTORE_SUCCESS_RATE, MANAGED, 0, None, method + ": no restore attempted")
        return
    v = versions[-1]
    lo, hi = v.ci or (None, None)
    crit = c.plan.success.restore_success_rate
    verdict, note = None, version_text(v)
    if crit is not None and lo is not None and hi is not None:
        if lo >= crit.threshold:
            verdict = "met"
        elif hi < crit.threshold:
            verdict = "not met"
        else:
            verdict = "undecided"
            need = restores_to_decide(v.ok, v.attempted, crit.threshold)
            note = (
                f"needs {need}, has {v.attempted}: restores at the measured rate "
                f"{v.ok}/{v.attempted} for the Wilson 95 % interval to clear "
                f"{crit.threshold:g} (an estimate); {note}"
                if need is not None
                else f"no number of restores at the rate {v.ok}/{v.attempted} clears "
                f"{crit.threshold:g}; {note}"
            )
    c.add(
        RESTORE_SUCCESS_RATE,
        MANAGED,
        v.attempted,
        lo,
        f"{method} ({v.version})",
        ci=(lo, hi),
        inputs={"versions": [x.to_json() for x in versions]},
        verdict=verdict,
        note=note,
        run_ids=v.run_ids,
    )


# --- the range of applications -------------------------------------------------------------------


@dataclass(frozen=True)
class CauseGroup:
    """Cycles of one workload that failed the same way."""

    phase: str  # dump | restore | workload (could not be tried)
    cause: str  # the first cycle's wording
    wants_option: str | None  # the CRIU option its error names
    cycles: tuple[int, ...]
    criu_log: str | None


@dataclass(frozen=True)
class CompatWorkload:
    name: str
    run_id: str
    started_at: pd.Timestamp
    criu_version: str
    cycles: int
    restored: int
    ci: tuple[float, float] | None
    fidelity: str
    error: str | None
    causes: tuple[CauseGroup, ...]
    image_bytes_median: float | None
    freeze_s_median: float | None

    @property
    def faithful(self) -> bool:
        """Restored in every cycle, and computing the same as the uninterrupted run."""
        return (
            self.cycles > 0
            and self.restored == self.cycles
            and self.fidelity == "same"
            and not self.error
        )


@dataclass(frozen=True)
class CompatSection:
    week: str
    workloads: tuple[CompatWorkload, ...] = ()
    restores: tuple[VersionRestores, ...] = field(default_factory=tuple)

    @property
    def headline(self) -> str:
        if not self.workloads:
            return "no application tried through the compatibility stage by the end of the week"
        faithful = [w for w in self.workloads if w.faithful]
        k = sum(w.restored for w in self.workloads)
        n = sum(w.cycles for w in self.workloads)
        failing = [w for w in self.workloads if w.causes]
        return (
            f"{len(self.workloads)} application(s) tried; {len(faithful)} restored faithfully "
            f"in all their cycles; {k}/{n} cycles restored in all; "
            + (
                f"failures in {', '.join(w.name for w in failing)} (causes below)"
                if failing
                else "no failure"
            )
        )


def _group_key(cause: str) -> str:
    return re.sub(r"\d+", "N", cause)  # sizes, pids and paths differ per cycle


def _causes(cycles: pd.DataFrame, summary: Mapping[str, Any]) -> tuple[CauseGroup, ...]:
    failed = cycles[(cycles["dump"] == "failed") | (cycles["restore"] == "failed")]
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in failed.sort_values("cycle").to_dict("records"):
        phase = "dump" if r["dump"] == "failed" else "restore"
        cause = str(r["cause"]) if pd.notna(r["cause"]) else "no cause given"
        want = str(r["wants_option"]) if pd.notna(r["wants_option"]) else ""
        groups.setdefault((phase, _group_key(cause), want), []).append(r)
    out = [
        CauseGroup(
            phase,
            str(rs[0]["cause"]) if pd.notna(rs[0]["cause"]) else "no cause given",
            want or None,
            tuple(int(r["cycle"]) for r in rs),
            next((str(r["criu_log"]) for r in rs if pd.notna(r["criu_log"])), None),
        )
        for (phase, _, want), rs in groups.items()
    ]
    if pd.notna(summary.get("error")):
        out.append(CauseGroup("workload", str(summary["error"]), None, (), None))
    return tuple(out)


def _median(s: pd.Series) -> float | None:
    v = s.dropna().astype(float)
    return float(median(v)) if len(v) else None


def compatibility_section(
    compat: pd.DataFrame, week: str, restores: Sequence[VersionRestores] = ()
) -> CompatSection:
    """Each workload's latest compatibility run started before the end of ``week``."""
    if compat.empty:
        return CompatSection(week, (), tuple(restores))
    rows = compat[compat["started_at"] < _week_end(week)]
    summaries = rows[rows["row"] == "workload"].sort_values(["started_at", "run_id"])
    latest = summaries.drop_duplicates("workload", keep="last")
    out = []
    for s in latest.sort_values("workload").to_dict("records"):
        cycles = rows[
            (rows["row"] == "cycle")
            & (rows["run_id"] == s["run_id"])
            & (rows["workload"] == s["workload"])
        ]
        n = int(s["cycles"]) if pd.notna(s["cycles"]) else len(cycles)
        k = int(s["restored"]) if pd.notna(s["restored"]) else 0
        out.append(
            CompatWorkload(
                name=str(s["workload"]),
                run_id=str(s["run_id"]),
                started_at=pd.Timestamp(s["started_at"]),
                criu_version=version_label("criu", s["criu_version"]),
                cycles=n,
                restored=k,
                ci=wilson(k, n),  # the stage's own interval, recomputed from its counts
                fidelity=str(s["fidelity"]) if pd.notna(s["fidelity"]) else "not checked",
                error=str(s["error"]) if pd.notna(s["error"]) else None,
                causes=_causes(cycles, s),
                image_bytes_median=_median(cycles["image_bytes"]),
                freeze_s_median=_median(cycles["freeze_s"]),
            )
        )
    return CompatSection(week, tuple(out), tuple(restores))


# --- as tables (the weekly page, its markdown and the record share them) -------------------------

WORKLOAD_HEADS = (
    "workload",
    "run",
    "restored k/n",
    "95 % CI (Wilson)",
    "fidelity",
    "image (median MB)",
    "freeze (median ms)",
    "CRIU",
)
CAUSE_HEADS = ("workload", "phase", "cycles", "cause", "CRIU option it asks for", "CRIU log")
RESTORE_HEADS = ("checkpointer", "restores ok / attempted", "rate", "95 % CI (Wilson)", "by source")


def workload_rows(s: CompatSection) -> list[list[str]]:
    return [
        [
            w.name,
            f"{w.run_id} ({w.started_at.date().isoformat()})",
            f"{w.restored}/{w.cycles}",
            f"{w.ci[0]:.3f}–{w.ci[1]:.3f}" if w.ci else "–",
            w.fidelity,
            "–" if w.image_bytes_median is None else f"{w.image_bytes_median / 1e6:.1f}",
            "–" if w.freeze_s_median is None else f"{w.freeze_s_median * 1e3:.0f}",
            w.criu_version,
        ]
        for w in s.workloads
    ]


def cause_rows(s: CompatSection) -> list[list[str]]:
    return [
        [
            w.name,
            g.phase,
            ", ".join(map(str, g.cycles)) or "–",
            g.cause,
            g.wants_option or "–",
            g.criu_log or "–",
        ]
        for w in s.workloads
        for g in w.causes
    ]


def restore_rows(versions: Sequence[VersionRestores]) -> list[list[str]]:
    return [
        [
            v.version,
            f"{v.ok}/{v.attempted}",
            _fraction(v.rate),
            f"{v.ci[0]:.3f}–{v.ci[1]:.3f}" if v.ci else "–",
            ", ".join(f"{src} {k}/{n}" for src, (k, n) in v.by_source.items()),
        ]
        for v in versions
    ]


def restores_line(versions: Sequence[VersionRestores]) -> str:
    """Restore reliability in one line per version, newest last."""
    if not versions:
        return "Restore reliability: no restore attempted by the end of the week."
    return "Restore reliability: " + "; ".join(version_text(v) for v in versions) + "."


def section_markdown(s: CompatSection) -> list[str]:
    """The weekly report's Compatibility section, markdown lines."""
    lines = ["## Compatibility", "", s.headline + ".", ""]
    if s.workloads:
        lines += markdown_table(WORKLOAD_HEADS, workload_rows(s))
    causes = cause_rows(s)
    if causes:
        lines += ["", "### Failures and their causes", "", *markdown_table(CAUSE_HEADS, causes)]
    lines += ["", "## Restore reliability", "", restores_line(s.restores)]
    if s.restores:
        lines += ["", *markdown_table(RESTORE_HEADS, restore_rows(s.restores))]
    return lines


# a dict: the section's JSON form (the flows' and the record's)
def section_json(s: CompatSection) -> dict[str, Any]:
    """What the flows hand on (and the record's artifact reads)."""
    return {
        "headline": s.headline,
        "workloads": [dict(zip(WORKLOAD_HEADS, r, strict=True)) for r in workload_rows(s)],
        "failures": [dict(zip(CAUSE_HEADS, r, strict=True)) for r in cause_rows(s)],
        "restores": [v.to_json() for v in s.restores],
        "restores_line": restores_line(s.restores),
    }
