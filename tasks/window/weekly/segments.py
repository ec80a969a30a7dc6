"""ISO weeks as the report counts them, and comparability segments: where a fingerprint
change splits the weeks (the package docstring defines them)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from tasks.data import weeks

FINGERPRINT_FIELDS = ("driver", "cuda", "kernel", "checkpointer", "nodes")


# --- ISO weeks ---------------------------------------------------------------------------------


def week_start(week: str) -> pd.Timestamp:
    return pd.Timestamp(weeks.week_start(week))


def week_label(ts: Any) -> str:
    return weeks.week_label(pd.Timestamp(ts))


def weeks_between(first: str, last: str) -> list[str]:
    """Every ISO week from ``first`` to ``last``, both included."""
    out, t, end = [], week_start(first), week_start(last)
    while t <= end:
        out.append(week_label(t))
        t += pd.Timedelta(weeks=1)
    return out


# --- comparability -----------------------------------------------------------------------------


def _fingerprint(rows: pd.DataFrame, checkpointer: str) -> dict[str, str]:
    def values(col: str) -> str:
        return ",".join(sorted({str(v) for v in rows[col].dropna()})) or "unknown"

    versions = set()
    for raw in rows["fp_versions"].dropna():
        try:
            versions.add(str(json.loads(raw).get(checkpointer, "none")))
        except (ValueError, AttributeError):
            versions.add("unreadable")
    return {
        "driver": values("fp_driver"),
        "cuda": values("fp_cuda"),
        "kernel": values("fp_kernel"),
        "checkpointer": ",".join(sorted(versions)) or "unknown",
        "nodes": values("fp_host"),
    }


@dataclass
class Segments:
    """Which segment each week is in, and the change points that split them."""

    of_week: dict[str, int]
    change_points: list[dict[str, Any]]

    def weeks_to_date(self, week: str) -> list[str]:
        """The weeks of ``week``'s segment up to and including it."""
        seg = self.of_week[week]
        return [w for w, s in self.of_week.items() if s == seg and w <= week]


def segments(
    sources: Mapping[str, tuple[pd.DataFrame, pd.Series]], checkpointer: str, week: str
) -> Segments:
    """Split the weeks up to ``week`` at every fingerprint change of any source.
    ``sources``: name → (rows, their ISO week labels)."""
    weeks_seen = sorted(
        {w for _, labels in sources.values() for w in labels.dropna().unique() if w <= week}
    )
    first = weeks_seen[0] if weeks_seen else week
    last: dict[str, dict[str, str]] = {}
    of_week: dict[str, int] = {}
    cps: list[dict[str, Any]] = []
    seg = 0
    for w in weeks_between(first, week):
        changes = []
        for name, (rows, labels) in sources.items():
            mine = rows[(labels == w).fillna(False).to_numpy()]
            if mine.empty:
                continue
            fp = _fingerprint(mine, checkpointer)
            before = last.get(name)
            if before is not None and before != fp:
                changes += [
                    {"source": name, "field": f, "before": before[f], "after": fp[f]}
                    for f in FINGERPRINT_FIELDS
                    if before[f] != fp[f]
                ]
            last[name] = fp
        if changes:
            seg += 1
            cps.append({"week": w, "segment": seg, "changes": changes})
        of_week[w] = seg
    return Segments(of_week, cps)
