"""A site's own sample history (a CSV export) → samples, sample_gaps and quarantine, on disk."""

from __future__ import annotations

import json

from tasks.data.datasets import SAMPLES
from tasks.data.store import read_dataset
from tests.unit.test_samples_import import SUMMARY_KEYS, T0, _cli, _csv


def test_cli_json_is_the_summary_exactly_and_errors_are_clear(tmp_path, write_plan) -> None:
    plan = write_plan()
    path = _csv(
        tmp_path,
        ["ts,gpu,util", f"{T0},g0,10", f"{T0 + 10},g0,20", f"{T0 + 100},g0,60", "x,g0,1"],
    )
    flags = ["--time-column", "ts", "--value-column", "util", "--entity-column", "gpu"]
    done = _cli(tmp_path, str(plan), str(path), *flags, "--gap-factor", "3", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)  # stdout holds the JSON alone
    assert list(summary) == SUMMARY_KEYS
    assert summary == {
        "rows_read": 4,
        "rows_quarantined": 1,
        "entities": 1,
        "first": float(T0),
        "last": float(T0 + 100),
        "interval_s": 50.0,  # the median of 10 s and 90 s
        "gaps": 0,  # 90 s is not over 3 × 50 s
        "gap_seconds": 0.0,
        "mean_value": 30.0,
    }
    data = tmp_path / "data" / "demo"
    assert len(read_dataset(SAMPLES, data_dir=tmp_path / "data", poc="demo")) == 3

    before = sorted(data.rglob("*.parquet"))
    bad = _cli(tmp_path, str(plan), str(path), *flags[:3], "load", *flags[4:])
    assert bad.returncode == 1
    assert f"error: {path}: no column 'load' (the value column)" in bad.stderr
    assert "it has: 'ts', 'gpu', 'util'" in bad.stderr and "Traceback" not in bad.stderr
    assert bad.stdout == "" and sorted(data.rglob("*.parquet")) == before
    assert not list((data / "_live").glob("*.json"))  # the refused run left no marker
