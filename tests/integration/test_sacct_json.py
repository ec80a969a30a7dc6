"""``sacct --json`` of every data_parser version, v0.0.37 (21.08) to v0.0.44 (25.11), through
the real baseline: the same jobs give the same numbers in every version, and the same numbers
as a ``sacct -P`` dump of those jobs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tasks.baseline import sacct_json
from tests.unit.test_sacct_json import (  # noqa: F401
    FIXTURES,
    MEASURES,
    PSV_ALLOCATIONS,
    STEPS_PER_DOCUMENT,
    VERSIONS,
    baseline,
    psv_summary,
    same,
)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_version_gives_the_numbers_of_the_same_jobs_read_from_sacct_p(
    tmp_path: Path, version: str, psv_summary: dict, caplog: pytest.LogCaptureFixture
) -> None:
    text = (FIXTURES / f"{version}.json").read_text()
    with caplog.at_level(logging.WARNING, logger=sacct_json.__name__):
        s = baseline(tmp_path, f"{version}.json", text).summary.to_json()
    assert caplog.records == []  # a known version, read whole: nothing to warn about
    assert s["rows_quarantined"] == 0
    assert s["rows_read"] == len(PSV_ALLOCATIONS) + STEPS_PER_DOCUMENT
    for key in MEASURES:
        assert same(s[key], psv_summary[key]), key
    # And the numbers themselves, from the jobs as written.
    assert s["allocations_by_state"] == {
        "COMPLETED": 5,
        "FAILED": 1,
        "TIMEOUT": 1,
        "PREEMPTED": 1,
        "NODE_FAIL": 1,
        "CANCELLED": 1,
        "REQUEUED": 1,
        "RUNNING": 1,
    }
    gpu = s["gpu_hours_by_state"]
    assert gpu["FAILED"] == pytest.approx(2.0)  # untyped gres/gpu=4 taken, not 4 + 4
    assert gpu["PREEMPTED"] == pytest.approx(6.0)  # typed only: 2 + 1, for 2 h
    assert gpu["TIMEOUT"] == pytest.approx(2 * 3660 / 3600)
    assert s["node_hours_by_state"]["NODE_FAIL"] == pytest.approx(6.0)
    assert s["timeout_gpu_hours"] == pytest.approx(2 * 3660 / 3600)
