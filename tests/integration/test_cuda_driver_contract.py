"""Contract test of the CUDA driver's checkpoint API as tasks/engine/gpu/driver.py calls it,
through a stand-in libcuda (tests/support/fake_libcuda/fake_libcuda.c, built here with cc): no GPU
runs on these machines, so what is checked is the exact calls, their order and arguments,
and the driver's state machine; the same code runs against the real libcuda in the GPU
check (scripts/gpu-check)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.unit.test_cuda_driver_contract import (  # noqa: F401
    COUNTER,
    SOURCE,
    _read,
    calls,
    fake_libcuda,
    gpu_engine,
)


@pytest.mark.criu
def test_contract_the_toggle_brackets_crius_dump_and_restore(
    gpu_engine, calls: Path, monkeypatch
) -> None:
    """The driver API's calls around a real CRIU dump and restore of a real process, in the
    order they must come in: lock and checkpoint before the dump, restore and unlock after it
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
