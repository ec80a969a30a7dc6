"""What an experiment stage hands on: typed, frozen, produced here, rendered by flows and CLI.

Each result knows its JSON form (``to_json``: the keys `--json` and the flow run's result have
always had) and can be read back from it (``from_json``: a result stored by Prefect, or one a
test writes by hand). A renamed field then breaks here, at import, not in a report at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tasks.data.jsonform import JsonForm
from tasks.experiments.stats_results import PairedComparison, SpeedupComparison, ThroughputFit

STATS_KEYS = ("n", "median", "p90", "min", "max")
# The measures a recovery summary gives per fault and arm, each as Stats.
RECOVERY_STATS = (
    "recovery_s",
    "work_lost_gpu_h",
    "steps_lost",
    "detect_latency_ms",
    "serving_latency_ms",
)
RECOVERY_VERDICTS = ("recovery_time_verdict", "work_lost_verdict")


@dataclass(frozen=True)
class Stats(JsonForm):
    """n, median, p90, min and max of one measure's ok trials (None without any)."""

    n: int = 0
    median: float | None = None
    p90: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: pd.Series) -> Stats:
        v = values.dropna().astype(float)
        if v.empty:
            return cls()
        return cls(
            len(v),
            float(v.median()),
            float(np.percentile(v, 90)),
            float(v.min()),
            float(v.max()),
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Stats:
        return cls(**{k: d[k] for k in STATS_KEYS if k in d}) if d else cls()


@dataclass(frozen=True)
class Verdict(JsonForm):
    """One criterion of the plan judged on a statistic: met, not met or undecided."""

    value: float | None
    threshold: float
    statistic: str
    verdict: str

    @classmethod
    def judge(cls, value: float | None, threshold: float, statistic: str) -> Verdict:
        verdict = "undecided" if value is None else "met" if value <= threshold else "not met"
        return cls(value, threshold, statistic, verdict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Verdict | None:
        return cls(d["value"], d["threshold"], d["statistic"], d["verdict"]) if d else None


@dataclass(frozen=True)
class Failure(JsonForm):
    """A failed trial, kept as a row: why, and the workload's own last log lines."""

    trial_id: str
    arm: str
    reason: str
    log_tail: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Failure:
        return cls(str(d["trial_id"]), str(d["arm"]), str(d["reason"]), d.get("log_tail"))


@dataclass(frozen=True)
class RecoveryArm(JsonForm):
    """One fault × arm of a recovery run. The plan's verdicts are judged on the managed arm
    only (None on the unmanaged one)."""

    fault: str
    arm: str
    failed: int
    recovery_s: Stats
    work_lost_gpu_h: Stats
    steps_lost: Stats
    # How late the harness saw `detected` and `serving_again` (docs/design.md §4).
    detect_latency_ms: Stats = field(default_factory=Stats)
    serving_latency_ms: Stats = field(default_factory=Stats)
    recovery_time_verdict: Verdict | None = None
    work_lost_verdict: Verdict | None = None
    managed_over_unmanaged_recovery: float | None = None
    # Only the managed arm carries verdicts: the key is absent, not null, elsewhere.
    _OMIT_NONE = RECOVERY_VERDICTS

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RecoveryArm:
        return cls(
            fault=str(d["fault"]),
            arm=str(d["arm"]),
            failed=int(d.get("failed", 0)),
            **{name: Stats.from_json(d.get(name)) for name in RECOVERY_STATS},
            **{name: Verdict.from_json(d.get(name)) for name in RECOVERY_VERDICTS},
            managed_over_unmanaged_recovery=d.get("managed_over_unmanaged_recovery"),
        )


@dataclass(frozen=True)
class RecoveryResult(JsonForm):
    """A recovery run: its trials counted, failures with their reasons, the summary per fault
    and arm, and where its rows and folders are."""

    poc: str
    run_id: str
    cluster: str
    trials: int
    failed: int
    failures: tuple[Failure, ...]
    includes: tuple[str, ...]
    summary: tuple[RecoveryArm, ...]
    trials_files: tuple[str, ...] = ()
    run_dir: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RecoveryResult:
        return cls(
            poc=str(d.get("poc", "")),
            run_id=str(d["run_id"]),
            cluster=str(d["cluster"]),
            trials=int(d["trials"]),
            failed=int(d["failed"]),
            failures=tuple(Failure.from_json(f) for f in d.get("failures", ())),
            includes=tuple(d.get("includes", ())),
            summary=tuple(RecoveryArm.from_json(s) for s in d.get("summary", ())),
            trials_files=tuple(d.get("trials_files", ())),
            run_dir=str(d.get("run_dir", "")),
        )


@dataclass(frozen=True, slots=True)
class Spread(JsonForm):
    """Median, min and max of one measure's values."""

    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: pd.Series) -> Spread | None:
        v = values.dropna().astype(float)
        return None if v.empty else cls(float(v.median()), float(v.min()), float(v.max()))

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Spread | None:
        return cls(d["median"], d["min"], d["max"]) if d else None


@dataclass(frozen=True, slots=True)
class CheckpointSummary(JsonForm):
    """One workload's dumps: how many, how many failed, and the ok ones' dump seconds,
    freeze seconds and image bytes (None without an ok dump that has them)."""

    n: int
    failed: int
    dump_s: Spread | None
    freeze_s: Spread | None
    checkpoint_bytes: Spread | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CheckpointSummary:
        return cls(
            int(d.get("n", 0)),
            int(d.get("failed", 0)),
            Spread.from_json(d.get("dump_s")),
            Spread.from_json(d.get("freeze_s")),
            Spread.from_json(d.get("checkpoint_bytes")),
        )


def checkpoints_from_json(d: Mapping[str, Any]) -> dict[str, CheckpointSummary]:
    """A result's ``checkpoints`` read back: by workload hash."""
    return {wl: CheckpointSummary.from_json(c) for wl, c in d.items()}


@dataclass(frozen=True, slots=True)
class VariantSummary(JsonForm):
    """One overhead variant (steady, checkpointing): its runs, the median steps/s per arm,
    the paired comparison (None without a complete pair) and, unjudged variants only, why."""

    runs: int
    failed: int
    steps_per_s_median: Mapping[str, float | None]  # a dict: by arm
    comparison: PairedComparison | None
    note: str | None = None
    _OMIT_NONE = ("note",)  # the steady variant has no note key

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> VariantSummary:
        return cls(
            runs=int(d.get("runs", 0)),
            failed=int(d.get("failed", 0)),
            steps_per_s_median=dict(d.get("steps_per_s_median", {})),
            comparison=PairedComparison.from_json(d.get("comparison")),
            note=d.get("note"),
        )


@dataclass(frozen=True)
class OverheadResult(JsonForm):
    """An overhead run: interleaved runs counted, per variant (steady, checkpointed) the
    comparison against the plan's threshold, and the checkpoints the managed arm took."""

    poc: str
    run_id: str
    runs: int
    failed: int
    failures: tuple[Failure, ...]
    threshold_pct: float
    variants: Mapping[str, VariantSummary]  # a dict: by variant (overhead.summarise_overhead)
    checkpoints: Mapping[str, CheckpointSummary]  # a dict: by workload hash
    trials_files: tuple[str, ...] = ()
    run_dir: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> OverheadResult:
        return cls(
            poc=str(d.get("poc", "")),
            run_id=str(d["run_id"]),
            runs=int(d.get("runs", 0)),
            failed=int(d.get("failed", 0)),
            failures=tuple(Failure.from_json(f) for f in d.get("failures", ())),
            threshold_pct=float(d["threshold_pct"]),
            variants={
                name: VariantSummary.from_json(v) for name, v in d.get("variants", {}).items()
            },
            checkpoints=checkpoints_from_json(d.get("checkpoints", {})),
            trials_files=tuple(d.get("trials_files", ())),
            run_dir=str(d.get("run_dir", "")),
        )


@dataclass(frozen=True)
class Restore(JsonForm):
    """One timed restore of the managed arm: its clock, the restore's part and the image."""

    trial_id: str
    ready_s: float | None
    restore_s: float | None
    checkpoint_bytes: float | None
    restore_gbps: float | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Restore:
        keys = ("ready_s", "restore_s", "checkpoint_bytes", "restore_gbps")
        return cls(str(d["trial_id"]), *(d.get(k) for k in keys))


@dataclass(frozen=True, slots=True)
class ImagesSummary(JsonForm):
    """Where the judged restores read their images, their median restore GB/s beside the
    median plain read of the same bytes, and restore / read (1.0 is the limit)."""

    images_dir: str | None
    images_fs: str | None
    restore_gbps: float
    raw_read_gbps: float | None
    efficiency: float | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> ImagesSummary | None:
        if not d:
            return None
        keys = ("images_fs", "restore_gbps", "raw_read_gbps", "efficiency")
        return cls(d.get("images_dir"), *(d.get(k) for k in keys))


@dataclass(frozen=True)
class ColdStartResult(JsonForm):
    """A cold-start run: native launches and restores timed to the same ready event, the
    speed-up with its CI and verdict, the fitted restore throughput and the plot."""

    poc: str
    run_id: str
    starts: int
    failed: int  # every failed row of the run (starts and checkpoints)
    failures: tuple[Failure, ...]
    threshold: float
    speedup: SpeedupComparison | None
    restore_throughput: ThroughputFit | None
    page_cache: tuple[str, ...]
    restores: tuple[Restore, ...]
    checkpoints: Mapping[str, CheckpointSummary]  # a dict: by workload hash
    plot: str
    trials_files: tuple[str, ...] = ()
    run_dir: str = ""
    # The warm condition's speed-up, when the plan asks for it (never judged).
    speedup_warm: SpeedupComparison | None = None
    workload: str = ""  # the workload timed (cold_start.workload)
    ready_signal: str = ""  # what ended both clocks: its ready probe, or its first progress line
    # Where the images were, restore GB/s beside a plain read's (cold_start.images_summary).
    images: ImagesSummary | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ColdStartResult:
        return cls(
            poc=str(d.get("poc", "")),
            run_id=str(d["run_id"]),
            starts=int(d.get("starts", 0)),
            failed=int(d.get("failed", 0)),
            failures=tuple(Failure.from_json(f) for f in d.get("failures", ())),
            threshold=float(d["threshold"]),
            speedup=SpeedupComparison.from_json(d.get("speedup")),
            restore_throughput=ThroughputFit.from_json(d.get("restore_throughput")),
            page_cache=tuple(d.get("page_cache", ())),
            restores=tuple(Restore.from_json(r) for r in d.get("restores", ())),
            checkpoints=checkpoints_from_json(d.get("checkpoints", {})),
            plot=str(d.get("plot", "")),
            trials_files=tuple(d.get("trials_files", ())),
            run_dir=str(d.get("run_dir", "")),
            speedup_warm=SpeedupComparison.from_json(d.get("speedup_warm")),
            workload=str(d.get("workload", "")),
            ready_signal=str(d.get("ready_signal", "")),
            images=ImagesSummary.from_json(d.get("images")),
        )
