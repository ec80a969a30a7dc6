"""Contract test of the CUDA driver's checkpoint API as tasks/engine/gpu/driver.py calls it,
through a stand-in libcuda (tests/support/fake_libcuda/fake_libcuda.c, built here with cc): no GPU
runs on these machines, so what is checked is the exact calls, their order and arguments,
and the driver's state machine; the same code runs against the real libcuda in the GPU
check (scripts/gpu-check)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tasks.engine.gpu.driver import CudaDriver, CudaDriverError, ToggleUnavailable

SOURCE = Path(__file__).resolve().parents[1] / "support" / "fake_libcuda" / "fake_libcuda.c"


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fake-libcuda") / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-Wall", "-o", str(out), str(SOURCE)], check=True)
    return out


@pytest.fixture
def calls(tmp_path: Path, monkeypatch) -> Path:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_LIBCUDA_LOG", str(log))
    return log


def _read(log: Path) -> list[str]:
    lines = log.read_text().splitlines()
    log.write_text("")
    return lines


def test_contract_toggle_out_and_in_call_the_api_in_order(fake_libcuda: Path, calls: Path) -> None:
    driver = CudaDriver(str(fake_libcuda))
    assert driver.driver_version() == 13000
    assert _read(calls) == ["cuInit flags=0", "cuDriverGetVersion"]
    out = driver.toggle_out(4242, lock_timeout_ms=5000)
    assert list(out.seconds) == ["lock", "gpu_to_host"]
    assert driver.state(4242) == "checkpointed"
    back = driver.toggle_in(4242)
    assert list(back.seconds) == ["host_to_gpu", "unlock"]
    assert driver.state(4242) == "running"
    assert _read(calls) == [
        "cuCheckpointProcessLock pid=4242 timeoutMs=5000",
        "cuCheckpointProcessCheckpoint pid=4242",
        "cuCheckpointProcessGetState pid=4242",
        "cuCheckpointProcessRestore pid=4242 gpuPairsCount=0",
        "cuCheckpointProcessUnlock pid=4242",
        "cuCheckpointProcessGetState pid=4242",
    ]


def test_contract_a_failed_checkpoint_is_unlocked_and_named_by_the_driver(
    fake_libcuda: Path, calls: Path, monkeypatch
) -> None:
    """A process using what the driver cannot save (managed memory): the driver's own error
    is the result, and the process is left running, never locked."""
    monkeypatch.setenv("FAKE_LIBCUDA_UNSUPPORTED", "777")
    driver = CudaDriver(str(fake_libcuda))
    with pytest.raises(CudaDriverError) as failed:
        driver.toggle_out(777)
    assert failed.value.name == "CUDA_ERROR_NOT_SUPPORTED" and failed.value.code == 801
    assert str(failed.value) == (
        "cuCheckpointProcessCheckpoint: CUDA_ERROR_NOT_SUPPORTED (801): operation not supported"
    )
    assert driver.state(777) == "running"
    assert _read(calls)[1:] == [
        "cuCheckpointProcessLock pid=777 timeoutMs=10000",
        "cuCheckpointProcessCheckpoint pid=777",
        "cuCheckpointProcessGetState pid=777",
        "cuCheckpointProcessUnlock pid=777",
        "cuCheckpointProcessGetState pid=777",
    ]


def test_contract_a_process_left_checkpointed_is_brought_back(fake_libcuda: Path, calls) -> None:
    driver = CudaDriver(str(fake_libcuda))
    driver.toggle_out(55)
    assert driver.recover(55) == "unlocked" and driver.state(55) == "running"
    with pytest.raises(CudaDriverError, match="CUDA_ERROR_ILLEGAL_STATE"):
        driver.unlock(55)  # out of order: the driver says so
    assert driver.recover(55) == "running"


def test_a_driver_without_the_toggle_is_named(tmp_path: Path) -> None:
    old = tmp_path / "libold.so"
    src = tmp_path / "old.c"
    src.write_text("int cuInit(unsigned int f) { return 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(old), str(src)], check=True)
    with pytest.raises(ToggleUnavailable, match="older than 570"):
        CudaDriver(str(old))
    with pytest.raises(ToggleUnavailable, match="no CUDA driver library"):
        CudaDriver(str(tmp_path / "absent.so"))
    assert os.path.exists(old)


# --- around a real CRIU dump and restore ---------------------------------------------------


COUNTER = [
    "python3", "-u", "-c",
    "import time\nfor i in range(10**6):\n    print(f'step={i}', flush=True)\n    time.sleep(0.05)",
]  # fmt: skip


@pytest.fixture
def gpu_engine(tmp_path: Path, criu_binary: str, fake_libcuda: Path, calls: Path):
    from tasks.data.gpu_capability import Capability, Gpu
    from tasks.data.plan import load_plan
    from tasks.data.runctx import make_run_context
    from tasks.engine.checkpointers.criu import CriuCheckpointer
    from tasks.engine.checkpointers.criu_gpu import GpuCriuCheckpointer
    from tasks.engine.clock import EventRecorder
    from tasks.engine.clusters.local.cluster import LocalCluster
    from tests.support.common import REPO

    plan = load_plan(REPO / "plans" / "demo.yaml").model_copy(
        update={"data_dir": str(tmp_path / "data")}
    )
    recorder = EventRecorder(make_run_context(plan, REPO / "plans" / "demo.yaml"))
    cluster = LocalCluster(nodes=["local-a"], run_dir=tmp_path / "run", workdir=REPO)
    h200 = (Gpu(0, "GPU-aaaa", "NVIDIA H200", 150754820096, True, False),)
    here = Capability("580.159.03", 580, "13.0", "driver-api", h200, "6.18.0", False)
    criu = CriuCheckpointer(tmp_path / "ckpt", keep=2, recorder=recorder, trial_id="g",
                            binary=criu_binary)  # fmt: skip
    gpu = GpuCriuCheckpointer(criu, here, CudaDriver(str(fake_libcuda)))
    yield cluster, recorder, gpu
    assert cluster.stop_all() == []
    cluster.close()
