"""The row types (tasks/data/row_types.py) name only columns their datasets declare.

A column is declared once, in its dataset's declaration (tasks/data/datasets.py); a row type
is a view of some of them. These tests read the columns from the declarations, so no row
type can name a column its dataset lacks, and the builders' rows keep to their types.
"""

from __future__ import annotations

import datetime as dt
from typing import is_typeddict

import pytest

from tasks.data import row_types
from tasks.data.datasets import (
    DATASETS,
    DUMP_PHASES,
    EVENTS,
    IMAGES_PLACE,
    REPORTS,
    SAMPLE_GAPS,
    SAMPLES,
    TRIALS,
    DatasetSpec,
)
from tasks.data.fingerprint import FINGERPRINT_COLUMNS
from tasks.data.plan import load_plan
from tasks.engine.page_cache import CacheState
from tasks.experiments.checkpoints import dump_phases, images_place
from tasks.experiments.recovery_trial import FAULT_DELIVERED
from tasks.experiments.timed_runs import cache_columns, cold_start_row, overhead_row
from tasks.experiments.trials import LOG_TAIL
from tasks.window.sample_summary import _SAMPLE_STRINGS, GROUP_KEYS, SUMMARY_DTYPES, SummaryRow
from tasks.window.sampling import Attribution, gap_row, sample_row
from tasks.window.weekly.model import EXTRA_COLUMNS, ROW_COLUMNS

EVERY_DATASET = tuple(DATASETS.values())
# Each row type → the datasets its rows are written to (the run's stamp: every one of them).
DATASETS_OF: dict[str, tuple[DatasetSpec, ...]] = {
    "Fingerprint": EVERY_DATASET,
    "RunStamp": EVERY_DATASET,
    **dict.fromkeys(
        (
            "TrialStart",
            "TrialEnd",
            "PageCacheColumns",
            "ImagesPlace",
            "DumpPhases",
            "RestoredNumbers",
            "RawRead",
            "_OverheadStart",
            "OverheadRow",
            "ColdStartRow",
            "CheckpointRow",
            "_RecoveryStart",
            "RecoveryRow",
        ),
        (TRIALS,),
    ),
    "AttributionColumns": (SAMPLES,),
    "SampleRow": (SAMPLES,),
    "GapRow": (SAMPLE_GAPS,),
    "ReportRow": (REPORTS,),
    "JudgedRow": (REPORTS,),
    "EventLine": (EVENTS,),
}
NOT_COLUMN_KEYS = {key for group in row_types.NOT_COLUMNS for key in group.__annotations__}


def _row_types() -> dict[str, type]:
    """Every TypedDict of the module but the groups kept beside the rows."""
    return {
        name: value
        for name, value in vars(row_types).items()
        if is_typeddict(value) and value not in row_types.NOT_COLUMNS
    }


def test_every_row_type_says_which_datasets_it_is_written_to() -> None:
    assert sorted(_row_types()) == sorted(DATASETS_OF)


@pytest.mark.parametrize("name", sorted(DATASETS_OF))
def test_a_row_type_names_only_columns_of_its_datasets(name: str) -> None:
    keys = set(_row_types()[name].__annotations__) - NOT_COLUMN_KEYS
    for spec in DATASETS_OF[name]:
        missing = sorted(keys - set(spec.column_names))
        assert not missing, f"{name}: no column of {spec.name}: {missing}"


def test_the_keys_beside_the_rows_are_no_columns() -> None:
    # They ride beside a row for the logs and the page, and are dropped before it is written.
    assert {LOG_TAIL, FAULT_DELIVERED} == set(row_types.FailureNotes.__annotations__)
    assert tuple(row_types.ReportCriterion.__annotations__) == EXTRA_COLUMNS
    assert not NOT_COLUMN_KEYS & set(TRIALS.column_names)
    assert not set(EXTRA_COLUMNS) & set(REPORTS.column_names)


def test_a_declared_group_of_columns_and_its_type_are_the_same_columns() -> None:
    assert tuple(row_types.DumpPhases.__annotations__) == tuple(c.name for c in DUMP_PHASES)
    assert tuple(row_types.ImagesPlace.__annotations__) == tuple(c.name for c in IMAGES_PLACE)
    # A REPORTS row as built: every column but the run's stamp and computed_at.
    stamped = {"poc", "run_id", "computed_at", *FINGERPRINT_COLUMNS}
    assert set(ROW_COLUMNS) == set(REPORTS.column_names) - stamped
    # A sample or gap row as read: every column but the run's stamp.
    for spec, row_type in ((SAMPLES, row_types.SampleRow), (SAMPLE_GAPS, row_types.GapRow)):
        assert set(row_type.__annotations__) == set(spec.column_names) - stamped, spec.name


def test_the_summary_row_is_the_summary_columns() -> None:
    assert tuple(SummaryRow.__annotations__) == tuple(SUMMARY_DTYPES)
    assert GROUP_KEYS[1:] == _SAMPLE_STRINGS  # the order its group key is unpacked in


def _within(row: dict, row_type: type) -> None:
    keys = set(row)
    assert keys <= set(row_type.__annotations__), sorted(keys - set(row_type.__annotations__))
    assert row_type.__required_keys__ <= keys


def test_the_builders_rows_keep_to_their_types(write_plan) -> None:
    plan = load_plan(write_plan())
    now = dt.datetime.now(dt.UTC)
    _within(overhead_row(plan, "steady", 0, "managed", "n1", "a run"), row_types.OverheadRow)
    _within(cold_start_row(plan, "cold-0", "managed", 0, "n1", "a start"), row_types.ColdStartRow)
    _within(cache_columns(CacheState("dropped", "global")), row_types.PageCacheColumns)
    assert tuple(dump_phases({})) == tuple(row_types.DumpPhases.__annotations__)
    assert tuple(images_place(None)) == tuple(row_types.ImagesPlace.__annotations__)
    sample = sample_row(
        node="n1", source="nvml", entity="GPU-1", device="gpu", metric="sm_activity",
        unit="ratio", value=0.5, t_from=now, t_to=now, attribution=Attribution(arm="managed"),
    )  # fmt: skip
    _within(sample, row_types.SampleRow)
    gap = gap_row(node="n1", source="nvml", t_from=now, t_to=now, reason="r", detected_by="sampler")
    _within(gap, row_types.GapRow)
