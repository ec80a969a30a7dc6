"""Contract test of the GPU check (scripts/gpu-check) on this CPU machine: the same steps
and code paths as on a GPU node, with the training and serving workloads on the CPU, real
CRIU, and the driver and NVML through their stand-ins (tests/support/fake_libcuda,
tests/support/fake_nvml).
What it proves is the plumbing — every step runs, in order, and writes its rows and summary;
the GPU's own figures come only from a run on a GPU node (bench/results/gpu-check.json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.support.fake_nvml import compiled_library

REPO = Path(__file__).resolve().parents[2]
SCENARIO = """
driver 580.159.03
cuda 13000
gpus 1
gpu 0 GPU-aaaa 0
name 0 NVIDIA H200
mem 0 150754820096 1073741824
persistence 0 1
temp 0 40
"""

pytestmark = pytest.mark.criu


def test_contract_the_gpu_check_runs_every_step_and_writes_its_rows(
    tmp_path: Path, criu_binary: str
) -> None:
    libcuda = tmp_path / "libcuda.so.1"
    source = REPO / "tests" / "support" / "fake_libcuda" / "fake_libcuda.c"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(libcuda), str(source)], check=True)
    (tmp_path / "scenario").write_text(SCENARIO)
    env = {
        **os.environ,
        "CKPT_POC_PYTHON": sys.executable,
        "CKPT_POC_CRIU": criu_binary,
        "LD_LIBRARY_PATH": str(compiled_library()),
        "FAKE_NVML_SCENARIO": str(tmp_path / "scenario"),
    }
    out = tmp_path / "out"
    sizes = ["--sizes-mb", "2", "--runs", "1", "--steps", "20"]
    argv = [str(REPO / "scripts" / "gpu-check"), str(out), "--device", "cpu", "--libcuda",
            str(libcuda), *sizes]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    summary = json.loads((out / "summary.json").read_text())
    assert done.returncode == 0, (summary["failed_steps"], done.stderr[-3000:])
    assert summary["mode"] == "criu+toggle" and summary["failed_steps"] == []
    rows = pd.read_parquet(out / "gpu-check.parquet")
    assert list(dict.fromkeys(rows["step"])) == [
        "capability", "fingerprint", "nvml", "train_restore", "cold_native", "cold_restore",
        "limit_disk_read", "overhead", "uvm", "refused_restore",
    ]  # fmt: skip
    train = rows[rows["step"] == "train_restore"].iloc[0]
    assert json.loads(train["detail"])["losses_match_uninterrupted"] is True
    assert list(json.loads(train["phases"])["dump"]) == [
        "lock", "gpu_to_host", "criu_dump"  # a fault's dump: the copy does not run on
    ]  # fmt: skip
    assert list(json.loads(train["phases"])["restore"]) == ["criu_restore", "host_to_gpu", "unlock"]
    assert train["image_bytes"] > 0
    uvm = json.loads(rows[rows["step"] == "uvm"].iloc[0]["detail"])
    assert uvm["driver_error"] == "CUDA_ERROR_NOT_SUPPORTED" and uvm["state_after"] == "running"
    refused = rows[rows["step"] == "refused_restore"].iloc[0]["error"]
    assert "GPU model or count differs" in refused and "NVIDIA A10 (edited)" in refused
    assert set(rows[rows["step"] == "overhead"]["detail"].map(lambda d: json.loads(d)["arm"])) == {
        "managed", "unmanaged"
    }  # fmt: skip
    assert summary["capability"]["gpus"][0]["model"] == "NVIDIA H200"
