"""Contract tests of the NVML sampler (tasks.window.sampling.nvml) against a stand-in NVML library.

tests/support/fake_nvml/fake_nvml.c is compiled into a libnvidia-ml.so.1 that scripts GPUs, driver
sample buffers (honouring lastSeenTimeStamp and answering NOT_FOUND when nothing is new, as
the driver does), processes, GPM and injected errors. pynvml's real ctypes layer runs against
it in a subprocess per scenario, so these tests exercise the real binding code: symbol names,
struct layouts, the two-call size protocols and error codes. They are not a GPU test: values
and timing are the scenario's, not a driver's.
"""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tasks.data.datasets import SAMPLE_GAPS, SAMPLES
from tasks.data.fingerprint import FINGERPRINT_COLUMNS
from tasks.data.store import conform
from tests.support.fake_nvml import compiled_library, run_sampler

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc for the fake")

# Ordinal 0 is minor 1 and ordinal 1 is minor 0: the NVML order differs from /dev/nvidiaN.
BASE = """
gpus 2
gpu 0 GPU-bbbb 1
gpu 1 GPU-aaaa 0
mem 0 80000000000 40000000000
mem 1 80000000000 1000
temp 0 50
temp 1 61
# driver buffers: sampling type 1 = GPU utilization, 0 = power (mW), 5 = SM clock (MHz)
batch 0 1 1 100:10 200:20
batch 0 1 1 300:30 400:50 500:100
batch 0 1 1 600:0
batch 0 0 1 100:100000
batch 0 0 1 300:200000 400:300000
batch 0 0 1 600:250000
batch 0 5 1 100:1000
batch 0 5 1 300:1500
batch 0 5 1 600:1600
batch 1 1 1 100:5
batch 1 1 1 300:15 400:25
batch 1 1 1 600:35
batch 1 0 1 100:50000
batch 1 5 1 100:900
proc 0 4242 12345
pbatch 0 4242:100:50
pbatch 0 4242:300:70 4242:400:90
"""

JOB7 = {"job_id": "7", "arm": "managed", "workload": "w", "trial_id": "t1", "attributed_by": "env"}
JOB_A = {"job_id": "A", "arm": "unmanaged", "attributed_by": "gres"}


@pytest.fixture(scope="module", autouse=True)
def _library() -> None:
    compiled_library()  # build once, before the first scenario


def _rows(out: dict[str, Any], read: int, **match: Any) -> list[dict[str, Any]]:
    return [r for r in out["reads"][read]["rows"] if all(r[k] == v for k, v in match.items())]


def _gaps(out: dict[str, Any], read: int, **match: Any) -> list[dict[str, Any]]:
    return [r for r in out["reads"][read]["gaps"] if all(r[k] == v for k, v in match.items())]


def _one(rows: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(rows) == 1, rows
    return rows[0]


def test_first_read_primes_then_mean_of_the_driver_buffer(tmp_path: Path) -> None:
    out = run_sampler(BASE, tmp_path, pids={4242: JOB7})
    assert out["reads"][0]["rows"] == []  # the first buffer covers an unknown past
    util = _one(_rows(out, 1, entity="GPU-bbbb", metric="gpu_utilization"))
    # mean of 30, 50, 100 (not the last value 100, not the primed 10, 20)
    assert util["value"] == pytest.approx(60.0)
    assert util["points"] == 3 and util["unit"] == "percent" and util["device"] == "gpu"
    assert util["t_from"] < util["t_to"] and util["t_to"].utcoffset().total_seconds() == 0
    power = _one(_rows(out, 1, entity="GPU-bbbb", metric="power_w"))
    assert power["value"] == pytest.approx(250.0) and power["unit"] == "watts"
    assert power["points"] == 2
    clock = _one(_rows(out, 1, entity="GPU-bbbb", metric="sm_clock_mhz"))
    assert clock["value"] == pytest.approx(1500.0) and clock["unit"] == "mhz"
    mem = _one(_rows(out, 1, entity="GPU-bbbb", metric="memory_used_bytes"))
    assert mem["value"] == 40e9 and mem["unit"] == "bytes" and mem["t_from"] == mem["t_to"]
    assert _one(_rows(out, 1, entity="GPU-aaaa", metric="temperature_c"))["value"] == 61


def test_last_seen_timestamp_is_honoured_across_reads(tmp_path: Path) -> None:
    out = run_sampler(BASE, tmp_path, pids={4242: JOB7})
    # Read 2 sees only the sample at ts 600; a sampler passing 0 would count 6 samples.
    util = _one(_rows(out, 2, entity="GPU-bbbb", metric="gpu_utilization"))
    assert (util["value"], util["points"]) == (0.0, 1)
    other = _one(_rows(out, 2, entity="GPU-aaaa", metric="gpu_utilization"))
    assert (other["value"], other["points"]) == (35.0, 1)
    # Intervals chain: read 2 starts where read 1 ended.
    assert (
        util["t_from"] == _one(_rows(out, 1, entity="GPU-bbbb", metric="gpu_utilization"))["t_to"]
    )
    # Per process: read 1 averages 70 and 90 (the primed 50 is not counted again) ...
    proc = _one(_rows(out, 1, metric="process_sm_utilization"))
    assert (proc["value"], proc["points"]) == (80.0, 2)
    # ... and read 2, with nothing new (NVML_ERROR_NOT_FOUND), has no row and no gap.
    assert _rows(out, 2, metric="process_sm_utilization") == []
    assert _gaps(out, 2, metric="process_sm_utilization") == []
    # A buffer with nothing new is a gap, with the reason.
    gap = _one(_gaps(out, 2, entity="GPU-aaaa", metric="power_w"))
    assert "no driver samples" in gap["reason"] and "NOT_FOUND" in gap["reason"]


def test_gpus_are_keyed_by_uuid_and_owned_by_minor(tmp_path: Path) -> None:
    out = run_sampler(BASE, tmp_path, pids={4242: JOB7}, minors={0: JOB_A})
    assert out["uuids"] == ["GPU-bbbb", "GPU-aaaa"]
    # GPU-aaaa is ordinal 1, minor 0: the job holding minor 0 (GRES) owns it, no process needed.
    a = _rows(out, 1, gpu_uuid="GPU-aaaa")
    assert a and all(r["entity"] == "GPU-aaaa" and r["gpu_index"] == 1 for r in a)
    assert {(r["job_id"], r["attributed_by"]) for r in a} == {("A", "gres")}
    # GPU-bbbb (minor 1) has no owner: its one PoC process labels it.
    b = _rows(out, 1, entity="GPU-bbbb")
    assert b and all(r["gpu_index"] == 0 for r in b)
    assert {(r["job_id"], r["attributed_by"]) for r in b} == {("7", "env")}


def test_process_rows_are_attributed_by_the_attributor(tmp_path: Path) -> None:
    out = run_sampler(BASE, tmp_path, pids={4242: JOB7})
    proc = _one(_rows(out, 1, metric="process_sm_utilization"))
    assert proc["entity"] == "GPU-bbbb/pid:4242" and proc["pid"] == 4242
    assert proc["gpu_uuid"] == "GPU-bbbb" and proc["unit"] == "percent"
    assert (proc["job_id"], proc["arm"], proc["workload"], proc["trial_id"]) == (
        "7",
        "managed",
        "w",
        "t1",
    )
    mem = _one(_rows(out, 1, metric="process_memory_used_bytes"))
    assert mem["value"] == 12345 and mem["attributed_by"] == "env"
    # Without an attribution the rows stay, labelled 'none'.
    bare = run_sampler(BASE, tmp_path)
    assert _one(_rows(bare, 1, metric="process_sm_utilization"))["attributed_by"] == "none"
    assert {r["attributed_by"] for r in _rows(bare, 1, entity="GPU-bbbb")} == {"none"}


def test_gpu_lost_mid_run_is_a_gap_and_the_other_gpu_continues(tmp_path: Path) -> None:
    # GPU 1 makes 2 calls at start-up, 9 in the priming read, 8 in read 1: call 15 is in read 1.
    out = run_sampler(BASE + "lost 1 15\n", tmp_path, reads=4, pids={4242: JOB7})
    assert _gaps(out, 0, entity="GPU-aaaa", metric=None) == []
    lost_reads = [
        i
        for i in range(4)
        if any("NVML_ERROR_GPU_IS_LOST" in g["reason"] for g in _gaps(out, i, entity="GPU-aaaa"))
    ]
    assert lost_reads == [1, 2, 3]  # every interval after it is a gap, never silence
    for i in (1, 2, 3):
        gap = _one(_gaps(out, i, entity="GPU-aaaa", metric=None))
        assert gap["gap_s"] > 0 and gap["detected_by"] == "sampler"
    for i in (2, 3):
        assert _rows(out, i, gpu_uuid="GPU-aaaa") == []
    for i in (1, 2):
        assert _rows(out, i, entity="GPU-bbbb", metric="gpu_utilization")


def test_unsupported_and_failing_metrics_are_gap_rows(tmp_path: Path) -> None:
    scenario = (
        BASE
        + "error 0 nvmlDeviceGetTemperature 3\n"  # NOT_SUPPORTED: one gap for the lifetime
        + "error 0 nvmlDeviceGetMemoryInfo 999\n"  # UNKNOWN: a gap every interval
    )
    out = run_sampler(scenario, tmp_path, reads=4)
    temp_gaps = [
        g for i in range(4) for g in _gaps(out, i, entity="GPU-bbbb", metric="temperature_c")
    ]
    assert len(temp_gaps) == 1 and "NVML_ERROR_NOT_SUPPORTED" in temp_gaps[0]["reason"]
    for i in (1, 2, 3):
        assert (
            "NVML_ERROR_UNKNOWN"
            in _one(_gaps(out, i, entity="GPU-bbbb", metric="memory_used_bytes"))["reason"]
        )
        assert _rows(out, i, entity="GPU-bbbb", metric="temperature_c") == []
        assert _rows(out, i, entity="GPU-bbbb", metric="power_w_instant") == []
    for i in (1, 2):  # the rest goes on (the scripted buffer ends after read 2)
        assert _rows(out, i, entity="GPU-bbbb", metric="gpu_utilization")


def test_no_driver_buffer_falls_back_to_a_labelled_instant_reading(tmp_path: Path) -> None:
    scenario = "gpus 1\ngpu 0 GPU-cccc 0\nmem 0 10 1\nutil 0 77 3\npower 0 150000\nclock 0 1400\n"
    out = run_sampler(scenario, tmp_path)
    assert _rows(out, 1, metric="gpu_utilization") == []  # never an instant duty cycle as mean
    util = _one(_rows(out, 1, metric="gpu_utilization_instant"))
    assert (util["value"], util["points"]) == (77.0, 1) and util["t_from"] == util["t_to"]
    assert _one(_rows(out, 1, metric="power_w_instant"))["value"] == pytest.approx(150.0)
    assert _one(_rows(out, 1, metric="sm_clock_mhz_instant"))["value"] == 1400


def test_gpm_unsupported_no_rows_one_gap_per_metric(tmp_path: Path) -> None:
    out = run_sampler(BASE + "gpm 1 0\n", tmp_path, reads=3)
    for i in range(3):
        assert _rows(out, i, metric="sm_activity") == []
        assert _rows(out, i, metric="sm_occupancy") == []
    gaps = [
        (g["entity"], g["metric"])
        for i in range(3)
        for g in out["reads"][i]["gaps"]
        if g["metric"] in ("sm_activity", "sm_occupancy")
    ]
    assert sorted(gaps) == sorted(
        (u, m) for u in ("GPU-aaaa", "GPU-bbbb") for m in ("sm_activity", "sm_occupancy")
    )


def test_gpm_supported_gives_sm_activity_between_reads(tmp_path: Path) -> None:
    scenario = BASE + "gpm 0 1\ngpmval 0 2 40 60\ngpmval 0 3 10 20\n"
    out = run_sampler(scenario, tmp_path, reads=3, pids={4242: JOB7})
    assert _rows(out, 0, metric="sm_activity") == []
    for read, activity, occupancy in ((1, 40.0, 10.0), (2, 60.0, 20.0)):
        act = _one(_rows(out, read, entity="GPU-bbbb", metric="sm_activity"))
        assert act["value"] == activity and act["unit"] == "percent"
        assert (act["t_to"] - act["t_from"]).total_seconds() > 0.1
        occ = _one(_rows(out, read, entity="GPU-bbbb", metric="sm_occupancy"))
        assert occ["value"] == occupancy
    # GPU-aaaa has no GPM: one gap per metric, not a crash.
    assert len(_gaps(out, 0, entity="GPU-aaaa", metric="sm_activity")) == 1
    # GPM samples closer than 100 ms are not differenced.
    close = run_sampler(scenario, tmp_path, reads=2, sleep_s=0.0)
    assert _rows(close, 1, metric="sm_activity") == []


def test_nvml_init_failure_is_a_clear_error(tmp_path: Path) -> None:
    out = run_sampler("init_error 9\n", tmp_path)
    assert out["error"] == "NvmlUnavailable"
    assert "nvmlInit failed" in out["message"]
    assert "NVML_ERROR_DRIVER_NOT_LOADED" in out["message"]


def test_no_nvml_library_is_a_clear_error(tmp_path: Path) -> None:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("a real libnvidia-ml.so.1 is installed here")
    empty = tmp_path / "empty"
    empty.mkdir()
    out = run_sampler("gpus 0\n", tmp_path, lib_dir=empty)
    assert out["error"] == "NvmlUnavailable"
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in out["message"]


def test_rows_conform_to_the_samples_and_gaps_schemas(tmp_path: Path) -> None:
    scenario = BASE + "gpm 0 1\ngpmval 0 2 40\ngpmval 0 3 10\nerror 1 nvmlDeviceGetMemoryInfo 999\n"
    out = run_sampler(scenario, tmp_path, pids={4242: JOB7}, minors={0: JOB_A})
    run_cols: dict[str, Any] = {"poc": "p", "run_id": "r1"}
    for name in FINGERPRINT_COLUMNS:
        run_cols[name] = 1 if name in ("fp_cores", "fp_mem_bytes", "fp_gpu_count") else "x"
    rows = [{**r, **run_cols} for read in out["reads"] for r in read["rows"]]
    gaps = [{**g, **run_cols} for read in out["reads"] for g in read["gaps"]]
    table = conform(pd.DataFrame(rows), SAMPLES)
    assert table.num_rows == len(rows) > 0
    assert conform(pd.DataFrame(gaps), SAMPLE_GAPS).num_rows == len(gaps) > 0
    # The dataset key is unique: per-process rows do not collide with their GPU's rows.
    key = [tuple(r[k] for k in SAMPLES.key) for r in rows]
    assert len(set(key)) == len(key)
