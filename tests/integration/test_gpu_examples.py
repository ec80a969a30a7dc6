"""The GPU workloads (examples/gpu) at their smallest sizes on the CPU, as CI runs them: the
training job resumed from its own checkpoint, and dumped and restored by real CRIU, continues
with the losses of an uninterrupted run; the serving engine reads the weights its prepare
step wrote and answers the same after a restart. Needs the `gpu` dependency group (a CPU
run of the PyPI PyTorch: scripts/test installs it)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.common import REPO

try:
    import torch  # noqa: F401
except ImportError as exc:  # a failure, not a skip: scripts/test installs the group
    raise ImportError("PyTorch is missing: `uv sync --group gpu` (scripts/test does)") from exc

SMALL = ["--layers", "1", "--d-model", "32", "--heads", "2", "--context", "16", "--batch", "4",
         "--vocab", "64", "--device", "cpu"]  # fmt: skip
STEP = re.compile(r"^step=(\d+) loss=(\S+)$", re.M)


def _train(*args: str, timeout: float = 120) -> dict[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "examples.gpu.train_lm", *SMALL, *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, check=True,
    )  # fmt: skip
    return {int(s): loss for s, loss in STEP.findall(done.stdout)}


@pytest.fixture(scope="module")
def whole() -> dict[int, str]:
    """An uninterrupted run's losses, step by step (one run for the module's tests)."""
    return _train("--steps", "40")


def test_training_resumed_from_its_own_checkpoint_has_an_uninterrupted_runs_losses(
    tmp_path: Path, whole: dict[int, str]
) -> None:
    assert len(whole) == 40 and float(whole[40]) < float(whole[1])
    ckpt = tmp_path / "lm.pt"
    first = _train("--steps", "20", "--ckpt", str(ckpt), "--ckpt-every", "10")
    assert first == {s: whole[s] for s in range(1, 21)}
    resumed = _train("--steps", "30", "--ckpt", str(ckpt))  # from step 20's checkpoint
    assert resumed == {s: whole[s] for s in range(21, 31)}


@pytest.mark.criu
def test_training_dumped_and_restored_by_criu_continues_its_losses(
    tmp_path: Path, criu_binary: str, whole: dict[int, str]
) -> None:
    from tasks.data.plan import load_plan
    from tasks.data.runctx import make_run_context
    from tasks.engine.checkpointers.criu import CriuCheckpointer
    from tasks.engine.clock import EventRecorder
    from tasks.engine.clusters.local.cluster import LocalCluster

    plan = load_plan(REPO / "plans" / "demo.yaml").model_copy(
        update={"data_dir": str(tmp_path / "data")}
    )
    recorder = EventRecorder(make_run_context(plan, REPO / "plans" / "demo.yaml"))
    cluster = LocalCluster(nodes=["local-a"], run_dir=tmp_path / "run", workdir=REPO)
    argv = [sys.executable, "-u", "-m", "examples.gpu.train_lm", *SMALL, "--steps", "40",
            "--step-sleep", "0.05"]  # fmt: skip
    try:
        proc = cluster.start("local-a", "managed", argv)
        deadline = time.monotonic() + 120
        while len(STEP.findall(proc.log.read_text())) < 15 and time.monotonic() < deadline:
            time.sleep(0.1)
        ckpt = CriuCheckpointer(tmp_path / "ckpt", keep=1, recorder=recorder, trial_id="lm",
                                binary=criu_binary)  # fmt: skip
        dumped = ckpt.dump(proc, leave_running=False)  # a fault's dump: the copy ends
        assert cluster.wait_gone(proc)
        restored = ckpt.restore(cluster, "local-a", dumped)
        while restored.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        text = proc.log.read_text()
    finally:
        cluster.stop_all()
        cluster.close()
    losses = [(int(s), loss) for s, loss in STEP.findall(text)]
    steps = [s for s, _ in losses]
    assert steps == sorted(set(steps)) and steps[-1] == 40, steps  # no step twice, none lost
    assert dict(losses) == whole


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _serve(weights: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.gpu.serve_lm", "--weights", str(weights),
         "--port", str(port), "--device", "cpu"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if _get(f"http://127.0.0.1:{port}/ready")["ready"]:
                return proc
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("serve_lm never became ready")


def test_the_serving_engine_reads_its_prepared_weights_and_answers_the_same(
    tmp_path: Path,
) -> None:
    from tasks.engine.ports import free_port

    weights = tmp_path / "weights"
    prepare = [sys.executable, "-m", "examples.gpu.weights_lm", str(weights), "--mb", "2"]
    written = json.loads(subprocess.run(prepare, cwd=REPO, capture_output=True, text=True,
                                        check=True).stdout)  # fmt: skip
    assert written["status"] == "written" and written["architecture"] == "gpt2-decoder"
    again = json.loads(subprocess.run(prepare, cwd=REPO, capture_output=True, text=True,
                                      check=True).stdout)  # fmt: skip
    assert again["status"] == "up to date"
    answers = []
    for _ in range(2):  # a restart reads the same weights: the same greedy answer
        port = free_port()
        proc = _serve(weights, port)
        try:
            answers.append(_get(f"http://127.0.0.1:{port}/generate?prompt=3,4,5&tokens=6"))
            with pytest.raises(urllib.error.HTTPError):
                _get(f"http://127.0.0.1:{port}/generate?prompt=99999&tokens=6")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
    assert answers[0] == answers[1] and len(answers[0]["tokens"]) == 6
