"""Contract test of the CUDA driver's checkpoint API as tasks/engine/gpu/driver.py calls it,
through a stand-in libcuda (tests/fake_libcuda/fake_libcuda.c, built here with cc): no GPU
runs on these machines, so what is checked is the exact calls, their order and arguments,
and the driver's state machine; the same code runs against the real libcuda in the GPU
check (scripts/gpu-check)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tasks.engine.gpu.driver import CudaDriver, CudaDriverError, ToggleUnavailable

SOURCE = Path(__file__).parent / "fake_libcuda" / "fake_libcuda.c"


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
    from tests.conftest import REPO

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


@pytest.mark.criu
def test_contract_the_toggle_brackets_crius_dump_and_restore(
    gpu_engine, calls: Path, monkeypatch
) -> None:
    """The driver API's calls around a real CRIU dump and restore of a real process, in the
    order the issue names: lock and checkpoint before the dump, restore and unlock after it
    (the copy runs on) and after CRIU's restore; each phase timed on a `gpu_phases` event."""
    cluster, recorder, gpu = gpu_engine
    proc = cluster.start("local-a", "managed", COUNTER)
    time.sleep(0.5)
    _read(calls)
    ckpt = gpu.dump(proc)
    assert _read(calls) == [
        f"cuCheckpointProcessGetState pid={proc.pid}",
        f"cuCheckpointProcessLock pid={proc.pid} timeoutMs=10000",
        f"cuCheckpointProcessCheckpoint pid={proc.pid}",
        f"cuCheckpointProcessRestore pid={proc.pid} gpuPairsCount=0",
        f"cuCheckpointProcessUnlock pid={proc.pid}",
    ]
    dumped = recorder.events(event="gpu_phases")[-1].detail
    assert list(dumped["phases"]) == ["lock", "gpu_to_host", "criu_dump", "host_to_gpu", "unlock"]
    cluster.kill(proc)
    assert cluster.wait_gone(proc)
    monkeypatch.setenv("FAKE_LIBCUDA_NEW", "checkpointed")  # as the image was taken
    back = gpu.restore(cluster, "local-a", ckpt)
    assert _read(calls) == [
        f"cuCheckpointProcessGetState pid={back.pid}",
        f"cuCheckpointProcessRestore pid={back.pid} gpuPairsCount=0",
        f"cuCheckpointProcessUnlock pid={back.pid}",
    ]
    restored = recorder.events(event="gpu_phases")[-1].detail
    assert list(restored["phases"]) == ["criu_restore", "host_to_gpu", "unlock"]
    assert back.alive()


@pytest.mark.criu
def test_a_checkpoint_of_another_gpu_is_refused_before_criu_runs(gpu_engine, calls) -> None:
    cluster, recorder, gpu = gpu_engine
    proc = cluster.start("local-a", "managed", COUNTER)
    time.sleep(0.5)
    ckpt = gpu.dump(proc)
    cluster.kill(proc)
    assert cluster.wait_gone(proc)
    meta_path = ckpt.path / "gpu.json"
    meta = json.loads(meta_path.read_text())
    meta["capability"]["gpus"][0]["model"] = "NVIDIA A10"  # a copy of the metadata, edited
    meta_path.write_text(json.dumps(meta))
    _read(calls)
    with pytest.raises(Exception, match="restore refused before CRIU ran: GPU model or count"):
        gpu.restore(cluster, "local-a", ckpt)
    assert _read(calls) == [] and not recorder.events(event="restore_start")
    failed = recorder.events(event="restore_failed")[-1].detail
    assert failed["cause"] == "gpu_mismatch" and "1 × NVIDIA A10" in failed["error"]


@pytest.mark.criu
def test_crius_cuda_plugin_is_built_and_stands_aside_without_a_gpu(
    tmp_path: Path, criu_binary: str
) -> None:
    """scripts/install-criu builds CRIU's CUDA plugin beside CRIU; given `--libdir`, a dump
    of a CPU process loads it, and the plugin disables itself: no GPU here."""
    plugins = Path(criu_binary).parent.parent / "lib" / "criu"
    if not (plugins / "cuda_plugin.so").exists():
        source = (Path(criu_binary).parent.parent / "SOURCE").read_text()
        pytest.fail(f"no CUDA plugin beside {criu_binary}; its SOURCE says:\n{source}")
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        how = ["--shell-job", "--leave-running", "-v4", "-o", "dump.log", "-L", str(plugins)]
        argv = [criu_binary, "dump", "-t", str(sleeper.pid), "-D", str(tmp_path), *how]
        assert subprocess.run(argv, capture_output=True).returncode == 0
    finally:
        sleeper.kill()
        sleeper.wait()
    log = (tmp_path / "dump.log").read_text()
    assert 'Plugin "cuda_plugin"' in log and "CUDA plugin is disabled" in log
