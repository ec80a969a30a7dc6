"""Exposure: per-state totals, exposed GPU-hours and resubmission chains, by hand-checked cases."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tasks.baseline.exposure import _dense, _repeated_numbers, compute_exposure, find_chains


def job(
    jid,
    state,
    submit,
    end,
    gpus=1,
    elapsed=3600,
    user="u",
    account="a",
    name="n",
    nnodes=1,
    step=None,
    cluster="c",
):
    return {
        "cluster": cluster,
        "job_id": jid,
        "job_id_raw": jid.split("_")[0],
        "user": user,
        "account": account,
        "job_name": name,
        "state": state,
        "state_raw": state,
        "submit": pd.Timestamp(submit, tz="UTC"),
        "start": pd.Timestamp(submit, tz="UTC"),
        "end": pd.Timestamp(end, tz="UTC") if end else pd.NaT,
        "elapsed_s": elapsed,
        "nnodes": nnodes,
        "gpus": gpus,
        "is_allocation": step is None,
    }


def frame(*rows) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


def test_states_hours_and_exposure() -> None:
    jobs = frame(
        job("1", "COMPLETED", "2026-01-01 00:00", "2026-01-01 01:00", gpus=4),
        job("2", "FAILED", "2026-01-01 00:00", "2026-01-01 01:00", gpus=2, nnodes=2),
        job("3", "TIMEOUT", "2026-01-01 00:00", "2026-01-01 02:00", gpus=8, elapsed=7200),
        job("4", "CANCELLED", "2026-01-01 00:00", "2026-01-01 01:00", gpus=1),
        job("5", "OUT_OF_MEMORY", "2026-01-01 00:00", "2026-01-01 00:30", gpus=1, elapsed=1800),
        job("6", "COMPLETED", "2026-01-01 00:00", "2026-01-01 01:00", gpus=4, step="batch"),
    )
    exp = compute_exposure(jobs)
    s = exp.summary(rows_read=6, rows_quarantined=0, time_formats={}, short=0)
    assert s.allocations_by_state == {
        "CANCELLED": 1,
        "COMPLETED": 1,
        "FAILED": 1,
        "OUT_OF_MEMORY": 1,
        "TIMEOUT": 1,
    }  # steps do not count
    assert s.gpu_hours_by_state["TIMEOUT"] == pytest.approx(16.0)
    assert s.node_hours_by_state["FAILED"] == pytest.approx(2.0)
    assert s.exposed_gpu_hours == pytest.approx(2.0 + 16.0 + 0.5)  # not CANCELLED
    assert s.timeout_gpu_hours == pytest.approx(16.0)
    top = exp.candidates.iloc[0]
    assert top["rank"] == 1 and top["exposed_gpu_hours"] == pytest.approx(18.5)


def test_duplicate_captures_count_once() -> None:
    row = job("1", "FAILED", "2026-01-01 00:00", "2026-01-01 01:00")
    exp = compute_exposure(frame(row, row))
    assert exp.duplicates_ignored == 1
    assert exp.summary(2, 0, {}, 0).allocations_by_state == {"FAILED": 1}


def test_resubmission_chains() -> None:
    jobs = frame(
        # A chain: fails, resubmitted 2 h later, times out, resubmitted, completes.
        job("10", "FAILED", "2026-01-01 00:00", "2026-01-01 01:00"),
        job("11", "TIMEOUT", "2026-01-01 03:00", "2026-01-01 05:00"),
        job("12", "COMPLETED", "2026-01-01 06:00", "2026-01-01 07:00"),
        # Not a chain: the next one comes after a COMPLETED one.
        job("13", "COMPLETED", "2026-01-02 00:00", "2026-01-02 01:00"),
        # Not a chain: more than 24 h after the failure.
        job("20", "FAILED", "2026-01-01 00:00", "2026-01-01 01:00", name="m"),
        job("21", "COMPLETED", "2026-01-02 02:00", "2026-01-02 03:00", name="m"),
        # Not a chain: another user with the same job name.
        job("30", "FAILED", "2026-01-01 00:00", "2026-01-01 01:00", name="k"),
        job("31", "COMPLETED", "2026-01-01 02:00", "2026-01-01 03:00", name="k", user="v"),
        # A requeue under the same job id is not a resubmission, but a later one is.
        job("40", "REQUEUED", "2026-01-01 00:00", "2026-01-01 00:10", name="q"),
        job("40", "NODE_FAIL", "2026-01-01 00:11", "2026-01-01 00:20", name="q"),
        job("41", "COMPLETED", "2026-01-01 00:30", "2026-01-01 01:20", name="q"),
    )
    chains, chain_of, _ = find_chains(jobs)
    assert chains == [["10", "11", "12"], ["40", "41"]]
    assert list(chain_of[:4]) == [0, 0, 0, -1]


def test_one_job_id_on_two_clusters_is_two_jobs_of_a_chain() -> None:
    """Job ids are per cluster: the same id on another cluster is another job (a
    resubmission there), while on one cluster it is a requeue of the same job."""
    one_cluster = frame(
        job("7", "FAILED", "2026-01-01 00:00", "2026-01-01 01:00"),
        job("7", "COMPLETED", "2026-01-01 02:00", "2026-01-01 03:00"),
    )
    assert find_chains(one_cluster)[0] == []
    two_clusters = frame(
        job("7", "FAILED", "2026-01-01 00:00", "2026-01-01 01:00", cluster="east"),
        job("7", "COMPLETED", "2026-01-01 02:00", "2026-01-01 03:00", cluster="west"),
    )
    assert find_chains(two_clusters)[0] == [["7", "7"]]


def test_submitted_before_the_failure_ended_is_not_a_resubmission() -> None:
    jobs = frame(
        job("1", "FAILED", "2026-01-01 00:00", "2026-01-01 05:00"),
        job("2", "COMPLETED", "2026-01-01 01:00", "2026-01-01 02:00"),
    )
    assert find_chains(jobs)[0] == []


@pytest.mark.parametrize("high", [50, 1 << 40])
def test_dense_codes_are_numpys_unique(high: int) -> None:
    """rank_candidates' count-based unique agrees with np.unique, below and above the range
    where it counts (above it sorts, as np.unique does)."""
    codes = np.random.default_rng(3).integers(0, high, 10_000)
    keys, inverse = _dense(codes)
    want_keys, want_inverse = np.unique(codes, return_inverse=True)
    assert keys.tolist() == want_keys.tolist()
    assert inverse.tolist() == want_inverse.tolist()
    assert _dense(np.array([], dtype=np.int64))[0].size == 0


def test_chains_per_workload_count_distinct_chains() -> None:
    """Two chains of one workload (account, job name) count two, one chain of two jobs one;
    another workload's chain counts for it alone."""
    jobs = frame(
        job("1", "FAILED", "2025-01-01 00:00", "2025-01-01 01:00"),
        job("2", "COMPLETED", "2025-01-01 02:00", "2025-01-01 03:00"),
        job("3", "TIMEOUT", "2025-01-05 00:00", "2025-01-05 01:00"),
        job("4", "COMPLETED", "2025-01-05 02:00", "2025-01-05 03:00"),
        job("5", "FAILED", "2025-01-01 00:00", "2025-01-01 01:00", name="m"),
        job("6", "FAILED", "2025-01-01 02:00", "2025-01-01 03:00", name="m"),
    )
    exp = compute_exposure(jobs)
    assert sorted(exp.chains) == [["1", "2"], ["3", "4"], ["5", "6"]]
    chains = dict(zip(exp.candidates["workload"], exp.candidates["chains"], strict=True))
    assert chains == {"a/n": 2, "a/m": 1}


@pytest.mark.parametrize(
    "values",
    [
        [],
        [7],
        [5, 3, 5, 9, 3, 3, 1],  # dense: a count per id
        [-4, 2, -4, 0],  # below zero, still dense
        [1, 10**15, 1, 2**62, 10**15],  # sparse: the hash table
        list(np.random.default_rng(3).integers(0, 50_000, 20_000)),
    ],
)
def test_repeated_numbers_marks_what_occurs_twice_as_pandas_would(values: list[int]) -> None:
    ids = np.array(values, dtype=np.int64)
    expected = pd.Series(ids).duplicated(keep=False).to_numpy()
    assert _repeated_numbers(ids).tolist() == expected.tolist()
