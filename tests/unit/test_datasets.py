"""Dataset declarations: one schema drives writer, readers and GX suite; writes are atomic."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.data.datasets import DATASETS, GATES
from tasks.data.errors import DatasetError
from tasks.data.fingerprint import FINGERPRINT_COLUMNS, collect_fingerprint
from tasks.data.gates import build_suite, validate_dataset
from tasks.data.runs import commit_run
from tasks.data.store import conform, read_dataset, read_dataset_dask, write_dataset


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_declaration_drives_schema_dtypes_and_suite(name: str) -> None:
    spec = DATASETS[name]
    assert spec.arrow_schema.names == spec.column_names
    assert list(spec.pandas_dtypes) == spec.column_names
    suite = build_suite(spec)
    kinds = [
        e.expectation_type if hasattr(e, "expectation_type") else type(e).__name__
        for e in suite.expectations
    ]
    covered = {getattr(e, "column", None) for e in suite.expectations} - {None}
    must = {c.name for c in spec.columns if not c.nullable or c.allowed or c.min is not None}
    assert must <= covered, f"suite misses {must - covered}"
    assert len(kinds) >= len(must)
    for fp in FINGERPRINT_COLUMNS:
        assert fp in spec.column_names


def _gate_rows(n: int = 3, run_id: str = "r1") -> pd.DataFrame:
    fp = collect_fingerprint()
    now = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
    rows = [
        {
            "poc": "p",
            "run_id": run_id,
            "gate": "g",
            "dataset": "d",
            "expectation": f"e{i}",
            "column": None,
            "success": True,
            "observed": "{}",
            "checked_at": now,
            **fp,
        }
        for i in range(n)
    ]
    return pd.DataFrame(rows)


def test_fingerprint_has_explicit_none_without_gpu() -> None:
    fp = collect_fingerprint()
    assert list(fp) == list(FINGERPRINT_COLUMNS)
    assert fp["fp_cores"] > 0 and fp["fp_mem_bytes"] > 0
    if fp["fp_gpu_count"] == 0:
        assert fp["fp_gpu_model"] == fp["fp_driver"] == fp["fp_cuda"] == "none"


def test_write_is_partitioned_atomic_and_append_only(tmp_path: Path) -> None:
    files = write_dataset(
        _gate_rows(),
        GATES,
        data_dir=tmp_path,
        poc="p",
        run_id="r1",
        metadata={"ckpt_poc.plan_hash": "abc"},
    )
    assert [f.relative_to(tmp_path).as_posix() for f in files] == [
        "p/gates/week=2026-W49/r1.parquet"
    ]
    meta = pq.read_schema(files[0]).metadata
    assert meta[b"ckpt_poc.plan_hash"] == b"abc" and meta[b"ckpt_poc.run_id"] == b"r1"
    assert meta[b"ckpt_poc.dataset"] == b"gates" and b"ckpt_poc.schema_version" in meta
    with pytest.raises(DatasetError, match="append-only"):
        write_dataset(_gate_rows(), GATES, data_dir=tmp_path, poc="p", run_id="r1")
    assert not list(tmp_path.rglob("*.tmp")), "no temp file left behind"
    write_dataset(_gate_rows(2, "r2"), GATES, data_dir=tmp_path, poc="p", run_id="r2")
    # Written is not yet visible: a run is read once it commits (tasks.data.runs).
    assert len(read_dataset(GATES, data_dir=tmp_path, poc="p")) == 0
    assert len(read_dataset(GATES, data_dir=tmp_path, poc="p", include_uncommitted=True)) == 5
    for run_id in ("r1", "r2"):
        commit_run(tmp_path, "p", run_id, "test", "complete")
    df = read_dataset(GATES, data_dir=tmp_path, poc="p")
    assert len(df) == 5
    assert dict(df.dtypes) == GATES.pandas_dtypes
    ddf = read_dataset_dask(GATES, data_dir=tmp_path, poc="p").compute()
    assert dict(ddf.dtypes) == dict(df.dtypes)
    assert len(read_dataset(GATES, data_dir=tmp_path, poc="p", run_id="r2")) == 2


def test_a_bad_frame_is_refused_and_existing_data_untouched(tmp_path: Path) -> None:
    first = write_dataset(_gate_rows(), GATES, data_dir=tmp_path, poc="p", run_id="r1")
    before = first[0].read_bytes()
    bad = _gate_rows().drop(columns=["gate"])
    with pytest.raises(DatasetError, match="missing \\['gate'\\]"):
        write_dataset(bad, GATES, data_dir=tmp_path, poc="p", run_id="r2")
    wrong_type = _gate_rows().assign(success="maybe")
    with pytest.raises(DatasetError):
        write_dataset(wrong_type, GATES, data_dir=tmp_path, poc="p", run_id="r3")
    assert first[0].read_bytes() == before
    assert len(list(tmp_path.rglob("*.parquet"))) == 1


def test_gx_suite_catches_violations_and_names_them() -> None:
    df = _gate_rows()
    df.loc[1, "gate"] = None
    checks = validate_dataset("t", GATES, df)
    failed = [c for c in checks if not c.success]
    assert [(c.expectation, c.column) for c in failed] == [
        ("expect_column_values_to_not_be_null", "gate")
    ]
    assert "unexpected_count" in failed[0].describe()


def test_conform_orders_and_casts() -> None:
    t = conform(_gate_rows()[list(reversed(GATES.column_names))], GATES)
    assert t.schema.names == GATES.column_names
    assert t.schema.field("checked_at").type == pa.timestamp("us", tz="UTC")


def test_a_failed_gate_is_stored_and_blocks(tmp_path: Path) -> None:
    from tasks.data.errors import GateFailed
    from tasks.data.gates import plain_check, record_and_enforce
    from tasks.data.plan import load_plan
    from tasks.data.runctx import make_run_context
    from tests.support.common import REPO

    plan = load_plan(REPO / "plans" / "demo.yaml").model_copy(update={"data_dir": str(tmp_path)})
    ctx = make_run_context(plan, REPO / "plans" / "demo.yaml", run_id="gate-run")
    df = _gate_rows()
    df.loc[0, "gate"] = None
    checks = [
        *validate_dataset("baseline", GATES, df),
        plain_check("baseline", "jobs", "rows_reconcile", False, read=3, parsed=1),
    ]
    with pytest.raises(GateFailed) as info:
        record_and_enforce(checks, ctx)
    message = str(info.value)
    assert "expect_column_values_to_not_be_null on gates.gate" in message
    assert "rows_reconcile on jobs" in message and '"read": 3' in message
    stored = read_dataset(
        GATES, data_dir=tmp_path, poc="demo", run_id="gate-run", include_uncommitted=True
    )
    assert len(stored) == len(checks) and (~stored["success"].astype(bool)).sum() == 2


def test_a_sampled_table_is_still_checked_on_every_row() -> None:
    # GX sees a 2-row sample; the one null and the one unknown gate are found by the exact
    # pyarrow checks over every row, named like GX's and saying which engine found them.
    df = _gate_rows(n=50)
    df.loc[37, "gate"] = None
    df.loc[41, "dataset"] = None
    checks = validate_dataset("t", GATES, df, max_rows=2)
    failed = {(c.expectation, c.column) for c in checks if not c.success}
    assert failed == {
        ("expect_column_values_to_not_be_null", "gate"),
        ("expect_column_values_to_not_be_null", "dataset"),
    }
    exact = [c for c in checks if c.observed.get("engine") == "pyarrow (every row)"]
    assert exact and all(c.observed["rows_validated"] == 50 for c in exact)
    sampled = [c for c in checks if "engine" not in c.observed]
    assert sampled and all(c.observed["rows_validated"] == 2 for c in sampled)


def test_exact_checks_count_values_outside_the_set_and_the_range() -> None:
    from tasks.data.datasets import EXPOSURE
    from tasks.data.gates import exact_checks

    table = pa.table(
        {
            "kind": pa.array(["state", "workload?", "state", None]).dictionary_encode(),
            "allocations": pa.array([1, -2, 3, None], pa.int64()),
        }
    )
    checks = {(c.expectation, c.column): c for c in exact_checks("t", EXPOSURE, table)}
    in_set = checks[("expect_column_values_to_be_in_set", "kind")]
    assert not in_set.success and in_set.observed["partial_unexpected_list"] == ["workload?"]
    between = checks[("expect_column_values_to_be_between", "allocations")]
    assert between.observed["unexpected_count"] == 1 and not between.success
    assert checks[("expect_column_values_to_not_be_null", "kind")].observed["unexpected_count"] == 1


def test_a_dead_gx_worker_falls_back_to_validating_in_process() -> None:
    from tasks.data import gates, gx_worker

    df = _gate_rows()
    df.loc[1, "gate"] = None
    worker = gx_worker.start()
    worker._proc.kill()  # type: ignore[union-attr]
    gates._ACTIVE.append(worker)
    try:
        checks = validate_dataset("t", GATES, df)
    finally:
        gates._ACTIVE.remove(worker)
        gx_worker.stop(worker)
    assert [(c.expectation, c.column) for c in checks if not c.success] == [
        ("expect_column_values_to_not_be_null", "gate")
    ]


def test_the_gx_worker_is_started_for_a_big_input_or_with_cores_to_spare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tasks.data import gates

    monkeypatch.delenv("CKPT_POC_GX_WORKER", raising=False)
    big, small = gates._WORKER_MIN_INPUT_BYTES, gates._WORKER_MIN_INPUT_BYTES - 1
    monkeypatch.setattr(gates, "usable_cpus", lambda: 2)
    assert gates._worker_wanted(big)
    assert not gates._worker_wanted(small)
    assert not gates._worker_wanted(None)
    monkeypatch.setattr(gates, "usable_cpus", lambda: 4)
    assert gates._worker_wanted(small) and gates._worker_wanted(None)
    monkeypatch.setenv("CKPT_POC_GX_WORKER", "0")
    assert not gates._worker_wanted(big)
    monkeypatch.setenv("CKPT_POC_GX_WORKER", "1")
    monkeypatch.setattr(gates, "usable_cpus", lambda: 1)
    assert gates._worker_wanted(small)
