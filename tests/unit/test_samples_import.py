"""A site's own sample history (a CSV export) → samples, sample_gaps and quarantine, on disk."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tasks.data.datasets import QUARANTINE, SAMPLE_GAPS, SAMPLES
from tasks.data.plan import load_plan
from tasks.data.runctx import open_run
from tasks.data.runs import committed_runs
from tasks.data.store import read_dataset
from tasks.window.sampling import csv_export, importer
from tasks.window.sampling.csv_export import SampleImportError
from tasks.window.sampling.importer import import_samples
from tests.support.common import REPO

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z
SUMMARY_KEYS = [
    "rows_read",
    "rows_quarantined",
    "entities",
    "first",
    "last",
    "interval_s",
    "gaps",
    "gap_seconds",
    "mean_value",
]
COLUMNS = {"time_column": "ts", "value_column": "util", "entity_column": "gpu"}


def _iso(epoch: float, zone: str = "Z") -> str:
    text = dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return text + zone


def _csv(tmp_path: Path, lines: list[str], name: str = "export.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(write_plan, path: Path, notes: list[str] | None = None, **options):
    plan_path = write_plan()
    plan = load_plan(plan_path, check_cluster=False)
    with open_run(plan, plan_path, "samples_import") as ctx:
        summary = import_samples(plan, ctx, path, notes=notes, **{**COLUMNS, **options})
    return summary, ctx


def _read(spec, ctx) -> pd.DataFrame:
    return read_dataset(spec, data_dir=ctx.data_dir, poc=ctx.poc, run_id=ctx.run_id)


def _epoch(series: pd.Series) -> list[float]:
    return [ts.timestamp() for ts in series]


def test_epoch_and_iso_times_with_each_entitys_median_interval(tmp_path, write_plan) -> None:
    # g0 in epoch seconds (int and float) every 10 s, out of order; g1 in ISO every 30 s,
    # with "Z", an offset and no zone at all (read as UTC).
    lines = [
        "ts,gpu,util,host",
        f"{T0 + 20},g0,30,h",
        f"{T0},g0,10,h",
        f"{T0 + 10}.0,g0,20,h",
        f"{T0 + 30},g0,40,h",
        f"{_iso(T0)},g1,50,h",
        f"{_iso(T0 + 30 + 3600, '+01:00')},g1,60,h",
        f"{_iso(T0 + 60, '')},g1,70,h",
    ]
    notes: list[str] = []
    summary, ctx = _run(write_plan, _csv(tmp_path, lines), notes)
    assert list(summary.to_json()) == SUMMARY_KEYS
    assert summary.to_json() == {
        "rows_read": 7,
        "rows_quarantined": 0,
        "entities": 2,
        "first": float(T0),
        "last": float(T0 + 60),
        "interval_s": 20.0,  # the median of g0's 10 s and g1's 30 s
        "gaps": 0,
        "gap_seconds": 0.0,
        "mean_value": 40.0,
    }
    assert notes == ["1 ISO time(s) without a zone were read as UTC"]
    rows = _read(SAMPLES, ctx).sort_values(["entity", "t_to"])
    assert len(rows) == 7
    assert list(rows["entity"]) == ["g0"] * 4 + ["g1"] * 3
    assert _epoch(rows["t_to"]) == [T0 + s for s in (0, 10, 20, 30, 0, 30, 60)]
    # Each row covers [t - its entity's interval, t].
    covered = [(b - a).total_seconds() for a, b in zip(rows["t_from"], rows["t_to"], strict=True)]
    assert covered == [10.0] * 4 + [30.0] * 3
    assert list(rows["value"]) == [10, 20, 30, 40, 50, 60, 70]
    assert set(rows["source"]) == {"import"} and set(rows["metric"]) == {"util"}
    assert set(rows["points"]) == {1} and set(rows["attributed_by"]) == {"none"}
    assert set(rows["node"]) == {"local-a"}  # the plan's first node
    assert set(rows["unit"]) == {"percent"} and set(rows["device"]) == {"unknown"}
    assert set(rows["run_id"]) == {ctx.run_id}
    assert not rows.duplicated(list(SAMPLES.key)).any()
    assert ctx.run_id in committed_runs(ctx.data_dir, ctx.poc)
    assert _read(SAMPLE_GAPS, ctx).empty and _read(QUARANTINE, ctx).empty


def test_a_spacing_over_the_factor_is_a_gap(tmp_path, write_plan) -> None:
    # Spacings 10 10 10 45 10 60 10: the interval is 10 s; 45 s is a gap only under factor 4.
    offsets = [0, 10, 20, 30, 75, 85, 145, 155]
    path = _csv(tmp_path, ["ts,gpu,util", *(f"{T0 + o},g0,1" for o in offsets)])
    summary, ctx = _run(write_plan, path)
    assert (summary.gaps, summary.gap_seconds, summary.interval_s) == (1, 50.0, 10.0)
    gaps = _read(SAMPLE_GAPS, ctx)
    assert len(gaps) == 1
    gap = gaps.iloc[0]
    # What no sample covers: from the sample before to the next one's interval start.
    assert _epoch(gaps["t_from"]) == [T0 + 85] and _epoch(gaps["t_to"]) == [T0 + 135]
    assert gap["gap_s"] == 50.0 and gap["entity"] == "g0" and gap["metric"] == "util"
    assert gap["reason"] == "spacing 60 s > 5 × interval 10 s"
    assert (gap["source"], gap["detected_by"], gap["node"]) == ("import", "import", "local-a")

    summary, ctx = _run(write_plan, path, gap_factor=4, metric="gpu_utilization")
    gaps = _read(SAMPLE_GAPS, ctx).sort_values("t_from")
    assert summary.gaps == 2 and summary.gap_seconds == 85.0
    assert list(gaps["reason"]) == [
        "spacing 45 s > 4 × interval 10 s",
        "spacing 60 s > 4 × interval 10 s",
    ]
    assert set(gaps["metric"]) == {"gpu_utilization"}
    assert set(_read(SAMPLES, ctx)["metric"]) == {"gpu_utilization"}


BAD = [
    "ts,gpu,util,host",
    f"{T0},g0,10,h",  # 2
    f"{T0 + 10},g0,20,h",  # 3
    "",  # 4: a blank line
    f"{T0 + 20},g0,abc,h",  # 5
    f"{T0 + 20},g0,nan,h",  # 6
    f"{T0 + 20},g0",  # 7: missing fields
    "yesterday,g0,5,h",  # 8
    f"{T0 * 1000},g0,5,h",  # 9: milliseconds
    f"{T0 + 20},,5,h",  # 10
    f"{T0 + 10},g0,99,h",  # 11: a second g0 at T0+10
    f"{T0 + 20},g0,30,h",  # 12
    ",g0,5,h",  # 13
    f"{T0 + 30},g0,,h",  # 14
    f"{T0 + 30},g0,1e400,h",  # 15
    f"{_iso(T0)[:5]}13-01T00:00:00Z,g0,5,h",  # 16: a 13th month
]
BAD_REASONS = {
    4: "empty row: no time, value or entity",
    5: "util: 'abc' is not a number",
    6: "util: 'nan' is not finite",
    7: "2 fields, expected 4",
    8: "ts: 'yesterday' is neither epoch seconds nor ISO 8601",
    9: f"ts: '{T0 * 1000}' is outside 2000–2100 (milliseconds?)",
    10: "gpu: no entity",
    11: "duplicate of line 3: same entity and time (line 3 kept)",
    13: "ts: no time",
    14: "util: no value",
    15: "util: '1e400' is not finite",
    16: f"ts: '{_iso(T0)[:5]}13-01T00:00:00Z' is neither epoch seconds nor ISO 8601",
}


@pytest.mark.parametrize("block", [csv_export.READ_BLOCK, 64])
def test_bad_rows_are_quarantined_by_line_with_reason_and_raw_text(
    tmp_path, write_plan, monkeypatch, block
) -> None:
    # A tiny block makes pyarrow hand back many batches: line numbers must still hold.
    monkeypatch.setattr(csv_export, "READ_BLOCK", block)
    path = _csv(tmp_path, BAD)
    summary, ctx = _run(write_plan, path)
    assert summary.rows_read == len(BAD) - 1
    assert summary.rows_quarantined == len(BAD_REASONS)
    assert summary.entities == 1 and summary.mean_value == 20.0
    q = _read(QUARANTINE, ctx).sort_values("source_line")
    assert dict(zip(q["source_line"], q["reason"], strict=True)) == BAD_REASONS
    assert list(q["raw"]) == [BAD[n - 1] for n in BAD_REASONS]
    assert set(q["source"]) == {str(path)}
    assert not q.duplicated(list(QUARANTINE.key)).any()
    samples = _read(SAMPLES, ctx)
    assert sorted(samples["value"]) == [10.0, 20.0, 30.0]  # line 3's 20 kept, not line 11's 99
    assert len(samples) + len(q) == summary.rows_read


def test_samples_written_in_parts_read_back_without_duplicates(
    tmp_path, write_plan, monkeypatch
) -> None:
    monkeypatch.setattr(importer, "PART_ROWS", 7)
    lines = ["ts,gpu,util"] + [f"{T0 + 60 * i},g{i % 3},{i}" for i in range(50)]
    summary, ctx = _run(write_plan, _csv(tmp_path, lines))
    samples = _read(SAMPLES, ctx)
    assert len(samples) == 50 == summary.rows_read
    assert not samples.duplicated(list(SAMPLES.key)).any()
    assert summary.interval_s == 180.0 and summary.mean_value == 24.5
    assert len(list((ctx.data_dir / ctx.poc / "samples").rglob("*.parquet"))) >= 8


def test_a_missing_column_is_refused_naming_file_and_column(tmp_path, write_plan) -> None:
    path = _csv(tmp_path, ["time;gpu;util", f"{T0};g0;1"])
    with pytest.raises(SampleImportError) as err:
        _run(write_plan, path)
    message = str(err.value)
    assert str(path) in message and "'ts'" in message
    assert "'time', 'gpu', 'util'" in message  # the columns it has (';' found from the header)
    data = tmp_path / "data"
    assert not list(data.rglob("*.parquet")) and not list(data.rglob("_commits/*.json"))


def test_the_node_must_be_the_plans(tmp_path, write_plan) -> None:
    path = _csv(tmp_path, ["ts,gpu,util", f"{T0},g0,1", f"{T0 + 5},g0,2"])
    with pytest.raises(SampleImportError, match="node 'gpu-42' is not one of the plan's"):
        _run(write_plan, path, node="gpu-42")
    assert not list((tmp_path / "data").rglob("*.parquet"))
    _summary, ctx = _run(write_plan, path, node="local-b", device="gpu", unit="fraction")
    rows = _read(SAMPLES, ctx)
    assert set(rows["node"]) == {"local-b"} and set(rows["unit"]) == {"fraction"}


def test_a_single_sample_entity_takes_the_others_median_or_is_quarantined(
    tmp_path, write_plan
) -> None:
    lines = ["ts,gpu,util", f"{T0},g0,1", f"{T0 + 10},g0,1", f"{T0},g1,1", f"{T0 + 30},g1,1"]
    notes: list[str] = []
    summary, ctx = _run(write_plan, _csv(tmp_path, [*lines, f"{T0 + 7},lone,9"]), notes)
    assert summary.entities == 3 and summary.interval_s == 20.0
    assert summary.rows_quarantined == 0
    assert notes == [
        "1 entity with a single sample (lone) took the median interval of the others, 20 s"
    ]
    lone = _read(SAMPLES, ctx).query("entity == 'lone'")
    assert _epoch(lone["t_from"]) == [T0 - 13] and _epoch(lone["t_to"]) == [T0 + 7]

    only = _csv(tmp_path, ["ts,gpu,util", f"{T0},a,1", f"{T0},b,2"], "only.csv")
    summary, ctx = _run(write_plan, only)
    assert summary.to_json() == {
        "rows_read": 2,
        "rows_quarantined": 2,
        "entities": 0,
        "first": None,
        "last": None,
        "interval_s": None,
        "gaps": 0,
        "gap_seconds": 0.0,
        "mean_value": None,
    }
    q = _read(QUARANTINE, ctx).sort_values("source_line")
    assert list(q["source_line"]) == [2, 3]
    assert list(q["reason"]) == [
        f"only sample of entity {e!r}: no spacing to take an interval from, and no other "
        "entity has one"
        for e in ("a", "b")
    ]
    assert _read(SAMPLES, ctx).empty


def _cli_env(tmp_path: Path) -> dict[str, str]:
    """No Prefect server configured: the command starts its own (cli/server.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return {**env, "PREFECT_HOME": str(tmp_path / "prefect-home")}


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", "samples", "import", *args],
        cwd=REPO,
        env=_cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
