"""The weekly sample summary: known answers, and the in-memory and Dask paths row for row,
Dask locally and on a real dask-jobqueue SLURMCluster whose worker is a Slurm job."""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

import dask
import numpy as np
import pandas as pd
import pytest

from bench.synth_samples import POC as SYNTH_POC
from bench.synth_samples import generate
from tasks.data.datasets import SAMPLE_GAPS, SAMPLES
from tasks.data.fingerprint import FINGERPRINT_COLUMNS
from tasks.data.runs import commit_run
from tasks.data.store import dataset_files, write_dataset
from tasks.window.sample_summary import (
    SUMMARY_DTYPES,
    weekly_gap_summary,
    weekly_sample_summary,
    weekly_sample_summary_dask,
)

POC = "t"
MON = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # Monday of 2026-W02


def _fp() -> dict:
    return {
        c: 1 if c in ("fp_cores", "fp_mem_bytes", "fp_gpu_count") else "x"
        for c in FINGERPRINT_COLUMNS
    }


def _sample(
    run_id: str,
    t0: dt.datetime,
    seconds: float,
    value: float,
    *,
    node: str = "n1",
    arm: str | None = "managed",
    workload: str | None = "train",
    device: str = "gpu",
    metric: str = "gpu_utilization",
    points: int = 1,
) -> dict:
    return {
        "poc": POC,
        "run_id": run_id,
        "node": node,
        "source": "nvml" if device == "gpu" else "procfs",
        "entity": "GPU-1" if device == "gpu" else "host",
        "device": device,
        "gpu_uuid": "GPU-1" if device == "gpu" else None,
        "gpu_index": 0 if device == "gpu" else None,
        "metric": metric,
        "unit": "percent",
        "value": value,
        "t_from": t0,
        "t_to": t0 + dt.timedelta(seconds=seconds),
        "points": points,
        "pid": None,
        "job_id": "7" if arm else None,
        "arm": arm,
        "workload": workload,
        "trial_id": None,
        "attributed_by": "env" if arm else "none",
        **_fp(),
    }


def _write(data: Path, run_id: str, rows: list[dict], spec=SAMPLES, commit: bool = True) -> None:
    write_dataset(pd.DataFrame(rows), spec, data_dir=data, poc=POC, run_id=run_id)
    if commit:
        commit_run(data, POC, run_id, stage="sample", outcome="complete")


@pytest.fixture
def known(tmp_path: Path) -> Path:
    """Samples with answers worked out by hand (see each group's comment)."""
    h = dt.timedelta(hours=1)
    rows = [
        # W02 n1 managed/train: 100 for 10 s, 0 for 30 s -> mean 25, p50 50, p95 95
        _sample("r1", MON, 10, 100.0, points=3),
        _sample("r1", MON + 10 * h, 30, 0.0, points=1),
        # W02 n1 unattributed: 10, 20, 30 for 10 s, 10 s, 20 s -> mean 22.5, p50 20, p95 29
        _sample("r1", MON + h, 10, 10.0, arm=None, workload=None, points=2),
        _sample("r1", MON + 2 * h, 10, 20.0, arm=None, workload=None, points=2),
        _sample("r1", MON + 3 * h, 20, 30.0, arm=None, workload=None, points=2),
        # W02 n1 the same time as a CPU row: its own group (device, metric)
        _sample("r1", MON, 10, 40.0, arm=None, workload=None, device="cpu", metric="cpu_util"),
        # W03 n1 managed/train: one row
        _sample("r1", MON + 7 * 24 * h, 10, 50.0, points=5),
    ]
    _write(tmp_path, "r1", rows)
    # A run that never committed: the readers' file list leaves it out.
    _write(tmp_path, "r2", [_sample("r2", MON, 10, 99.0, node="n9")], commit=False)
    gaps = [
        {
            "poc": POC,
            "run_id": "r1",
            "node": "n1",
            "source": "nvml",
            "entity": None,
            "metric": None,
            "t_from": MON + k * h,
            "t_to": MON + k * h + dt.timedelta(seconds=s),
            "gap_s": float(s),
            "reason": reason,
            "detected_by": "next_run",
            **_fp(),
        }
        for k, s, reason in ((5, 60, "sampler_down"), (6, 30, "sampler_down"), (7, 5, "nvml"))
    ]
    _write(tmp_path, "r1-gaps", gaps, spec=SAMPLE_GAPS)
    return tmp_path


def _row(df: pd.DataFrame, **keys) -> pd.Series:
    mask = np.ones(len(df), bool)
    for k, v in keys.items():
        mask &= df[k].isna().to_numpy() if v is None else (df[k] == v).fillna(False).to_numpy()
    assert mask.sum() == 1, (keys, df)
    return df[mask].iloc[0]


def test_known_answers(known: Path) -> None:
    files = dataset_files(known, POC, SAMPLES)
    df = weekly_sample_summary(files)
    assert dict(df.dtypes) == SUMMARY_DTYPES
    assert len(df) == 4 and "n9" not in set(df["node"])  # r2 is not committed
    a = _row(df, week="2026-W02", arm="managed", device="gpu")
    assert (a.n, a.points, a.covered_s) == (2, 4, 40.0)
    assert a["mean"] == pytest.approx(25.0) and a.p50 == pytest.approx(50.0)
    assert a.p95 == pytest.approx(95.0)
    assert a.first_t_from == pd.Timestamp(MON) and a.last_t_to == pd.Timestamp(
        MON + dt.timedelta(hours=10, seconds=30)
    )
    u = _row(df, week="2026-W02", arm=None, device="gpu")
    assert pd.isna(u.workload) and (u.n, u.points, u.covered_s) == (3, 6, 40.0)
    assert u["mean"] == pytest.approx(22.5) and u.p50 == pytest.approx(20.0)
    assert u.p95 == pytest.approx(29.0)
    c = _row(df, week="2026-W02", device="cpu")
    assert (c.metric, c.n, c["mean"]) == ("cpu_util", 1, 40.0)
    w3 = _row(df, week="2026-W03")
    assert (w3.n, w3.points, w3["mean"], w3.p50, w3.p95) == (1, 5, 50.0, 50.0, 50.0)
    # The week filter: only W03's partition is read.
    only = weekly_sample_summary(files, weeks=["2026-W03"])
    assert list(only["week"]) == ["2026-W03"] and only.iloc[0].n == 1
    assert weekly_sample_summary(files, weeks=["2030-W01"]).empty
    assert list(weekly_sample_summary([]).dtypes) == list(SUMMARY_DTYPES.values())


def test_known_gap_summary(known: Path) -> None:
    gaps = weekly_gap_summary(dataset_files(known, POC, SAMPLE_GAPS))
    assert gaps[["week", "node", "source", "reason", "gaps", "gap_s"]].values.tolist() == [
        ["2026-W02", "n1", "nvml", "nvml", 1, 5.0],
        ["2026-W02", "n1", "nvml", "sampler_down", 2, 90.0],
    ]


def test_known_answers_dask_local(known: Path) -> None:
    files = dataset_files(known, POC, SAMPLES)
    with dask.config.set(scheduler="synchronous"):
        got = weekly_sample_summary_dask(files)
    pd.testing.assert_frame_equal(got, weekly_sample_summary(files), rtol=1e-9)
    with dask.config.set(scheduler="synchronous"):
        only = weekly_sample_summary_dask(files, weeks=["2026-W03"])
    assert list(only["week"]) == ["2026-W03"]


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> list[str]:
    """Two days of 16 GPUs (~270 k rows, a Sunday and a Monday: two weeks), null-arm time,
    gaps."""
    data = tmp_path_factory.mktemp("synth")
    generate(data, days=2, gpus=16, seed=3, start=MON + dt.timedelta(days=6))
    files = dataset_files(data, SYNTH_POC, SAMPLES)
    assert len({Path(f).parent.name for f in files}) == 2
    return files


def _assert_same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert len(a) > 0
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-9, atol=0)
    assert a["arm"].isna().any()  # unattributed groups made it through both paths


def test_a_difference_is_caught(synth: list[str]) -> None:
    """The comparison is not vacuous: one changed number fails it."""
    ours = weekly_sample_summary(synth)
    bad = ours.copy()
    bad.loc[0, "p95"] = bad.loc[0, "p95"] * (1 + 1e-6)
    with pytest.raises(AssertionError):
        _assert_same(ours, bad)


# --- a real dask-jobqueue SLURMCluster ---------------------------------------------------------

# The cluster is the session's (tests/conftest.py: slurm_env).


def _squeue(name: str, env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-n", name, "-o", "%i"], env=env, capture_output=True, text=True
    )
    return out.stdout.split()
