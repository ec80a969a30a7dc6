"""Dumps as other sites' tools write them: SLURM_TIME_FORMAT, short rows, no State, odd steps.

Each dump is the committed real sample (data/samples/sacct-sample.psv) rewritten the way sacct
prints it under that setting (times re-formatted from the sample's own, as Slurm's
``slurm_make_time_str`` would), read through the real baseline pipeline.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.baseline import time_formats as tf
from tasks.baseline.run import run_baseline
from tasks.data.errors import AccountingError
from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tasks.experiments.report import baseline_markdown, exposure_table
from tests.unit.test_accounting_formats import (  # noqa: F401
    TIMES,
    _jobs_times,
    _relative_run,
    _same_measures,
    reference,
    reformatted,
    relative,
)
from tests.unit.test_accounting_sites import DEMO_PLAN, SAMPLE, baseline, cut, sample_rows


@pytest.mark.parametrize(
    ("fmt", "label"),
    [
        ("%s", "%s (epoch seconds)"),
        ("%Y-%m-%d %H:%M:%S", "strftime %Y-%m-%d %H:%M:%S"),
        ("%m/%d/%y-%H:%M:%S", "strftime %m/%d/%y-%H:%M:%S"),
        ("%Y%m%d%H%M%S", "strftime %Y%m%d%H%M%S"),  # packed, without separators
        ("%Y%m%dT%H%M%S", "strftime %Y%m%dT%H%M%S"),  # ISO 8601's basic form
    ],
)
def test_epoch_and_strftime_dumps_read_as_the_standard_one(
    tmp_path: Path, reference: dict, fmt: str, label: str
) -> None:
    # The 30th of November decides month/day order; epoch seconds are exact in any zone.
    result = baseline(tmp_path, cut(list(sample_rows()[0]), reformatted(fmt)))
    s = result.summary.to_json()
    _same_measures(s, reference)
    assert s["time_formats"] == dict.fromkeys(TIMES, label)
    standard = baseline(tmp_path / "std", SAMPLE.read_text())
    assert _jobs_times(result) == _jobs_times(standard)
    assert f"times read as {label}" in str(exposure_table(result).caption)
    assert f"Times read as {label}." in baseline_markdown(result)
    meta = pq.read_schema(result.written["jobs"][0]).metadata
    assert json.loads(meta[b"ckpt_poc.time_formats"]) == s["time_formats"]


def test_relative_dump_is_dated_by_the_files_mtime(tmp_path: Path, reference: dict) -> None:
    # Dumped two days after the sample's jobs: "Ystday" would be off by one, "%-d %b" needs
    # the anchor's year. Relative forms keep minutes only (seconds for the day itself).
    today = dt.date(2026, 12, 2)
    dump = tmp_path / "rel" / "site.psv"
    rows = reformatted("relative", today)
    assert {r["Submit"].split(" ")[0] for r in rows} == {"30"}  # "30 Nov 11:19"
    result = _relative_run(dump, rows, today)
    s = result.summary.to_json()
    assert s["rows_quarantined"] == 0
    assert s["allocations_by_state"] == reference["allocations_by_state"]
    assert s["gpu_hours_by_state"] == pytest.approx(reference["gpu_hours_by_state"])
    assert s["time_formats"]["Start"] == (
        "relative (to 2026-12-02, the file's mtime 2026-12-02T12:00:00Z)"
    )
    standard = baseline(tmp_path / "std", SAMPLE.read_text())
    minutes = [
        (j, *(t.replace(second=0) if t else None for t in ts)) for j, *ts in _jobs_times(standard)
    ]
    assert _jobs_times(result) == minutes
    # The same day: every time as HH:MM:SS, so to the second; the day before: "Ystday".
    for days, form in ((0, r"^\d\d:\d\d:\d\d$"), (1, r"^Ystday \d\d:\d\d$")):
        day = dt.date(2026, 11, 30) + dt.timedelta(days=days)
        rows = reformatted("relative", day)
        assert all(tf.re.match(form, r["Start"]) for r in rows if r["Start"] != "Unknown")
        got = _relative_run(tmp_path / f"d{days}" / "site.psv", rows, day)
        want = _jobs_times(standard) if days == 0 else minutes
        assert _jobs_times(got) == want
        assert got.summary.to_json()["chains"] == reference["chains"] or days


def test_a_relative_dump_copied_without_its_mtime_is_dated_by_dumped_on(
    tmp_path: Path, reference: dict
) -> None:
    # Copied without -p a year later: by its mtime every "30 Nov" would be read in the
    # wrong year; --dumped-on gives the day and the reading says where it came from.
    today = dt.date(2026, 12, 2)
    rows = reformatted("relative", today)
    dated = _relative_run(tmp_path / "by-mtime" / "site.psv", rows, today)
    copy = _relative_run(tmp_path / "copy" / "site.psv", rows, dt.date(2028, 1, 15))
    assert _jobs_times(copy) != _jobs_times(dated)
    plan = load_plan(DEMO_PLAN).model_copy(update={"data_dir": str(tmp_path / "given")})
    given = run_baseline(
        plan,
        make_run_context(plan, DEMO_PLAN),
        sacct_file=str(tmp_path / "copy" / "site.psv"),
        dumped_on=tf.parse_dumped_on("2026-12-02"),
    )
    assert _jobs_times(given) == _jobs_times(dated)
    assert given.summary.allocations_by_state == reference["allocations_by_state"]
    assert given.summary.time_formats["Start"] == "relative (to 2026-12-02, --dumped-on 2026-12-02)"
    for bad in ("2026-13-01", "02/12/2026", "yesterday", ""):
        with pytest.raises(AccountingError, match=r"--dumped-on: .* is not a date as YYYY-MM-DD"):
            tf.parse_dumped_on(bad)
    assert tf.parse_dumped_on(None) is None
