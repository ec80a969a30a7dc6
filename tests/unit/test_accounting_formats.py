"""Dumps as other sites' tools write them: SLURM_TIME_FORMAT, short rows, no State, odd steps.

Each dump is the committed real sample (data/samples/sacct-sample.psv) rewritten the way sacct
prints it under that setting (times re-formatted from the sample's own, as Slurm's
``slurm_make_time_str`` would), read through the real baseline pipeline.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.baseline import time_formats as tf
from tasks.baseline.run import run_baseline
from tasks.data.errors import AccountingError
from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tasks.data.slurm_states import NO_STATE
from tasks.experiments.report import baseline_markdown, candidates_table, exposure_table
from tests.unit.test_accounting_sites import DEMO_PLAN, SAMPLE, baseline, cut, parse, sample_rows

TIMES = ("Submit", "Start", "End")


def _iso(text: str) -> dt.datetime | None:
    return None if text in ("Unknown", "None", "") else dt.datetime.fromisoformat(text)


def relative(when: dt.datetime, today: dt.date) -> str:
    """Slurm's _relative_date_fmt (src/common/parse_time.c), in Python's strftime."""
    distance = (when.date() - today).days
    if distance == -1:
        return when.strftime("Ystday %H:%M")
    if distance == 0:
        return when.strftime("%H:%M:%S")
    if distance == 1:
        return when.strftime("Tomorr %H:%M")
    if abs(distance) > 365:
        return when.strftime("%-d %b %Y")
    if distance < -1 or distance > 6:
        return when.strftime("%-d %b %H:%M")
    return when.strftime("%a %H:%M")


def reformatted(fmt: str, today: dt.date | None = None, shift: dt.timedelta = dt.timedelta()):
    """The sample's rows with every time as sacct prints it under SLURM_TIME_FORMAT=fmt."""
    rows = []
    for r in sample_rows():
        row = dict(r)
        for name in TIMES:
            when = _iso(r[name])
            if when is None:
                continue
            when += shift
            if fmt == "relative":
                row[name] = relative(when, today or when.date())
            elif fmt == "%s":
                row[name] = str(int(when.replace(tzinfo=dt.UTC).timestamp()))
            else:
                row[name] = when.strftime(fmt)
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    return baseline(tmp_path_factory.mktemp("reference"), SAMPLE.read_text()).summary.to_json()


def _same_measures(got: dict, want: dict) -> None:
    assert got["rows_quarantined"] == 0 and got["rows_read"] == want["rows_read"]
    assert got["allocations_by_state"] == want["allocations_by_state"]
    assert got["gpu_hours_by_state"] == pytest.approx(want["gpu_hours_by_state"])
    assert got["node_hours_by_state"] == pytest.approx(want["node_hours_by_state"])
    assert got["exposed_gpu_hours"] == pytest.approx(want["exposed_gpu_hours"])
    assert got["chains"] == want["chains"]


def _jobs_times(result) -> list[tuple]:
    jobs = pq.read_table(result.written["jobs"]).to_pylist()
    return [tuple(j[c] for c in ("job_id", "submit", "start", "end")) for j in jobs]


def _relative_run(dump: Path, rows: list[dict], today: dt.date):
    """The baseline over the rows written as ``dump``, its mtime noon (UTC) of ``today``."""
    dump.parent.mkdir(parents=True)
    dump.write_text(cut(list(sample_rows()[0]), rows))
    noon = dt.datetime.combine(today, dt.time(12), dt.UTC).timestamp()
    os.utime(dump, (noon, noon))
    plan = load_plan(DEMO_PLAN).model_copy(update={"data_dir": str(dump.parent / "data")})
    return run_baseline(plan, make_run_context(plan, DEMO_PLAN), sacct_file=str(dump))


def test_every_relative_form_resolves_against_its_anchor() -> None:
    import pyarrow as pa

    today = dt.date(2026, 12, 1)  # a Tuesday
    cases = {
        "11:09:07": dt.datetime(2026, 12, 1, 11, 9, 7),
        "Ystday 10:00": dt.datetime(2026, 11, 30, 10, 0),
        "Tomorr 09:00": dt.datetime(2026, 12, 2, 9, 0),
        "Thu 08:30": dt.datetime(2026, 12, 3, 8, 30),  # 2 days ahead
        "Sun 23:59": dt.datetime(2026, 12, 6, 23, 59),  # 5 days ahead
        "4 Sep 11:09": dt.datetime(2026, 9, 4, 11, 9),
        "28 Nov 01:00": dt.datetime(2026, 11, 28, 1, 0),
        "20 Dec 05:00": dt.datetime(2025, 12, 20, 5, 0),  # not this year's: in the future
        "3 Jan 2024": dt.datetime(2024, 1, 3),
    }
    for text, when in cases.items():  # the writer above agrees with every case
        if text != "20 Dec 05:00":
            assert relative(when, today) == text, text
    fmt = tf.detect_time_format(list(cases), today, "given")
    assert fmt is not None and fmt.kind == "relative"
    got, bad = tf.parse_times(pa.array([*cases, "Unknown", "Ystday 25:00"]), fmt)
    utc = [w.replace(tzinfo=dt.UTC) for w in cases.values()]
    assert got.to_pylist() == [*utc, None, None]
    assert bad.to_pylist() == [False] * len(cases) + [False, True]


def test_a_relative_stream_without_a_file_asks_for_the_day() -> None:
    text = cut(list(sample_rows()[0]), reformatted("relative"))
    with pytest.raises(AccountingError, match=r"site\.psv:2: Submit is in .*relative form"):
        parse(text)


def test_a_damaged_value_is_quarantined_naming_the_detected_format(tmp_path: Path) -> None:
    rows = reformatted("%s")
    rows[2] = {**rows[2], "Start": "yesterday"}
    result = baseline(tmp_path, cut(list(sample_rows()[0]), rows))
    assert result.summary.to_json()["time_formats"]["Start"] == "%s (epoch seconds)"
    quarantine = pq.read_table(result.written["quarantine"]).to_pylist()
    assert [(q["source_line"], q["reason"]) for q in quarantine] == [
        (4, "Start is not a timestamp in the dump's format (%s (epoch seconds))")
    ]


def test_strftime_candidates_and_the_day_month_order() -> None:
    assert tf.strftime_candidates("09/04/26-11:09:00") == [
        "%m/%d/%y-%H:%M:%S",
        "%d/%m/%y-%H:%M:%S",
        "%y/%m/%d-%H:%M:%S",
    ]
    one = tf.detect_time_format(["09/04/26-11:09:00"])
    assert one is not None and one.strftime == "%m/%d/%y-%H:%M:%S" and "fits the sample" in one.note
    decided = tf.detect_time_format(["09/04/26-11:09:00", "25/04/26-11:09:00"])
    # A day above 12 rules month-first out; two-digit years leave y/m/d possible, and said.
    assert decided is not None and decided.strftime == "%d/%m/%y-%H:%M:%S"
    assert decided.note.startswith("%y/%m/%d-%H:%M:%S fits the sample too")
    assert tf.detect_time_format(["2026-09-04 11:09:00 PM"]).strftime == "%Y-%m-%d %I:%M:%S %p"
    assert tf.detect_time_format(["Unknown", "None"]) is None


# --- rows short of trailing empty fields ------------------------------------------------------


def test_rows_short_of_trailing_empty_fields_read_as_empty(tmp_path: Path, reference: dict) -> None:
    names = list(sample_rows()[0])
    # Steps have no Timelimit or Partition: last, those fields are the ones a tool drops.
    order = [n for n in names if n not in ("Timelimit", "Partition")] + ["Timelimit", "Partition"]
    lines = cut(order).splitlines()
    stripped = [lines[0], *(line.rstrip("|") for line in lines[1:])]
    short = sum(1 for a, b in zip(lines, stripped, strict=True) if a != b)
    assert short == sum(1 for r in sample_rows() if "." in r["JobID"])
    stripped.append(lines[3] + "|extra")  # more fields than the header: quarantined
    result = baseline(tmp_path, "\n".join(stripped) + "\n", max_share=1.0)
    s = result.summary.to_json()
    assert s["rows_short_of_fields"] == short and s["rows_quarantined"] == 1
    assert s["allocations_by_state"] == reference["allocations_by_state"]
    assert s["gpu_hours_by_state"] == pytest.approx(reference["gpu_hours_by_state"])
    quarantine = pq.read_table(result.written["quarantine"]).to_pylist()
    assert [q["reason"] for q in quarantine] == ["20 fields, expected 19"]
    assert f"{short} rows short of trailing fields" in str(exposure_table(result).caption)


# --- a dump without State ---------------------------------------------------------------------


LACKS_STATE = "the dump lacks State"


@pytest.mark.parametrize("use_dask", [False, True])
def test_a_dump_without_state_gives_hours_and_workloads_not_exposure(
    tmp_path: Path, reference: dict, use_dask: bool
) -> None:
    names = [n for n in sample_rows()[0] if n != "State"]
    result = baseline(tmp_path, cut(names), use_dask=use_dask)
    s = result.summary.to_json()
    allocations = sum(reference["allocations_by_state"].values())
    assert s["rows_quarantined"] == 0
    assert s["allocations_by_state"] == {NO_STATE: allocations}
    assert s["gpu_hours_by_state"][NO_STATE] == pytest.approx(
        sum(reference["gpu_hours_by_state"].values())
    )
    assert s["node_hours_by_state"][NO_STATE] == pytest.approx(
        sum(reference["node_hours_by_state"].values())
    )
    assert s["not_computed"] == {
        "exposed_gpu_hours": LACKS_STATE,
        "timeout_gpu_hours": LACKS_STATE,
        "chains": LACKS_STATE,
    }
    assert s["exposed_gpu_hours"] is None and s["chains"] is None
    cands = result.exposure.candidates
    assert len(cands) and list(cands["gpu_hours"]) == sorted(cands["gpu_hours"], reverse=True)
    markdown = baseline_markdown(result)
    assert f"exposed GPU-hours not computed: {LACKS_STATE}" in markdown
    assert f"| {NO_STATE} | {allocations} |" in markdown
    assert "no state: the dump lacks State" in markdown
    assert LACKS_STATE in str(candidates_table(result).caption)
    meta = pq.read_schema(result.written["exposure"][0]).metadata
    assert json.loads(meta[b"ckpt_poc.not_computed"]) == s["not_computed"]


# --- step ids as narrow columns print them ----------------------------------------------------


def test_odd_step_ids_are_kept_as_steps() -> None:
    header = "JobID|State|ElapsedRaw|AllocTRES"
    ids = {
        "123": (True, None),
        "123.ext+": (False, "extern"),
        "123.bat+": (False, "batch"),
        "123.4+": (False, "4+"),
        "124_4.batch": (False, "batch"),
        "125+0.0": (False, "0"),
        "126.in+": (False, "interactive"),
    }
    text = header + "\n" + "\n".join(f"{i}|COMPLETED|60|cpu=1,node=1" for i in ids) + "\n"
    jobs, quarantine, _ = parse(text)
    assert quarantine == []
    got = {r["job_id"]: (r["is_allocation"], r["step"]) for r in jobs.to_pylist()}
    assert got == ids
    _, bad, _ = parse(header + "\n123+|COMPLETED|60|cpu=1\n")  # the job id itself cut: unknown
    assert [q.reason for q in bad] == ["JobID does not match 123, 123_4, 123+0 or 123.step"]
