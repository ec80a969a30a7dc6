"""Paired-comparison statistics for steady-state overhead and cold start.

Steady-state overhead comes from interleaved A B B A runs of the same workload, so the
unit of analysis is the *pair*: managed run time / unmanaged run time. Its median gets a
percentile-bootstrap CI, a sign-flip permutation test on the log ratios (exact for small n)
gives the p-value, and the minimum detectable effect says what this n and this noise could
have seen at all. Cold start compares two unpaired samples (native launch vs restore), so
each arm is resampled on its own. Restore counts get a Wilson score interval.

The bootstrap, the permutation test, the signed ranks and the Wilson interval are
``scipy.stats``'s. Every result is a frozen dataclass (tasks.experiments.stats_results)
whose ``to_json`` is JSON-serialisable (plain float/int/str/bool/None, lists and dicts of
them; never NaN).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np
from scipy import stats

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.errors import CkptPocError
from tasks.experiments.stats_results import (
    ArmSummary,
    PairedComparison,
    PairedTest,
    SignedRanks,
    SpeedupComparison,
    ThroughputFit,
)

GB = 1e9  # decimal, as in the benchmarks
EXACT_MAX_N = 16  # 2**16 sign patterns x 16 pairs: about 1 M floats, milliseconds
RANDOM_FLIPS = 20_000
ALPHA = 0.05
MIN_PER_ARM = 3
_BOOT_CHUNK = 4_000_000  # resampled values held at once (32 MB of float64)

ArrayLike = Sequence[float] | np.ndarray
Statistic = Callable[..., Any]


class StatsInputError(CkptPocError, ValueError):
    """Numbers a statistic cannot use (the message says which argument and why)."""


# --- input checks ------------------------------------------------------------------------------


def _finite(name: str, values: ArrayLike, *, min_n: int = 1) -> np.ndarray:
    """``values`` as a 1-D float array with at least ``min_n`` finite entries."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise StatsInputError(f"{name}: not numbers ({exc})") from exc
    if arr.ndim != 1:
        raise StatsInputError(f"{name}: expected a 1-D sequence, got shape {arr.shape}")
    if len(arr) < min_n:
        raise StatsInputError(f"{name}: needs at least {min_n} value(s), got {len(arr)}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if len(bad):
        kind = "NaN" if np.isnan(arr[bad[0]]) else "infinite"
        raise StatsInputError(
            f"{name}: {len(bad)} NaN/infinite value(s), first at index {bad[0]} ({kind})"
        )
    return arr


def _positive(name: str, values: ArrayLike, *, min_n: int = 1) -> np.ndarray:
    """Durations and sizes: finite and > 0 (a zero time makes a ratio meaningless)."""
    arr = _finite(name, values, min_n=min_n)
    bad = np.flatnonzero(arr <= 0)
    if len(bad):
        raise StatsInputError(
            f"{name}: {len(bad)} zero or negative value(s), first at index {bad[0]} "
            f"({arr[bad[0]]!r}); times and sizes must be > 0"
        )
    return arr


def _same_length(a_name: str, a: ArrayLike, b_name: str, b: ArrayLike) -> None:
    if len(a) != len(b):
        raise StatsInputError(
            f"length mismatch: {a_name} has {len(a)} value(s), {b_name} has {len(b)}; "
            "paired samples need one value per pair on each side"
        )


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise StatsInputError(f"confidence must be in (0, 1), got {confidence!r}")


# --- building blocks ---------------------------------------------------------------------------


def _batch(n: int) -> int:
    """Resamples per vectorised call, so large n does not hold n_resamples x n at once."""
    return max(1, _BOOT_CHUNK // n)


def _bounds(ci: Any) -> tuple[float, float]:
    """(low, high) of a SciPy ``ConfidenceInterval`` as plain floats."""
    return float(ci.low), float(ci.high)


def bootstrap_ci(
    values: ArrayLike,
    statistic: Statistic = np.median,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap CI of ``statistic(values)``; the same seed gives the same CI.

    ``statistic`` is called as ``statistic(matrix, axis=-1)`` when it has an ``axis``
    parameter (NumPy reductions do), else once per resample.
    """
    arr = _finite("values", values)
    _check_confidence(confidence)
    if n_resamples < 1:
        raise StatsInputError(f"n_resamples must be >= 1, got {n_resamples}")
    if len(arr) == 1:  # every resample is the one value (SciPy wants two or more)
        point = float(statistic(arr))
        return point, point
    result = stats.bootstrap(
        (arr,),
        statistic,
        n_resamples=n_resamples,
        batch=_batch(len(arr)),
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return _bounds(result.confidence_interval)


def paired_ratios(managed: ArrayLike, unmanaged: ArrayLike) -> np.ndarray:
    """managed / unmanaged, pair by pair (element i of each side is one pair)."""
    _same_length(MANAGED, managed, UNMANAGED, unmanaged)
    m = _positive(MANAGED, managed)
    u = _positive(UNMANAGED, unmanaged)
    return m / u


def _wilcoxon(d: np.ndarray) -> SignedRanks:
    """Wilcoxon signed-rank statistics of differences ``d`` (zeros dropped, ties averaged)."""
    nz = d[d != 0]
    if len(nz) == 0:
        return SignedRanks(0.0, 0.0, 0.0, 0)
    ranks = stats.rankdata(np.abs(nz))  # ties share their average rank
    w_plus = float(ranks[nz > 0].sum())
    w_minus = float(ranks[nz < 0].sum())
    return SignedRanks(min(w_plus, w_minus), w_plus, w_minus, len(nz))


def _abs_sum_in(scale: float) -> Statistic:
    """|sum of log ratios| in units of ``scale``, rounded to 1e-9 of it: large when the
    pairs lean one way, whichever way that is. The rounding makes sign patterns whose sums
    are equal but for floating-point rounding (tied |log ratios|) tie exactly."""

    def abs_sum(d: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.round(np.abs(np.sum(d, axis=axis)) / scale, 9)

    return abs_sum


def paired_test(
    managed: ArrayLike,
    unmanaged: ArrayLike,
    *,
    seed: int = 0,
    n_random: int = RANDOM_FLIPS,
    exact_max_n: int = EXACT_MAX_N,
) -> PairedTest:
    """Two-sided sign-flip permutation test of "no difference" on the log ratios.

    Under the null, each pair's log ratio is as likely negative as positive, so flipping
    signs gives its distribution; the statistic is |sum of log ratios| (the log of the
    geometric mean ratio, times n). For n <= ``exact_max_n`` every sign pattern is counted
    (exact p), as it is whenever ``n_random`` >= 2^n; otherwise ``n_random`` seeded random
    patterns, p = (1 + hits) / (1 + draws) so it is never 0. The Wilcoxon signed-rank W of
    the same log ratios comes alongside.
    """
    d = np.log(paired_ratios(managed, unmanaged))
    n = len(d)
    observed = float(d.sum())
    n_perm = 2**n if n <= exact_max_n else n_random
    exact = n_perm >= 2**n
    if n == 1:  # both sign patterns reach |observed| (SciPy wants two or more pairs)
        p = 1.0
    else:
        p = stats.permutation_test(
            (d,),
            _abs_sum_in(max(float(np.abs(d).sum()), 1e-300)),
            permutation_type="samples",  # one sample: each value's sign is flipped
            vectorized=True,
            n_resamples=n_perm,
            batch=_batch(n),
            alternative="greater",
            rng=np.random.default_rng(seed),
        ).pvalue
    if exact:
        n_perm = 2**n
        method = f"exact sign-flip permutation test on log ratios (all 2^{n} sign patterns)"
    else:
        method = (
            f"sign-flip permutation test on log ratios ({n_random} random sign patterns, "
            f"seed {seed})"
        )
    ranks = _wilcoxon(d)
    return PairedTest(
        method=method,
        n=n,
        exact=exact,
        n_permutations=n_perm,
        mean_log_ratio=observed / n,
        geometric_mean_ratio=math.exp(observed / n),
        p_value=float(min(1.0, p)),
        wilcoxon_w=ranks.w,
        wilcoxon_w_plus=ranks.w_plus,
        wilcoxon_w_minus=ranks.w_minus,
        wilcoxon_n=ranks.n,
    )


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """The Wilson score interval of k successes in n (None for n = 0; ends exact at 0 and n)."""
    if n <= 0:
        return None
    _check_confidence(confidence)
    if not 0 <= k <= n:
        raise StatsInputError(f"successes must be in [0, n = {n}], got {k!r}")
    return _bounds(stats.binomtest(k, n).proportion_ci(confidence, method="wilson"))


def minimum_detectable_effect(
    log_ratios: ArrayLike, alpha: float = ALPHA, power: float = 0.8
) -> float:
    """Smallest relative change (0.03 = 3 %) this paired design would detect.

    Normal approximation for a two-sided paired test: (z_{1-alpha/2} + z_power) * sd / sqrt(n)
    on the log scale, back-transformed with expm1. Needs n >= 2 (the SD of the log ratios).
    """
    d = _finite("log_ratios", log_ratios, min_n=2)
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise StatsInputError(f"alpha and power must be in (0, 1), got {alpha!r}, {power!r}")
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    sd = float(np.std(d, ddof=1))
    return math.expm1(z * sd / math.sqrt(len(d)))


# --- the two comparisons the report makes ------------------------------------------------------


def n_to_decide(n: int, ci: tuple[float, float], centre: float, threshold: float) -> int | None:
    """Pairs needed, at this spread, for the CI to clear the threshold (CI width ~ 1/sqrt(n))."""
    gap = abs(centre - threshold)
    half = (ci[1] - ci[0]) / 2
    if gap == 0:
        return None  # the estimate sits on the threshold: no n decides it
    return max(n + 1, math.ceil(n * (half / gap) ** 2))


def _overhead_verdict(
    n: int, ci: tuple[float, float], threshold_pct: float, min_pairs: int
) -> tuple[str, str]:
    """(verdict, reason) of "overhead at most threshold_pct": the whole CI on one side."""
    if n < min_pairs:
        return "undecided", f"only {n} pair(s); at least {min_pairs} are needed for a verdict"
    if ci[1] <= threshold_pct:
        return "met", f"CI upper bound {ci[1]:.3g} % <= threshold {threshold_pct:g} %"
    if ci[0] > threshold_pct:
        return "not met", f"CI lower bound {ci[0]:.3g} % > threshold {threshold_pct:g} %"
    return (
        "undecided",
        f"CI [{ci[0]:.3g}, {ci[1]:.3g}] % contains the threshold {threshold_pct:g} %",
    )


def _straddle_warning(
    n: int,
    ci: tuple[float, float],
    centre: float,
    threshold_pct: float,
    confidence: float,
    mde: float | None,
) -> str:
    """Why enough pairs still leave the verdict undecided, and how many more would decide."""
    need = n_to_decide(n, ci, centre, threshold_pct)
    return (
        f"{confidence:.0%} CI [{ci[0]:.3g}, {ci[1]:.3g}] % straddles the {threshold_pct:g} % "
        f"threshold: too much spread for {n} pairs to decide"
        + (
            f" (MDE {mde:.3g} %); about {need} pairs at this spread would"
            if need is not None and mde is not None
            else "; the median sits on the threshold"
        )
    )


def _too_few_pairs_warning(n: int, alpha: float) -> str | None:
    """A warning when the exact sign-flip test cannot reach p < alpha with n pairs, else None."""
    smallest_p = 2.0 / 2**n
    if smallest_p < alpha:
        return None
    need_pairs = next(k for k in range(n, 64) if 2.0 / 2**k < alpha)
    return (
        f"with {n} pairs the paired test cannot reach p < {alpha:g} (its smallest p is "
        f"{smallest_p:.3g}): at least {need_pairs} pairs are needed to show any difference"
    )


def _difference(p: float, ci: tuple[float, float], alpha: float) -> tuple[str, str]:
    """(difference, reason): a difference is claimed only when the test and the CI agree."""
    contains_zero = ci[0] <= 0 <= ci[1]
    if p >= alpha or contains_zero:
        why = f"p = {p:.3g}" + (" >= " if p >= alpha else " < ") + f"{alpha:g}"
        why += (
            ", CI contains 0" if contains_zero else f", CI [{ci[0]:.3g}, {ci[1]:.3g}] % excludes 0"
        )
        if (p >= alpha) != contains_zero:
            why += ": test and CI disagree, so no difference is claimed"
        return "no difference", why
    difference = "managed slower" if ci[0] > 0 else "managed faster"
    return difference, f"p = {p:.3g} < {alpha:g} and CI [{ci[0]:.3g}, {ci[1]:.3g}] % excludes 0"


def compare_paired(
    managed: ArrayLike,
    unmanaged: ArrayLike,
    *,
    threshold_pct: float,
    min_pairs: int = 3,
    max_ci_width_pct: float | None = None,
    confidence: float = 0.95,
    alpha: float = ALPHA,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> PairedComparison:
    """Steady-state overhead of managed over unmanaged run times (one value per pair).

    Overhead per pair = (managed / unmanaged - 1) * 100. The verdict is against
    ``threshold_pct`` (the plan's success number, "overhead at most T %"): met when the
    whole CI is at or below it, not met when the whole CI is above it, undecided otherwise
    or with fewer than ``min_pairs`` pairs. ``max_ci_width_pct``, when given, also warns
    about a CI wider than that even when it decides (pyperf's "unstable" warning).
    """
    ratios = paired_ratios(managed, unmanaged)
    n = len(ratios)
    overhead = (ratios - 1) * 100
    _check_confidence(confidence)
    centre = float(np.median(overhead))
    ci = bootstrap_ci(overhead, np.median, confidence, n_resamples, seed)
    test = paired_test(managed, unmanaged, seed=seed)
    log_r = np.log(ratios)
    mde = minimum_detectable_effect(log_r, alpha=alpha) * 100 if n >= 2 else None

    verdict, reason = _overhead_verdict(n, ci, threshold_pct, min_pairs)
    warnings = []
    if n >= min_pairs and verdict == "undecided":
        warnings.append(_straddle_warning(n, ci, centre, threshold_pct, confidence, mde))
    # The exact sign-flip test cannot go below 2 / 2**n: with too few pairs no difference,
    # however large, can be shown, and an MDE from the normal approximation would mislead.
    too_few = _too_few_pairs_warning(n, alpha)
    if too_few is not None:
        mde = None
        warnings.append(too_few)
    width = ci[1] - ci[0]
    if max_ci_width_pct is not None and width > max_ci_width_pct:
        warnings.append(f"CI width {width:.3g} % exceeds max_ci_width_pct {max_ci_width_pct:g} %")
    p = test.p_value
    difference, why = _difference(p, ci, alpha)

    return PairedComparison(
        n=n,
        statistic="median",
        overhead_pct=centre,
        ci_low_pct=ci[0],
        ci_high_pct=ci[1],
        confidence=confidence,
        ci_method=f"percentile bootstrap of the median, {n_resamples} resamples, seed {seed}",
        p_value=p,
        method=test.method,
        wilcoxon_w=test.wilcoxon_w,
        mde_pct=mde,
        threshold_pct=float(threshold_pct),
        spread_warning="; ".join(warnings) or None,
        verdict=verdict,
        verdict_reason=reason,
        difference=difference,
        difference_reason=why,
        pairs_overhead_pct=tuple(float(x) for x in overhead),
    )


_STATISTICS: dict[str, Statistic] = {"median": np.median, "mean": np.mean}


def _ratio_of(stat: Statistic) -> Statistic:
    """stat(a) / stat(b), vectorised along ``axis`` as SciPy's bootstrap calls it."""

    def ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return stat(a, axis=axis) / stat(b, axis=axis)

    return ratio


def _two_or_more(arr: np.ndarray) -> np.ndarray:
    """A one-value arm written twice: it resamples to the same value either way, and
    SciPy's bootstrap wants two or more (the median and the mean do not change)."""
    return np.repeat(arr, 2) if len(arr) == 1 else arr


def _arm_summary(arr: np.ndarray) -> ArmSummary:
    return ArmSummary(len(arr), float(np.median(arr)), float(arr.min()), float(arr.max()))


def compare_speedup(
    native_s: ArrayLike,
    restore_s: ArrayLike,
    *,
    threshold: float,
    statistic: str = "median",
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
    min_per_arm: int = MIN_PER_ARM,
) -> SpeedupComparison:
    """Cold-start speed-up = statistic(native ready s) / statistic(restore ready s).

    The arms are separate launches, not pairs, so the CI resamples each arm on its own
    and takes the ratio of the two resampled statistics. Met when the CI's lower bound is
    >= ``threshold``, not met when its upper bound is below it, undecided otherwise or
    with fewer than ``min_per_arm`` values in an arm.
    """
    if statistic not in _STATISTICS:
        raise StatsInputError(f"statistic must be one of {sorted(_STATISTICS)}, got {statistic!r}")
    native = _positive("native_s", native_s)
    restore = _positive("restore_s", restore_s)
    _check_confidence(confidence)
    stat = _STATISTICS[statistic]
    speedup = float(stat(native) / stat(restore))
    lo, hi = _bounds(
        stats.bootstrap(
            (_two_or_more(native), _two_or_more(restore)),
            _ratio_of(stat),
            n_resamples=n_resamples,
            batch=_batch(max(len(native), len(restore))),
            confidence_level=confidence,
            method="percentile",
            rng=np.random.default_rng(seed),
        ).confidence_interval
    )
    few = min(len(native), len(restore))
    if few < min_per_arm:
        verdict = "undecided"
        reason = f"{few} value(s) in the smaller arm; at least {min_per_arm} per arm needed"
    elif lo >= threshold:
        verdict, reason = "met", f"CI lower bound {lo:.3g}x >= threshold {threshold:g}x"
    elif hi < threshold:
        verdict, reason = "not met", f"CI upper bound {hi:.3g}x < threshold {threshold:g}x"
    else:
        verdict, reason = "undecided", f"CI [{lo:.3g}, {hi:.3g}]x contains {threshold:g}x"
    return SpeedupComparison(
        native=_arm_summary(native),
        restore=_arm_summary(restore),
        statistic=statistic,
        speedup=speedup,
        ci_low=lo,
        ci_high=hi,
        confidence=confidence,
        ci_method=(
            f"percentile bootstrap of the ratio of {statistic}s, arms resampled independently, "
            f"{n_resamples} resamples, seed {seed}"
        ),
        threshold=float(threshold),
        verdict=verdict,
        verdict_reason=reason,
    )


SPREAD_FOR_FIT = 1.5


def fit_throughput(bytes_: ArrayLike, seconds: ArrayLike) -> ThroughputFit:
    """Throughput from (bytes, seconds) pairs: least squares seconds = a + bytes / rate.

    The intercept is the fixed cost per operation (process set-up, metadata); the slope's
    inverse is the rate in decimal GB/s. With fewer than two distinct sizes there is no
    slope to fit, so it is total bytes / total seconds (``method: "ratio"``).
    """
    _same_length("bytes_", bytes_, "seconds", seconds)
    b = _positive("bytes_", bytes_)
    s = _positive("seconds", seconds)
    n = len(b)
    # Sizes within a factor of SPREAD_FOR_FIT of each other (repeats of one workload differ
    # by a few kB) give a slope that is all noise: use the plain ratio instead.
    if len(np.unique(b)) < 2 or b.max() < SPREAD_FOR_FIT * b.min():
        return ThroughputFit(
            method="ratio",
            gbps=float(b.sum() / s.sum() / GB),
            intercept_s=None,
            r2=None,
            n=n,
            note=(
                f"sizes span less than {SPREAD_FOR_FIT}x: total bytes / total seconds, "
                "no intercept (vary the checkpoint size to separate the fixed cost)"
            ),
        )
    slope, intercept = np.polyfit(b, s, 1)  # s per byte, s
    resid = s - (intercept + slope * b)
    ss_tot = float(((s - s.mean()) ** 2).sum())
    r2 = 1 - float((resid**2).sum()) / ss_tot if ss_tot > 0 else None
    note = None
    if slope <= 0:
        note = "time does not grow with size (slope <= 0): no rate can be derived"
    return ThroughputFit(
        method="least squares",
        gbps=float(1 / (slope * GB)) if slope > 0 else None,
        intercept_s=float(intercept),
        r2=r2,
        n=n,
        note=note,
    )
