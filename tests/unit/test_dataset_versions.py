"""Datasets across upgrades: the files the previous released version wrote
(tests/support/fixtures/datasets_previous) read beside the current version's, by the readers,
the utilization stage, the weekly report and the record; a later trials version (a column
added, a value renamed) reading them too; what a read says of the versions it took in."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Callable
from dataclasses import replace
from html import escape as html_escape
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tasks.poc.record.build as record_build
import tasks.window.weekly.stage as weekly_stage
from tasks.data.dataset_spec import I64, TS, Column, DatasetSpec, RenamedValue, S
from tasks.data.dataset_versions import (
    apply_renames,
    file_version,
    renames,
    versions_lines,
    versions_of,
)
from tasks.data.datasets import EVENTS, TRIALS
from tasks.data.errors import DatasetError
from tasks.data.events import ALL_EVENTS
from tasks.data.runctx import RunContext
from tasks.data.runs import commit_run
from tasks.data.store import read_dataset, read_dataset_dask, stored_versions, write_dataset
from tasks.poc.record import build_record
from tasks.window.utilization import compute_utilization
from tasks.window.weekly import build_weekly_report
from tasks.window.weekly import rows as weekly_rows
from tests.support.fixtures.datasets_previous import make_fixtures as previous
from tests.unit.test_weekly import fp, frame, make_plan

PREVIOUS = Path(previous.__file__).parent / previous.POC
POC, WEEK, T0 = previous.POC, previous.WEEK, previous.T0
LATER = T0 + dt.timedelta(hours=1)


def _trials_v2() -> DatasetSpec:
    """The trials a later release might declare: a column added, a value added to
    page_cache, a value of page_cache_drop renamed."""
    columns = []
    for c in TRIALS.columns:
        if c.name == "page_cache":
            c = replace(c, allowed=(*(c.allowed or ()), "dropped_files"))
        elif c.name == "page_cache_drop":
            c = replace(c, allowed=("all", "files"))
        columns.append(c)
    columns.append(
        Column(
            "restore_attempts",
            I64,
            min=0,
            since=2,
            meaning_when_missing="not counted before v2 (one attempt, as far as is known)",
        )
    )
    return replace(
        TRIALS,
        columns=tuple(columns),
        history=(*TRIALS.history, "2: restore_attempts; page_cache dropped_files; global → all"),
        renamed=(RenamedValue("page_cache_drop", "global", "all", since=2),),
    )


TRIALS_V2 = _trials_v2()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A PoC folder holding the previous version's files (and commit records)."""
    shutil.copytree(PREVIOUS, tmp_path / "data" / POC)
    return tmp_path / "data"


def write_run(data_dir: Path, run_id: str, parts: list[tuple[list[dict], DatasetSpec]]) -> None:
    """The current version's rows of one run, committed."""
    for rows, spec in parts:
        write_dataset(frame(rows, spec), spec, data_dir=data_dir, poc=POC, run_id=run_id)
    commit_run(data_dir, POC, run_id, "test", "complete")


def new_trials(run_id: str, cold: bool = False) -> list[dict[str, Any]]:
    if cold:
        rows = previous.cold_start_trials(
            run_id, {"unmanaged": [3.4], "managed": [1.5]}, page_cache="dropped_files"
        )
        return [{**r, "page_cache_drop": "files", "restore_attempts": 1} for r in rows]
    rows = previous.recovery_trials(run_id, {"managed": [4.0], "unmanaged": [40.0]})
    return [{**r, "restore_attempts": 2} for r in rows]


def context(data_dir: Path, run_id: str, stage: str) -> RunContext:
    return RunContext(
        poc=POC,
        run_id=run_id,
        plan_path="plan.yaml",
        plan_hash="h",
        git_sha="g",
        data_dir=data_dir,
        started_at=LATER,
        fingerprint=fp(),
        stage=stage,
    )


# --- the previous version's files -------------------------------------------------------------


def test_the_previous_files_are_version_1_and_this_code_writes_events_as_2(tmp_path: Path) -> None:
    files = sorted(PREVIOUS.rglob("*.parquet"))
    assert len(files) == 3 and {file_version(pq.read_schema(f)) for f in files} == {1}
    assert (EVENTS.version, TRIALS.version) == (2, 1)
    assert EVENTS.history[1].startswith("2: intended: `event` allows only")
    written = write_dataset(
        frame(previous.chain_events("r", "t", T0), EVENTS),
        EVENTS,
        data_dir=tmp_path,
        poc=POC,
        run_id="r",
    )
    meta = pq.read_schema(written[0]).metadata
    assert (
        meta[b"ckpt_poc.schema_version"] == b"2" and file_version(pq.read_schema(written[0])) == 2
    )
    assert file_version(pa.schema([("a", pa.int64())])) == 1  # no metadata: version 1


def test_events_of_both_versions_read_as_one(data_dir: Path) -> None:
    write_run(data_dir, "new-rec", [(previous.chain_events("new-rec", "new-chain", LATER), EVENTS)])
    df = read_dataset(EVENTS, data_dir=data_dir, poc=POC)
    assert len(df) == 2 * 56 and set(df["run_id"]) == {"prev-rec", "new-rec"}
    assert set(df["event"]) <= set(ALL_EVENTS)  # the names the previous version wrote
    read = versions_of(df)
    assert read is not None and read.files == ((1, 1), (2, 1)) and read.versions == (1, 2)
    assert read.line() == "events: v1 (1 file), v2 (1 file), read as v2"
    assert stored_versions(EVENTS, data_dir=data_dir, poc=POC) == read
    one = read_dataset(EVENTS, data_dir=data_dir, poc=POC, run_id="prev-rec", columns=["event"])
    assert len(one) == 56 and versions_of(one) is not None
    ddf = read_dataset_dask(EVENTS, data_dir=data_dir, poc=POC).compute()
    assert len(ddf) == len(df) and dict(ddf.dtypes) == dict(df.dtypes)


def test_a_later_trials_version_reads_older_files_with_nulls_and_renamed_values(
    data_dir: Path,
) -> None:
    write_run(data_dir, "new-rec", [(new_trials("new-rec"), TRIALS_V2)])
    write_run(data_dir, "new-cs", [(new_trials("new-cs", cold=True), TRIALS_V2)])
    df = read_dataset(TRIALS_V2, data_dir=data_dir, poc=POC)
    assert len(df) == 8 + 4
    # In file order, as before: the week's files sorted by name.
    assert list(dict.fromkeys(df["run_id"])) == ["new-cs", "new-rec", "prev-cs", "prev-rec"]
    old = df[df["run_id"].str.startswith("prev")]
    assert old["restore_attempts"].isna().all()
    assert df.loc[df["run_id"] == "new-rec", "restore_attempts"].tolist() == [2, 2]
    cache = df.set_index("run_id")["page_cache_drop"]
    assert set(cache["prev-cs"]) == {"all"} and set(cache["new-cs"]) == {"files"}
    assert set(df.loc[df["run_id"] == "new-cs", "page_cache"]) == {"dropped_files"}
    assert dict(df.dtypes) == TRIALS_V2.pandas_dtypes
    read = versions_of(df)
    assert read is not None and read.files == ((1, 2), (2, 2))
    assert read.notes == (
        "restore_attempts is null in files before v2: not counted before v2 "
        "(one attempt, as far as is known)",
        "page_cache_drop 'global' in files before v2 is read as 'all'",
    )
    # A run's rows, a few columns: mapped the same way; notes only for the columns read.
    part = read_dataset(
        TRIALS_V2, data_dir=data_dir, poc=POC, run_id="prev-cs", columns=["page_cache_drop"]
    )
    assert part["page_cache_drop"].tolist() == ["all"] * 4
    assert versions_of(part).notes == (  # type: ignore[union-attr]
        "page_cache_drop 'global' in files before v2 is read as 'all'",
    )
    # The released declaration reads the later version's files too, with its own columns.
    released = read_dataset(TRIALS, data_dir=data_dir, poc=POC)
    assert len(released) == 12 and list(released.columns) == TRIALS.column_names
    assert versions_of(released).notes == (  # type: ignore[union-attr]
        "v2 files are newer than this code's v1: read with its columns",
    )
    ddf = read_dataset_dask(TRIALS_V2, data_dir=data_dir, poc=POC).compute()
    assert ddf.sort_values("trial_id")["page_cache_drop"].tolist() == (
        df.sort_values("trial_id")["page_cache_drop"].tolist()
    )


def test_a_value_renamed_twice_is_read_under_its_latest_name() -> None:
    spec = DatasetSpec(
        name="x",
        key=("k",),
        week_from="t",
        columns=(Column("k", S, False, allowed=("c", "z")), Column("t", TS)),
        history=("1: first", "2: a → b", "3: b → c"),
        renamed=(RenamedValue("k", "a", "b", since=2), RenamedValue("k", "b", "c", since=3)),
    )
    assert renames(spec, 1, ["k"]) == {"k": {"a": "c", "b": "c"}}
    assert renames(spec, 2, ["k", "t"]) == {"k": {"b": "c"}}
    assert renames(spec, 3, ["k"]) == {} and renames(spec, 1, ["t"]) == {}
    table = pa.table({"k": pa.array(["a", "z", None, "b"])})
    assert apply_renames(table, renames(spec, 1, ["k"])).column("k").to_pylist() == [
        "c",
        "z",
        None,
        "c",
    ]


@pytest.mark.parametrize(
    "change, error",
    [
        ({"history": ("1: first", "3: skipped")}, "one line 'N: ...' per version"),
        ({"history": ()}, "one line 'N: ...' per version"),
        (
            {
                "history": (*TRIALS.history, "2: x"),
                "columns": (*TRIALS.columns, Column("extra", I64, since=2)),
            },
            "what a null means",
        ),
        (
            {
                "history": (*TRIALS.history, "2: x"),
                "columns": (
                    *TRIALS.columns,
                    Column("extra", I64, False, since=2, meaning_when_missing="m"),
                ),
            },
            "must be nullable",
        ),
        (
            {
                "history": (*TRIALS.history, "2: x"),
                "renamed": (RenamedValue("page_cache", "warm", "tepid", since=2),),
            },
            "is not allowed",
        ),
        (
            {"renamed": (RenamedValue("page_cache", "warm", "dropped", since=2),)},
            "no column or version",
        ),
    ],
)
def test_a_declaration_says_what_older_files_mean(change: dict[str, Any], error: str) -> None:
    with pytest.raises(DatasetError, match=error):
        replace(TRIALS, **change)


# --- the stages that read them: utilization, the weekly report, the record ----------------------


def _spy(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[dict[str, pd.DataFrame]]:
    """What ``module``'s read_frames returned each time it was called."""
    seen: list[dict[str, pd.DataFrame]] = []
    real: Callable[..., dict[str, pd.DataFrame]] = module.read_frames

    def read_frames(*args: Any, **kwargs: Any) -> dict[str, pd.DataFrame]:
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(module, "read_frames", read_frames)
    return seen


def test_the_weekly_report_and_the_record_read_previous_and_new_files_together(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The product upgraded under the PoC: trials at v2 (the report reads them as such), events
    # at v2 (this code's), beside the previous version's files.
    monkeypatch.setitem(weekly_rows.INPUTS, "trials", TRIALS_V2)
    chain = previous.chain_events("new-rec", "new-chain", LATER)
    write_run(data_dir, "new-rec", [(new_trials("new-rec"), TRIALS_V2), (chain, EVENTS)])
    write_run(data_dir, "new-cs", [(new_trials("new-cs", cold=True), TRIALS_V2)])
    plan = make_plan(poc=POC, data_dir=str(data_dir))

    util = compute_utilization(plan, context(data_dir, "util-1", "utilization"), week=WEEK)
    commit_run(data_dir, POC, "util-1", "utilization", "complete")
    assert set(util["arm"]) == {"managed", "unmanaged"}
    assert (util["chains"] == 2).all(), "a chain from each version's events"

    weekly_reads = _spy(monkeypatch, weekly_stage)
    report = build_weekly_report(plan, context(data_dir, "report-1", "weekly_report"), WEEK)
    n = {(r["measure"], r["arm"]): r["n"] for r in report.rows}
    assert n[("recovery_s", "managed")] == n[("recovery_s", "unmanaged")] == 2 + 1
    assert n[("cold_start_speedup", "both")] == 2 + 1
    (frames,) = weekly_reads
    assert len(frames["trials"]) == 8 + 4 and len(frames["utilization"]) == 2
    lines = versions_lines(frames)
    assert lines[0] == (
        "trials: v1 (2 files), v2 (2 files), read as v2; restore_attempts is null in files "
        "before v2: not counted before v2 (one attempt, as far as is known); "
        "page_cache_drop 'global' in files before v2 is read as 'all'"
    )
    assert "utilization: v1 (1 file), read as v1" in lines
    assert "exposure: no files" in lines
    # Both say so: the report's markdown and page, and the record's method section.
    events_line = "events: v1 (1 file), v2 (1 file), read as v2"
    html = Path(report.html).read_text(encoding="utf-8")
    for said in (lines[0], events_line):
        assert f"- {said}" in report.markdown and html_escape(said) in html, said

    record_reads = _spy(monkeypatch, record_build)
    record = build_record(plan, context(data_dir, "record-1", "record"), n_resamples=200)
    (frames,) = record_reads
    assert versions_of(frames["trials"]).versions == (1, 2)  # type: ignore[union-attr]
    assert len(frames["trials"]) == 12
    page = Path(record.html).read_text(encoding="utf-8")
    for run_id in ("prev-rec", "prev-cs", "new-rec", "new-cs", "util-1"):
        assert run_id in page, run_id
    for f in sorted((data_dir / POC / "trials").rglob("*.parquet")):
        assert str(f) in page, f
    assert html_escape(lines[0]) in page and "events: v1 (1 file), v2 (1 file)" in page
    recovery = [r for r in record.table if r[0] == record.table[0][0]]
    assert {r[3] for r in recovery} == {"3"}, recovery
