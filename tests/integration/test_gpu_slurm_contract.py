"""Contract test of GPU checkpoints inside Slurm jobs: the job wrapper
(tasks/engine/clusters/slurm/job.py) of a `checkpointer.gpu` plan runs the capability check on
its node and toggles the copy around each CRIU dump and after its restore. On the session's
real Slurm and real CRIU, with the driver and NVML through their stand-ins (no GPU here):
what is checked is the calls, their order and the job's recorded phases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.engine.checkpointers.criu import Checkpoint
from tasks.engine.clock import read_journal
from tests.support.fake_nvml import compiled_library
from tests.support.slurm_cluster import wait_state

REPO = Path(__file__).resolve().parents[2]
SCENARIO = "driver 580.159.03\ncuda 13000\ngpus 1\ngpu 0 GPU-aaaa 0\nname 0 NVIDIA H200\n"
COUNTER = (
    "import time\nfor i in range(60):\n    print(f'step={i}', flush=True)\n    time.sleep(0.05)"
)


def _job(tmp: Path, name: str, spec: dict, env: dict[str, str]) -> str:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(spec))
    argv = ["sbatch", "--parsable", f"--job-name=ckpt-poc-gpu-{name}", "--partition=poc",
            "--nodelist=ckpt-node1", f"--chdir={REPO}", f"--output={spec['log']}",
            "--open-mode=append",  # CRIU restores an open log only in append mode
            "--export=ALL", "--wrap",
            f"{sys.executable} -m tasks.engine.clusters.slurm.job {path}"]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip().split(";")[0]


@pytest.mark.slurm
@pytest.mark.criu
def test_contract_a_gpu_plans_job_toggles_around_its_dumps_and_restore(
    slurm_env: dict[str, str], criu_binary: str, tmp_path: Path
) -> None:
    libcuda = tmp_path / "lib" / "libcuda.so.1"
    libcuda.parent.mkdir()
    source = REPO / "tests" / "support" / "fake_libcuda" / "fake_libcuda.c"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(libcuda), str(source)], check=True)
    (tmp_path / "scenario").write_text(SCENARIO)
    calls = tmp_path / "calls.log"
    env = {
        **os.environ, **slurm_env,
        "LD_LIBRARY_PATH": f"{compiled_library()}:{libcuda.parent}",
        "FAKE_NVML_SCENARIO": str(tmp_path / "scenario"),
        "FAKE_LIBCUDA_LOG": str(calls),
        "CKPT_POC_CRIU": criu_binary,
        "PYTHONPATH": str(REPO),
    }  # fmt: skip
    spec = {
        "mode": "run", "trial_id": "gpu", "arm": "managed", "node": "ckpt-node1",
        "argv": ["python3", "-u", "-c", COUNTER], "events": str(tmp_path / "events.jsonl"),
        "log": str(tmp_path / "workload.log"), "ckpt_root": str(tmp_path / "ckpt"),
        "keep": 1, "interval_s": 1.0, "checkpoint": True, "gpu": True,
    }  # fmt: skip
    job = _job(tmp_path, "run", spec, env)
    wait_state(job, {"COMPLETED", "FAILED"}, 120, env=slurm_env)
    events = read_journal(tmp_path / "events.jsonl")
    dumps = [e.detail for e in events if e.event == "gpu_phases" and e.detail["step"] == "dump"]
    assert dumps, [e.event for e in events]
    # The job's journal keeps a phase's name and seconds (its order is the calls' below).
    assert set(dumps[0]["phases"]) == {"lock", "gpu_to_host", "criu_dump", "host_to_gpu", "unlock"}
    lines = calls.read_text().splitlines()
    order = [line.split()[0] for line in lines if line.startswith("cuCheckpointProcess")]
    assert order[:5] == [
        "cuCheckpointProcessGetState", "cuCheckpointProcessLock",
        "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
        "cuCheckpointProcessUnlock",
    ]  # fmt: skip
    point = Checkpoint.load(sorted((tmp_path / "ckpt").glob("ckpt-*"))[-1])
    assert point is not None
    calls.write_text("")
    restore = {**spec, "mode": "restore", "restore_from": str(point.path),
               "events": str(tmp_path / "events2.jsonl")}  # fmt: skip
    job = _job(tmp_path, "restore", restore, {**env, "FAKE_LIBCUDA_NEW": "checkpointed"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        back = (
            read_journal(tmp_path / "events2.jsonl")
            if (tmp_path / "events2.jsonl").exists()
            else []
        )
        if any(e.event == "gpu_phases" and e.detail["step"] == "restore" for e in back):
            break
        time.sleep(0.2)
    subprocess.run(["scancel", job], env=slurm_env, check=False)
    restored = [e.detail for e in back if e.event == "gpu_phases" and e.detail["step"] == "restore"]
    assert restored and set(restored[0]["phases"]) == {"criu_restore", "host_to_gpu", "unlock"}
    after = [
        line.split()[0]
        for line in calls.read_text().splitlines()
        if line.startswith("cuCheckpointProcess")
    ]
    assert after[:3] == [  # the restored copy back onto its GPU, before any further dump
        "cuCheckpointProcessGetState", "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"
    ], after  # fmt: skip
