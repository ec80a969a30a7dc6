"""Contract test of the capability check (tasks/data/gpu_capability.py) through the
stand-in NVML (tests/support/fake_nvml) and the stand-in libcuda
(tests/support/fake_libcuda): no GPU runs here, so pynvml's real bindings call scripted
libraries; the GPU check runs the same code against the real ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tasks.data.gpu_capability import Capability, Gpu, restore_refusal
from tests.support.fake_nvml import compiled_library

REPO = Path(__file__).resolve().parents[2]
LIBCUDA_SOURCE = REPO / "tests" / "support" / "fake_libcuda" / "fake_libcuda.c"
H200 = """
driver 580.159.03
cuda 13000
gpus 1
gpu 0 GPU-aaaa 0
name 0 NVIDIA H200
mem 0 150754820096 0
persistence 0 1
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("fake-libcuda") / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(LIBCUDA_SOURCE)], check=True)
    return compiled_library(), out


def _capability(
    libs: tuple[Path, Path], tmp_path: Path, scenario: str, binary_dir: Path | None = None
) -> dict[str, Any]:
    nvml_dir, libcuda = libs
    (tmp_path / "scenario").write_text(scenario)
    code = (
        "import json, sys\n"
        "from tasks.data.gpu_capability import read_capability\n"
        "cap = read_capability(sys.argv[1], sys.argv[2] or None)\n"
        "print(json.dumps(cap.to_json()))\n"
    )
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(nvml_dir),
        "FAKE_NVML_SCENARIO": str(tmp_path / "scenario"),
        "PYTHONPATH": str(REPO),
    }
    argv = [sys.executable, "-c", code, str(libcuda), str(binary_dir or "")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_contract_an_h200_with_a_570_plus_driver_can_checkpoint(libs, tmp_path: Path) -> None:
    cap = _capability(libs, tmp_path, H200, binary_dir=tmp_path / "no-binary-here")
    assert cap["problems"] == [] and cap["toggle"] == "driver-api"
    assert (cap["driver"], cap["driver_branch"], cap["cuda"]) == ("580.159.03", 580, "13.0")
    assert cap["gpus"] == [
        {"index": 0, "uuid": "GPU-aaaa", "model": "NVIDIA H200",
         "memory_total_bytes": 150754820096, "persistence": True, "mig": False}
    ]  # fmt: skip


def test_contract_the_binary_is_preferred_where_the_node_has_it(libs, tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "cuda-checkpoint").write_text("#!/bin/sh\nexit 0\n")
    (tools / "cuda-checkpoint").chmod(0o755)
    cap = _capability(libs, tmp_path, H200, binary_dir=tools)
    assert cap["toggle"] == f"binary:{tools}/cuda-checkpoint" and cap["problems"] == []


def test_contract_what_the_toggle_cannot_do_is_a_problem_named(libs, tmp_path: Path) -> None:
    mig = _capability(libs, tmp_path, H200 + "mig 0 1\n", binary_dir=tmp_path / "none")
    assert mig["problems"] == ["GPU 0 (NVIDIA H200) is in MIG mode: not supported"]
    old = _capability(libs, tmp_path, H200.replace("580.159.03", "535.104.05"), tmp_path / "x")
    assert old["problems"] == ["driver 535 is older than 570: no checkpoint API"]
    none = _capability(libs, tmp_path, "init_error 9\n", binary_dir=tmp_path / "none")
    assert none["problems"][0].startswith("NVML unavailable: ") and none["gpus"] == []


def _here(*models: str, driver: str = "580.159.03") -> Capability:
    gpus = tuple(Gpu(i, f"GPU-{i}", m, 1 << 30, True, False) for i, m in enumerate(models))
    return Capability(driver, 580, "13.0", "driver-api", gpus, "6.18.0", False)


def test_a_restore_onto_another_gpu_or_driver_is_refused_before_criu() -> None:
    taken = _here("NVIDIA H200").to_json()
    assert restore_refusal(taken, _here("NVIDIA H200")) is None
    assert restore_refusal(taken, _here("NVIDIA A10")) == (
        "GPU model or count differs: the checkpoint's 1 × NVIDIA H200, this node's 1 × NVIDIA A10"
    )
    assert "1 × NVIDIA H200, this node's 2 × NVIDIA H200" in str(
        restore_refusal(taken, _here("NVIDIA H200", "NVIDIA H200"))
    )
    assert restore_refusal(taken, _here("NVIDIA H200", driver="590.1")) == (
        "driver differs: the checkpoint's 580.159.03, this node's 590.1"
    )


def _plan_check(plan_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    code = "import sys\nfrom tasks.data.plan import load_plan\nload_plan(sys.argv[1])\n"
    return subprocess.run(
        [sys.executable, "-c", code, str(plan_path)],
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_gpu_plan_on_a_node_without_a_gpu_or_an_old_driver_is_refused(
    libs, write_plan, tmp_path: Path
) -> None:
    """Bad input: `checkpointer.gpu` on this machine, which has no GPU (the real NVML and
    libcuda are absent), and on a stand-in node whose driver is older than the toggle."""
    path = write_plan({"checkpointer.gpu": True})
    bare = _plan_check(path, {})
    assert bare.returncode != 0
    assert "checkpointer.gpu: node(s) local-a, local-b (this machine; driver none, 0 GPU(s))" in (
        bare.stderr
    )
    nvml_dir, libcuda = libs
    (tmp_path / "scenario").write_text(H200.replace("580.159.03", "535.104.05"))
    old = _plan_check(
        path,
        {
            "LD_LIBRARY_PATH": f"{nvml_dir}:{libcuda.parent}",
            "FAKE_NVML_SCENARIO": str(tmp_path / "scenario"),
        },
    )
    assert old.returncode != 0
    assert "(this machine; driver 535.104.05, 1 GPU(s)): driver 535 is older than 570" in (
        old.stderr
    )
    (tmp_path / "scenario").write_text(H200)
    fine = _plan_check(
        path,
        {
            "LD_LIBRARY_PATH": f"{nvml_dir}:{libcuda.parent}",
            "FAKE_NVML_SCENARIO": str(tmp_path / "scenario"),
        },
    )
    assert fine.returncode == 0, fine.stderr[-2000:]
