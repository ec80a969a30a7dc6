"""Paired statistics recover constructed answers, and refuse numbers they cannot use."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.experiments.stats import (
    StatsInputError,
    bootstrap_ci,
    compare_paired,
    compare_speedup,
    fit_throughput,
    minimum_detectable_effect,
    paired_ratios,
    paired_test,
)


def _known_ratio(ratio: float, n: int = 20, sd: float = 0.01, seed: int = 1) -> tuple:
    """Unmanaged run times around 60 s, managed = unmanaged * ratio * lognormal noise."""
    rng = np.random.default_rng(seed)
    unmanaged = rng.uniform(55, 65, n)
    managed = unmanaged * ratio * rng.lognormal(0.0, sd, n)
    return managed, unmanaged


def _json_round_trip(result: Any) -> None:
    # allow_nan=False: a NaN would not be valid JSON (nor a valid parquet number for us).
    doc = result.to_json()
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc
    assert type(result).from_json(doc) == result  # read back as it was


def test_known_overhead_is_recovered_and_judged_against_thresholds() -> None:
    managed, unmanaged = _known_ratio(1.05)
    strict = compare_paired(managed, unmanaged, threshold_pct=2)
    assert strict.n == 20
    assert strict.ci_low_pct < 5 < strict.ci_high_pct
    assert 4 < strict.overhead_pct < 6
    assert strict.ci_high_pct - strict.ci_low_pct < 2  # sd 1 %: a narrow CI
    assert strict.verdict == "not met", strict.verdict_reason
    assert strict.difference == "managed slower"
    assert strict.p_value < 0.001
    assert strict.method.startswith("sign-flip permutation")  # n = 20 > 16: random flips
    assert strict.spread_warning is None
    assert 0 < strict.mde_pct < 1.5
    _json_round_trip(strict)

    loose = compare_paired(managed, unmanaged, threshold_pct=10)
    assert loose.verdict == "met", loose.verdict_reason
    # Same data, same seed: the same interval whatever the threshold.
    assert (loose.ci_low_pct, loose.ci_high_pct) == (
        strict.ci_low_pct,
        strict.ci_high_pct,
    )


def test_faster_managed_arm_is_called_faster() -> None:
    managed, unmanaged = _known_ratio(0.95)
    result = compare_paired(managed, unmanaged, threshold_pct=2)
    assert result.difference == "managed faster"
    assert result.verdict == "met"


def test_identical_distributions_show_no_difference() -> None:
    rng = np.random.default_rng(7)
    managed = rng.lognormal(math.log(60), 0.02, 12)
    unmanaged = rng.lognormal(math.log(60), 0.02, 12)
    result = compare_paired(managed, unmanaged, threshold_pct=2)
    assert result.p_value >= 0.05
    assert result.ci_low_pct <= 0 <= result.ci_high_pct
    assert result.difference == "no difference"
    assert result.method.startswith("exact")  # n = 12 <= 16
    _json_round_trip(result)


def test_threshold_inside_the_ci_is_undecided_with_a_spread_warning() -> None:
    managed, unmanaged = _known_ratio(1.02, n=8, sd=0.03, seed=3)
    result = compare_paired(managed, unmanaged, threshold_pct=2)
    assert result.ci_low_pct <= 2 <= result.ci_high_pct
    assert result.verdict == "undecided"
    assert "contains the threshold" in result.verdict_reason
    assert "straddles" in result.spread_warning


def test_max_ci_width_warns_even_when_decided() -> None:
    managed, unmanaged = _known_ratio(1.05)
    result = compare_paired(managed, unmanaged, threshold_pct=10, max_ci_width_pct=0.01)
    assert result.verdict == "met"
    assert "max_ci_width_pct" in result.spread_warning


def test_two_pairs_are_undecided_whatever_the_numbers() -> None:
    result = compare_paired([120.0, 121.0], [60.0, 60.5], threshold_pct=2)  # 100 % slower
    assert result.n == 2
    assert result.verdict == "undecided"
    assert "only 2 pair(s)" in result.verdict_reason
    _json_round_trip(result)


def test_exact_permutation_p_value_by_hand() -> None:
    # All 5 log ratios positive: only "all +" and "all -" reach |sum| -> p = 2 / 2^5.
    test = paired_test([1.1, 1.2, 1.05, 1.3, 1.01], [1.0] * 5)
    assert test.exact and test.n_permutations == 32
    assert test.p_value == pytest.approx(2 / 32)
    assert test.wilcoxon_w == 0.0 and test.wilcoxon_w_plus == 15.0
    assert "2^5" in test.method

    # Log ratios +3, -1, +2 (ratios e^x): patterns with |sum| >= 4 are (+,-,+), (-,+,-),
    # (+,+,+) -> 6, (-,-,-) -> 6: 4 of 8.
    e = math.e
    test = paired_test([e**3, e**-1, e**2], [1.0, 1.0, 1.0])
    assert test.p_value == pytest.approx(4 / 8)
    assert test.wilcoxon_w_plus == 5.0 and test.wilcoxon_w_minus == 1.0
    assert test.wilcoxon_w == 1.0


def test_wilcoxon_ties_share_ranks_and_zeros_drop() -> None:
    # |d| = 1, 1, 2 with one zero pair: ranks 1.5, 1.5, 3; zero dropped.
    e = math.e
    test = paired_test([e, 1 / e, e**2, 1.0], [1.0] * 4)
    assert test.wilcoxon_n == 3
    assert test.wilcoxon_w_plus == 4.5 and test.wilcoxon_w_minus == 1.5


def test_random_flips_agree_with_exact_enumeration() -> None:
    managed, unmanaged = _known_ratio(1.004, n=14, sd=0.01, seed=5)
    exact = paired_test(managed, unmanaged)
    # 10 000 < 2^14 draws: with n_random >= 2^n SciPy counts every sign pattern (exact).
    sampled = paired_test(managed, unmanaged, exact_max_n=0, n_random=10_000)
    assert exact.exact and not sampled.exact
    assert sampled.p_value == pytest.approx(exact.p_value, abs=0.02)


def test_minimum_detectable_effect_shrinks_with_n_and_grows_with_noise() -> None:
    base = np.random.default_rng(0).standard_normal(64)

    def with_sd(n: int, sd: float) -> np.ndarray:
        x = base[:n]
        return (x - x.mean()) / x.std(ddof=1) * sd  # exactly this SD

    mdes = [minimum_detectable_effect(with_sd(n, 0.02)) for n in (4, 8, 16, 32, 64)]
    assert mdes == sorted(mdes, reverse=True) and mdes[0] > mdes[-1]
    # Known value: (1.959964 + 0.841621) * 0.02 / sqrt(16), back through expm1.
    assert minimum_detectable_effect(with_sd(16, 0.02)) == pytest.approx(
        math.expm1(2.801585 * 0.02 / 4), rel=1e-5
    )
    assert minimum_detectable_effect(with_sd(16, 0.04)) > minimum_detectable_effect(
        with_sd(16, 0.02)
    )
    assert minimum_detectable_effect(with_sd(16, 0.02), power=0.9) > mdes[2]


def test_bootstrap_ci_is_seeded_and_brackets_the_statistic() -> None:
    values = np.random.default_rng(2).normal(10, 1, 50)
    ci = bootstrap_ci(values)
    assert ci == bootstrap_ci(values, seed=0)
    assert ci != bootstrap_ci(values, seed=1)
    assert ci[0] < np.median(values) < ci[1]
    # A statistic without an axis argument gives the same answer (slower path).
    assert bootstrap_ci(values, lambda v: float(np.median(v)), n_resamples=500) == pytest.approx(
        bootstrap_ci(values, np.median, n_resamples=500)
    )
    wide = bootstrap_ci(values, confidence=0.99)
    assert wide[0] <= ci[0] and wide[1] >= ci[1]


def test_compare_speedup_recovers_a_known_speedup() -> None:
    rng = np.random.default_rng(4)
    native = 3.0 * rng.lognormal(0, 0.03, 8)
    restore = 1.0 * rng.lognormal(0, 0.03, 6)
    met = compare_speedup(native, restore, threshold=1.5)
    assert met.ci_low < 3.0 < met.ci_high
    assert met.speedup == pytest.approx(3.0, rel=0.05)
    assert met.verdict == "met"
    assert met.native.n == 8 and met.restore.n == 6
    assert met.native.min <= met.native.median <= met.native.max
    _json_round_trip(met)
    assert compare_speedup(native, restore, threshold=5).verdict == "not met"
    assert compare_speedup(native, restore, threshold=3.0).verdict == "undecided"
    few = compare_speedup(native[:2], restore, threshold=1.5)
    assert few.verdict == "undecided" and "at least 3 per arm" in few.verdict_reason
    mean = compare_speedup(native, restore, threshold=1.5, statistic="mean")
    assert mean.statistic == "mean" and mean.speedup == pytest.approx(3.0, rel=0.05)


def test_fit_throughput_recovers_rate_and_intercept() -> None:
    sizes = np.array([64, 512, 2048, 64, 512, 2048], dtype=float) * 2**20
    rng = np.random.default_rng(6)
    secs = 0.05 + sizes / 2.0e9 + rng.normal(0, 0.002, len(sizes))  # 2 GB/s, 50 ms fixed
    fit = fit_throughput(sizes, secs)
    assert fit.method == "least squares" and fit.n == 6
    assert fit.gbps == pytest.approx(2.0, rel=0.02)
    assert fit.intercept_s == pytest.approx(0.05, abs=0.005)
    assert fit.r2 > 0.999
    _json_round_trip(fit)

    one_size = fit_throughput([1e9, 1e9], [0.5, 0.3])
    assert one_size.method == "ratio" and one_size.gbps == pytest.approx(2.5)
    _json_round_trip(one_size)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: paired_ratios([1.0, 2.0], [1.0]), "length mismatch"),
        (lambda: paired_ratios([1.0, 0.0], [1.0, 1.0]), "managed: 1 zero or negative"),
        (lambda: paired_ratios([1.0, 1.0], [1.0, -2.0]), "unmanaged: 1 zero or negative"),
        (lambda: paired_ratios([1.0, float("nan")], [1.0, 1.0]), "NaN"),
        (lambda: paired_ratios([1.0, float("inf")], [1.0, 1.0]), "infinite"),
        (lambda: paired_ratios([], []), "at least 1"),
        (lambda: compare_paired([1.0], [1.0, 2.0], threshold_pct=2), "length mismatch"),
        (lambda: compare_speedup([1.0, 2.0], [0.0], threshold=1.5), "restore_s: 1 zero"),
        (lambda: compare_speedup([1.0], [1.0], threshold=1.5, statistic="max"), "statistic"),
        (lambda: fit_throughput([1.0, 2.0], [1.0]), "length mismatch"),
        (lambda: fit_throughput([1.0, 2.0], [1.0, float("nan")]), "seconds"),
        (lambda: minimum_detectable_effect([0.01]), "at least 2"),
        (lambda: bootstrap_ci([1.0, 2.0], confidence=1.5), "confidence"),
        (lambda: bootstrap_ci([[1.0, 2.0]]), "1-D"),
    ],
)
def test_bad_input_raises_a_value_error_naming_the_problem(call, words: str) -> None:
    with pytest.raises(ValueError, match=words) as info:
        call()
    assert isinstance(info.value, StatsInputError)


positive_times = st.lists(
    st.floats(min_value=0.01, max_value=1e4, allow_nan=False), min_size=1, max_size=24
)


@settings(max_examples=40, deadline=None)
@given(positive_times, st.floats(min_value=0.5, max_value=2.0))
def test_properties_of_the_paired_test(unmanaged: list[float], factor: float) -> None:
    managed = [u * factor for u in unmanaged]
    forward = paired_test(managed, unmanaged)
    backward = paired_test(unmanaged, managed)
    assert 0 < forward.p_value <= 1
    # Swapping the arms mirrors the log ratios: the two-sided p-value cannot change.
    assert forward.p_value == pytest.approx(backward.p_value)
    assert forward.wilcoxon_w == backward.wilcoxon_w
    # A constant ratio is seen exactly, and its p-value is the smallest the design allows.
    np.testing.assert_allclose(paired_ratios(managed, unmanaged), factor, rtol=1e-9)
    n = len(unmanaged)
    if abs(math.log(factor)) > 1e-6 and n <= 16:
        assert forward.p_value == pytest.approx(2 / 2**n)
