"""What the committed runs and datasets say of a PoC, read once for a look at where it stands.

The stage registry (tasks/poc/stages.py) asks these questions to tell whether a stage is done;
each answer is read from disk the first time it is asked, never remembered between looks.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.data.arms import ARMS
from tasks.data.datasets import SAMPLE_GAPS, SAMPLES, SNAPSHOTS, TRIALS
from tasks.data.plan import Plan
from tasks.data.runs import committed_runs, run_status
from tasks.data.store import dataset_files, read_dataset
from tasks.data.weeks import week_of_path

RECORD_HTML = ("record", "decision-record.html")


@dataclass
class Evidence:
    """One look at a PoC's committed data. ``weeks_needed``: the window's weeks (the plan's,
    or the demo's short window: 1)."""

    plan: Plan
    data_dir: Path
    weeks_needed: int

    @property
    def poc(self) -> str:
        return self.plan.poc

    @cached_property
    def runs(self) -> dict[str, dict[str, Any]]:
        return committed_runs(self.data_dir, self.poc)

    @cached_property
    def trials(self) -> pd.DataFrame:
        columns = ["run_id", "measure", "arm", "status"]
        return read_dataset(TRIALS, data_dir=self.data_dir, poc=self.poc, columns=columns)

    @cached_property
    def window(self) -> WindowProgress:
        return window_progress(self.data_dir, self.poc)

    def good(self, stage: str) -> list[dict[str, Any]]:
        """Committed runs of ``stage`` that were neither refused nor partial, oldest first."""
        good = [
            r for r in self.runs.values() if r.get("stage") == stage and run_status(r) == "complete"
        ]
        return sorted(good, key=lambda r: str(r.get("committed_at", "")))

    def last_refusal(self, stage: str) -> str | None:
        refused = [
            r for r in self.runs.values() if r.get("stage") == stage and run_status(r) != "complete"
        ]
        if not refused:
            return None
        return str(max(refused, key=lambda r: str(r.get("committed_at", "")))["outcome"])

    def last_at(self, stage: str) -> str:
        return max((str(r.get("committed_at", "")) for r in self.good(stage)), default="")

    def last_committed_at(self) -> str:
        return max((str(r.get("committed_at", "")) for r in self.runs.values()), default="")

    def no_good_run(self, stage: str, missing: str) -> str | None:
        """None when ``stage`` has a good run, else ``missing`` and its last refusal."""
        if self.good(stage):
            return None
        refusal = self.last_refusal(stage)
        return missing + (f" (last refused: {refusal})" if refusal else "")

    def arms_missing(self, measure: str, run_ids: set[str]) -> list[str]:
        """The arms without a single ok trial of ``measure`` in the given (good) runs."""
        t = self.trials
        rows = t[
            (t["measure"] == measure)
            & (t["status"] == "ok")
            & (t["run_id"].astype(str).isin(run_ids))
        ]
        present = set(rows["arm"].astype(str))
        return [arm for arm in ARMS if arm not in present]

    def measured(self, stage: str) -> str | None:
        """Why ``stage`` (a measure on both arms) is not done, or None when it is."""
        ids = {str(r["run_id"]) for r in self.good(stage)}
        if not ids:
            return self.no_good_run(stage, f"no committed {stage} run")
        missing = self.arms_missing(stage, ids)
        if missing:
            return f"{stage} has no ok trials on the {' and '.join(missing)} arm"
        return None

    def missing_before_install(self) -> list[str]:
        """Plan nodes without a whole before_install snapshot. As
        tasks.exit.snapshots.latest_snapshot picks it (the newest run's per node), but read
        once, five columns: status answers in well under two seconds."""
        snaps = read_dataset(
            SNAPSHOTS,
            data_dir=self.data_dir,
            poc=self.poc,
            columns=["run_id", "node", "phase", "partial", "taken_at"],
        )
        snaps = snaps[snaps["phase"] == "before_install"]
        out = []
        for node in self.plan.cluster.nodes:
            rows = snaps[snaps["node"] == node]
            if rows.empty:
                out.append(f"no before_install snapshot of node {node}")
                continue
            newest = rows.groupby("run_id", observed=True)["taken_at"].max().idxmax()
            if bool(rows[rows["run_id"] == newest]["partial"].any()):
                out.append(f"the before_install snapshot of node {node} is partial")
        return out

    def record_missing(self) -> str | None:
        """Why the decision record (files, no commit) is not done: absent, or older than the
        last committed run (it no longer says what the data says)."""
        html = self.data_dir.joinpath(self.poc, *RECORD_HTML)
        if not html.exists():
            return "no decision record"
        last = self.last_committed_at()
        written = dt.datetime.fromtimestamp(html.stat().st_mtime, dt.UTC).isoformat()
        if last and written < last:
            return "the decision record is older than the last committed run"
        return None


@dataclass(frozen=True, slots=True)
class WindowProgress:
    """The window so far: the weeks with committed samples and the gaps on record."""

    weeks: tuple[str, ...]
    gap_s: float
    gap_rows: int

    @property
    def weeks_sampled(self) -> int:
        return len(self.weeks)

    # a dict: the weeks' count derived, first
    def to_json(self) -> dict[str, Any]:
        return {
            "weeks_sampled": self.weeks_sampled,
            "weeks": list(self.weeks),
            "gap_s": self.gap_s,
            "gap_rows": self.gap_rows,
        }


def window_progress(data_dir: str | Path, poc: str) -> WindowProgress:
    """Weeks with committed samples (their week partitions) and the gap seconds on record."""
    weeks = sorted({week_of_path(f) for f in dataset_files(data_dir, poc, SAMPLES)})
    gaps = read_dataset(SAMPLE_GAPS, data_dir=data_dir, poc=poc, columns=["gap_s"])
    return WindowProgress(
        tuple(weeks),
        float(gaps["gap_s"].astype(float).sum()) if not gaps.empty else 0.0,
        len(gaps),
    )
