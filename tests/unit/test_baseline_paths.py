"""The in-memory and the out-of-core (Dask) baseline paths give the same answers."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tasks.baseline.run as run_module
from tasks.baseline.run import run_baseline
from tasks.data.datasets import JOBS
from tasks.data.errors import GateFailed
from tasks.data.plan import Plan, load_plan
from tasks.data.runctx import make_run_context
from tasks.data.store import read_dataset
from tests.support.common import HEADER, REPO

STATES = ["COMPLETED"] * 6 + ["FAILED", "TIMEOUT", "CANCELLED by 7", "NODE_FAIL", "REQUEUED"]


def _history(path: Path, n: int = 3000, seed: int = 7) -> None:
    rng = random.Random(seed)
    lines = [HEADER]
    for i in range(n):
        user, name = rng.randrange(15), rng.randrange(8)
        day, hour = rng.randrange(1, 20), rng.randrange(0, 20)
        elapsed = rng.randrange(60, 7200)
        gpus = rng.choice([0, 1, 2, 4])
        submit = f"2026-10-{day:02d}T{hour:02d}:00:00"
        end_h, end_m = divmod(hour * 60 + elapsed // 60, 60)
        end = f"2026-10-{day:02d}T{min(end_h, 23):02d}:{end_m:02d}:00"
        tres = f"cpu=4,gres/gpu:a100={gpus},gres/gpu={gpus},node=1" if gpus else "cpu=4,node=1"
        row = (
            f"{1000 + i}|{1000 + i}|c1|gpu|user{user}|acct{user % 4}|job{name}|"
            f"{rng.choice(STATES)}|0:0|{submit}|{submit}|{end}|00:00:00|{elapsed}|"
            f"1-00:00:00|1|4|{tres}|n1"
        )
        lines.append(row)
        if rng.random() < 0.03:  # the same job captured twice
            lines.append(row)
    path.write_text("\n".join(lines) + "\n")


def _demo_plan(tmp_path: Path) -> Plan:
    """The demo plan, writing under ``tmp_path / "data"``."""
    return load_plan(REPO / "plans" / "demo.yaml").model_copy(
        update={"data_dir": str(tmp_path / "data")}
    )


def test_memory_and_dask_paths_agree(tmp_path: Path) -> None:
    dump = tmp_path / "history.psv"
    _history(dump)
    plan = _demo_plan(tmp_path)
    results = [
        run_baseline(
            plan,
            make_run_context(plan, REPO / "plans" / "demo.yaml"),
            sacct_file=str(dump),
            use_dask=use_dask,
        )
        for use_dask in (False, True)
    ]
    memory, dask = (r.summary.to_json() for r in results)
    assert [r.path for r in results] == ["memory", "dask"]
    assert results[0].exposure.duplicates_ignored == results[1].exposure.duplicates_ignored > 0
    assert memory["chains"] and memory["chains"] == dask["chains"]
    for key in ("rows_read", "rows_quarantined", "allocations_by_state"):
        assert memory[key] == dask[key], key
    for key in ("gpu_hours_by_state", "node_hours_by_state"):
        assert memory[key] == pytest.approx(dask[key], rel=1e-12), key
    assert memory["exposed_gpu_hours"] == pytest.approx(dask["exposed_gpu_hours"], rel=1e-12)
    cands = [r.exposure.candidates[["workload", "exposed_allocations", "chains"]] for r in results]
    assert cands[0].equals(cands[1])


def test_an_empty_history_is_refused_by_the_gate(tmp_path: Path) -> None:
    dump = tmp_path / "empty.psv"
    dump.write_text(HEADER + "\n")
    plan = _demo_plan(tmp_path)
    with pytest.raises(GateFailed, match="input_has_rows on jobs"):
        run_baseline(
            plan, make_run_context(plan, REPO / "plans" / "demo.yaml"), sacct_file=str(dump)
        )
    assert not list((tmp_path / "data").rglob("jobs/*/*.parquet"))


def test_a_failed_gate_leaves_no_jobs_file_nor_temp_file(tmp_path: Path) -> None:
    """The jobs are written under temp names while the gates run: a gate that fails (here
    the quarantined share, 60 % of the rows having no valid start) leaves neither them nor
    a published file behind."""
    dump = tmp_path / "mostly-bad.psv"
    _history(dump, n=500)
    lines = dump.read_text().splitlines()
    lines[1:301] = [line.replace("|2026-10-", "|20X6-10-", 2) for line in lines[1:301]]
    dump.write_text("\n".join(lines) + "\n")
    plan = _demo_plan(tmp_path)
    with pytest.raises(GateFailed, match="quarantined_share"):
        run_baseline(
            plan, make_run_context(plan, REPO / "plans" / "demo.yaml"), sacct_file=str(dump)
        )
    data = tmp_path / "data"
    assert not list(data.rglob("jobs/*/*.parquet")), "no jobs file published"
    assert not [p.name for p in data.rglob("*") if p.name.endswith(".tmp")], "no temp file"


def test_an_error_in_exposure_leaves_no_jobs_file_nor_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs are written and gated beside the exposure: when the exposure fails, the write
    and the gate are waited for and the temp files removed; nothing is published."""

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("exposure broke")

    monkeypatch.setattr(run_module, "compute_exposure", broken)
    dump = tmp_path / "history.psv"
    _history(dump, n=200)
    plan = _demo_plan(tmp_path)
    with pytest.raises(RuntimeError, match="exposure broke"):
        run_baseline(
            plan, make_run_context(plan, REPO / "plans" / "demo.yaml"), sacct_file=str(dump)
        )
    data = tmp_path / "data"
    assert not list(data.rglob("*.parquet")), "nothing published"
    assert not [p.name for p in data.rglob("*") if p.name.endswith(".tmp")], "no temp file"


def test_the_jobs_files_hold_the_declared_types_and_the_run_stamp(tmp_path: Path) -> None:
    """The run's stamp is held as one-value dictionaries while the stage runs; its files hold
    the declared types (integers plain, strings dictionary-encoded) on both paths, and read
    back as declared with every row stamped."""
    dump = tmp_path / "history.psv"
    _history(dump, n=300)
    plan = _demo_plan(tmp_path)
    for use_dask in (False, True):
        ctx = make_run_context(plan, REPO / "plans" / "demo.yaml")
        result = run_baseline(plan, ctx, sacct_file=str(dump), use_dask=use_dask)
        for path in result.written["jobs"]:
            schema = pq.read_schema(path)
            for name in ("fp_cores", "fp_mem_bytes", "fp_gpu_count"):
                assert schema.field(name).type == pa.int64(), (path, name)
            assert pa.types.is_dictionary(schema.field("run_id").type)
        rows = read_dataset(
            JOBS, data_dir=plan.data_dir, poc=plan.poc, run_id=ctx.run_id, include_uncommitted=True
        )
        assert len(rows) > 0
        assert (rows["fp_cores"] == ctx.fingerprint["fp_cores"]).all()
        assert (rows["run_id"] == ctx.run_id).all()


def test_the_jobs_files_keep_statistics_where_a_reader_filters(tmp_path: Path) -> None:
    """Min/max statistics for the run id (read_dataset filters on it) and every plain column;
    none for the dictionary-encoded text no reader filters on (their min and max cost the
    writer a decode of every row)."""
    dump = tmp_path / "history.psv"
    _history(dump, n=300)
    plan = _demo_plan(tmp_path)
    ctx = make_run_context(plan, REPO / "plans" / "demo.yaml")
    path = run_baseline(plan, ctx, sacct_file=str(dump)).written["jobs"][0]
    group = pq.ParquetFile(path).metadata.row_group(0)
    with_stats = {
        group.column(i).path_in_schema
        for i in range(group.num_columns)
        if group.column(i).is_stats_set and group.column(i).statistics.has_min_max
    }
    assert {"run_id", "submit", "end", "elapsed_s", "gpus", "job_id"} <= with_stats
    assert not {"job_name", "node_list", "user", "state_raw"} & with_stats
