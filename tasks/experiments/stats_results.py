"""What tasks.experiments.stats hands on: typed, frozen, each with its JSON form.

``to_json`` gives the keys, in their order, that the overhead and cold-start results (and
their `--json`) have always carried; ``from_json`` reads one back from a stored result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasks.data.jsonform import JsonForm


@dataclass(frozen=True, slots=True)
class SignedRanks:
    """Wilcoxon signed-rank statistics of paired differences (zeros dropped)."""

    w: float  # min(w_plus, w_minus): the two-sided statistic, as tables use it
    w_plus: float
    w_minus: float
    n: int


@dataclass(frozen=True, slots=True)
class PairedTest(JsonForm):
    """The sign-flip permutation test of "no difference" on the log ratios, with the
    Wilcoxon signed ranks of the same log ratios."""

    method: str
    n: int
    exact: bool
    n_permutations: int
    mean_log_ratio: float
    geometric_mean_ratio: float
    p_value: float
    wilcoxon_w: float
    wilcoxon_w_plus: float
    wilcoxon_w_minus: float
    wilcoxon_n: int


@dataclass(frozen=True, slots=True)
class PairedComparison(JsonForm):
    """Steady-state overhead of managed over unmanaged, pair by pair: its median with a CI,
    the test, the minimum detectable effect and the verdict against the threshold."""

    n: int
    statistic: str
    overhead_pct: float
    ci_low_pct: float
    ci_high_pct: float
    confidence: float
    ci_method: str
    p_value: float
    method: str
    wilcoxon_w: float
    mde_pct: float | None
    threshold_pct: float
    spread_warning: str | None
    verdict: str
    verdict_reason: str
    difference: str
    difference_reason: str
    pairs_overhead_pct: tuple[float, ...]

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> PairedComparison | None:
        if not d:
            return None
        return cls(
            n=int(d["n"]),
            statistic=str(d.get("statistic", "median")),
            overhead_pct=d["overhead_pct"],
            ci_low_pct=d["ci_low_pct"],
            ci_high_pct=d["ci_high_pct"],
            confidence=d.get("confidence", 0.95),
            ci_method=str(d.get("ci_method", "")),
            p_value=d["p_value"],
            method=str(d.get("method", "")),
            wilcoxon_w=d.get("wilcoxon_w", 0.0),
            mde_pct=d.get("mde_pct"),
            threshold_pct=d.get("threshold_pct", 0.0),
            spread_warning=d.get("spread_warning"),
            verdict=str(d["verdict"]),
            verdict_reason=str(d.get("verdict_reason", "")),
            difference=str(d.get("difference", "")),
            difference_reason=str(d.get("difference_reason", "")),
            pairs_overhead_pct=tuple(d.get("pairs_overhead_pct", ())),
        )


@dataclass(frozen=True, slots=True)
class ArmSummary(JsonForm):
    """n, median, min and max of one arm's values."""

    n: int
    median: float
    min: float
    max: float

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ArmSummary:
        return cls(int(d["n"]), d["median"], d["min"], d["max"])


@dataclass(frozen=True, slots=True)
class SpeedupComparison(JsonForm):
    """Cold-start speed-up (native / restore ready seconds): both arms, the ratio with its
    CI and the verdict against the threshold."""

    native: ArmSummary
    restore: ArmSummary
    statistic: str
    speedup: float
    ci_low: float
    ci_high: float
    confidence: float
    ci_method: str
    threshold: float
    verdict: str
    verdict_reason: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> SpeedupComparison | None:
        if not d:
            return None
        return cls(
            native=ArmSummary.from_json(d["native"]),
            restore=ArmSummary.from_json(d["restore"]),
            statistic=str(d["statistic"]),
            speedup=d["speedup"],
            ci_low=d["ci_low"],
            ci_high=d["ci_high"],
            confidence=d.get("confidence", 0.95),
            ci_method=str(d.get("ci_method", "")),
            threshold=d.get("threshold", 0.0),
            verdict=str(d["verdict"]),
            verdict_reason=str(d.get("verdict_reason", "")),
        )


@dataclass(frozen=True, slots=True)
class ThroughputFit(JsonForm):
    """Throughput from (bytes, seconds) pairs: a least-squares line or a plain ratio."""

    method: str  # "least squares" or "ratio"
    gbps: float | None
    intercept_s: float | None
    r2: float | None
    n: int
    note: str | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> ThroughputFit | None:
        if not d:
            return None
        return cls(
            str(d["method"]),
            d.get("gbps"),
            d.get("intercept_s"),
            d.get("r2"),
            int(d.get("n", 0)),
            d.get("note"),
        )
