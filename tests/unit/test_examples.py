"""The shipped example workloads, run as real subprocesses the way the harness runs them."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
STEPS = 60

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None,
    reason="the examples need scikit-learn (its bundled digits data set)",
)

# No proxy for loopback requests, whatever the environment says.
_http_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _start(args: list[str], log: Path) -> subprocess.Popen:
    """Start ``python -m ARGS`` in its own session, stdout+stderr appended to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _wait_for_line(proc: subprocess.Popen, log: Path, pattern: str, timeout: float = 60):
    rx = re.compile(pattern, re.M)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = rx.search(log.read_text())
        if m:
            return m
        if proc.poll() is not None:
            pytest.fail(f"exited with {proc.returncode} before /{pattern}/:\n{log.read_text()}")
        time.sleep(0.02)
    pytest.fail(f"no /{pattern}/ within {timeout}s:\n{log.read_text()}")


def _losses(text: str) -> dict[int, str]:
    """step -> the exact loss text, asserting each step is printed at most once."""
    out: dict[int, str] = {}
    for m in re.finditer(r"^step=(\d+) loss=(\S+)$", text, re.M):
        step = int(m.group(1))
        assert step not in out, f"step {step} printed twice"
        out[step] = m.group(2)
    return out


def _train_args(*extra: str) -> list[str]:
    return ["examples.train_digits", "--steps", str(STEPS), "--step-sleep", "0", *extra]


@pytest.fixture(scope="module")
def reference() -> dict[int, str]:
    """The losses of an uninterrupted run."""
    done = _run(_train_args())
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"start steps={STEPS} hidden=64 seed=0 state_mb=0"
    assert lines[-1] == f"done step={STEPS}"
    losses = _losses(done.stdout)
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


def test_training_learns_and_is_deterministic(reference, tmp_path):
    values = [float(v) for v in reference.values()]
    assert all(np.isfinite(values))
    assert np.mean(values[-10:]) < 0.5 * np.mean(values[:10])  # it really learns

    # Same seed, with ballast and checkpoints on: the very same losses, bit for bit.
    again = _run(
        _train_args("--state-mb", "8", "--checkpoint-every", "7", "--checkpoint-dir", str(tmp_path))
    )
    assert again.returncode == 0, again.stderr
    assert _losses(again.stdout) == reference
    assert re.search(r"^eval accuracy=0\.\d+$", again.stdout, re.M)

    other = _run(_train_args("--seed", "1"))
    assert other.returncode == 0, other.stderr
    assert _losses(other.stdout) != reference


def test_killed_run_resumes_bit_exact_from_its_checkpoint(reference, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    log = tmp_path / "train.log"
    # The same command for the first start and the restart, as a harness would use.
    args = [
        "examples.train_digits",
        "--steps",
        str(STEPS),
        "--step-sleep",
        "0.05",
        "--checkpoint-every",
        "10",
        "--checkpoint-dir",
        str(ckpt_dir),
        "--resume",
    ]
    proc = _start(args, log)
    try:
        _wait_for_line(proc, log, r"^checkpoint step=20$")
        _wait_for_line(proc, log, r"^step=24 ")  # die a few steps past the checkpoint
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        _kill(proc)
    first = log.read_text()
    assert proc.returncode == -signal.SIGKILL
    assert "done" not in first
    assert "resumed" not in first  # there was no checkpoint at the first start
    killed = _losses(first)
    assert killed == {s: reference[s] for s in killed}
    assert list(ckpt_dir.iterdir()) == [ckpt_dir / "ckpt.npz"]  # temp file renamed away
    with np.load(ckpt_dir / "ckpt.npz") as npz:
        k = int(npz["step"])
    assert 20 <= k < STEPS
    assert max(killed) > k  # those steps are lost and must be redone identically

    resumed = _run([*args[:4], "0", *args[5:]])  # no sleeping this time
    assert resumed.returncode == 0, resumed.stderr
    lines = resumed.stdout.splitlines()
    assert lines[1] == f"resumed step={k}"
    assert lines[2].startswith(f"step={k + 1} ")
    assert _losses(resumed.stdout) == {s: reference[s] for s in range(k + 1, STEPS + 1)}
    assert lines[-1] == f"done step={STEPS}"


def test_resume_refuses_a_checkpoint_of_another_configuration(tmp_path):
    args = ["--steps", "3", "--checkpoint-every", "3", "--checkpoint-dir", str(tmp_path)]
    first = _run(_train_args(*args))
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "ckpt.npz").is_file()
    other = _run(_train_args(*args, "--resume", "--hidden", "16"))
    assert other.returncode == 2
    assert "cannot resume" in other.stderr


def _http(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with _http_opener.open(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def _rss_bytes(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
    return int(m.group(1)) * 1024 if m else None


INIT_STEPS = 200


@pytest.fixture
def server(tmp_path) -> Iterator[tuple[subprocess.Popen, Path, str]]:
    log = tmp_path / "serve.log"
    args = [
        "examples.serve_digits",
        "--port",
        "0",
        "--init-steps",
        str(INIT_STEPS),
        "--init-step-sleep",
        "0.005",
        "--state-mb",
        "64",
    ]
    proc = _start(args, log)
    try:
        port = _wait_for_line(proc, log, r"^listening host=127\.0\.0\.1 port=(\d+)$").group(1)
        yield proc, log, f"http://127.0.0.1:{port}"
    finally:
        _kill(proc)


def test_server_gets_ready_and_predicts_deterministically(server):
    from examples.train_digits import Config, DigitsMLP, load_digits_arrays, split_indices

    proc, log, base = server
    statuses = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        code, body = _http(base + "/ready")
        statuses.append(code)
        if code == 200:
            break
        assert code == 503 and body["ready"] is False
        # 503 while initialising, unless it became ready between the two requests.
        assert _http(base + "/predict?i=0")[0] == 503 or _http(base + "/ready")[0] == 200
        time.sleep(0.05)
    assert statuses[-1] == 200, f"not ready in time:\n{log.read_text()}"
    assert statuses[0] == 503  # it listens first and answers while initialising
    assert re.search(r"^warmup accuracy=0\.\d+ s=\d+\.\d+\nready$", log.read_text(), re.M)
    rss = _rss_bytes(proc.pid)
    assert rss is None or rss > 64 << 20  # the ballast is resident

    # The same model, built here with the same seed: identical answers, bit for bit.
    X, y = load_digits_arrays()
    model = DigitsMLP(Config(seed=0), X, y, split_indices(len(y))[0])
    for _ in range(INIT_STEPS):
        model.train_step()
    correct = 0
    for i in (0, 7, 500, 1796):
        code, got = _http(f"{base}/predict?i={i}")
        assert code == 200
        assert _http(f"{base}/predict?i={i}") == (200, got)
        probs = model.predict_proba(X[i])[0]
        assert got == {
            "i": i,
            "label": int(y[i]),
            "pred": int(probs.argmax()),
            "probs": [float(p) for p in probs],
        }
        assert _http(base + "/predict", {"pixels": [int(v) for v in X[i] * 16]}) == (
            200,
            {"pred": got["pred"], "probs": got["probs"]},
        )
        correct += got["pred"] == got["label"]
    assert correct >= 3

    assert _http(base + "/predict?i=1797")[0] == 400
    assert _http(base + "/predict", {"pixels": [1, 2, 3]})[0] == 400
    assert _http(base + "/nope")[0] == 404
    code, health = _http(base + "/healthz")
    assert code == 200 and health["ready"] is True and health["served"] > 10

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert log.read_text().splitlines()[-1] == "stopped"


# --------------------------------------------------------------------------- weights file


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """A 4 MiB weights file with a trained MLP on it, made as a plan's prepare step does."""
    path = tmp_path_factory.mktemp("weights") / "w.safetensors"
    done = _run(["examples.weights", str(path), "--mb", "4", "--train-steps", "100"])
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["status"] == "written" and said["bytes"] == path.stat().st_size
    assert said["bytes"] > 4 << 20  # the table, the MLP and the header
    return path


def test_weights_file_is_kept_when_up_to_date_and_rewritten_when_not(weights, tmp_path):
    before = weights.stat().st_mtime_ns
    again = _run(["examples.weights", str(weights), "--mb", "4", "--train-steps", "100"])
    assert json.loads(again.stdout)["status"] == "up to date"
    assert weights.stat().st_mtime_ns == before
    other = tmp_path / "other.safetensors"
    other.write_bytes(b"not a safetensors file")
    rewritten = _run(["examples.weights", str(other), "--mb", "2"])
    assert json.loads(rewritten.stdout)["status"] == "written"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


def test_training_with_weights_reads_them_before_step_1_and_resumes_bit_exact(weights, tmp_path):
    def train(ckpt: str, *extra: str, steps: int = STEPS, file: Path = weights):
        return _run(
            ["examples.train_digits", "--steps", str(steps), "--step-sleep", "0",
             "--weights", str(file), "--checkpoint-every", "20",
             "--checkpoint-dir", str(tmp_path / ckpt), *extra]
        )  # fmt: skip

    whole = train("whole")
    assert whole.returncode == 0, whole.stderr
    lines = whole.stdout.splitlines()
    assert re.match(r"^loaded weights bytes=\d+ read_s=\d+\.\d+$", lines[0])
    assert int(lines[0].split()[2].split("=")[1]) >= 4 << 20
    assert re.match(r"^warmup checksum=\S+ accuracy=\S+ s=\d+\.\d+$", lines[1])
    assert lines[2].startswith("start ") and lines[3].startswith("step=1 ")
    losses = _losses(whole.stdout)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert _losses(_run(_train_args()).stdout) != losses  # the table takes part in each step

    first = train("ckpt", "--resume", steps=30)  # a run that ends at step 30, checkpointed
    assert first.returncode == 0, first.stderr
    resumed = train("ckpt", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed step=30" in resumed.stdout
    assert _losses(resumed.stdout) == {s: losses[s] for s in range(31, STEPS + 1)}

    other = tmp_path / "other.safetensors"
    assert _run(["examples.weights", str(other), "--mb", "4", "--seed", "3"]).returncode == 0
    refused = train("ckpt", "--resume", file=other)
    assert refused.returncode == 2 and "cannot resume" in refused.stderr

    missing = train("none", file=tmp_path / "absent.safetensors")
    assert missing.returncode == 2 and "cannot read weights" in missing.stderr


def test_server_with_weights_answers_as_the_model_in_the_file(weights, tmp_path):
    from examples import weights as weights_file
    from examples.train_digits import Config, DigitsMLP, load_digits_arrays, split_indices

    log = tmp_path / "serve.log"
    proc = _start(["examples.serve_digits", "--port", "0", "--weights", str(weights)], log)
    try:
        port = _wait_for_line(proc, log, r"^listening host=127\.0\.0\.1 port=(\d+)$").group(1)
        _wait_for_line(proc, log, r"^ready$")
        text = log.read_text()
        assert re.search(r"^loaded weights bytes=\d+ read_s=\S+\nwarmup accuracy=0\.\d+ s=", text,
                         re.M)  # fmt: skip
        tensors, _ = weights_file.load(weights)
        X, y = load_digits_arrays()
        model = DigitsMLP(Config(), X, y, split_indices(len(y))[0], embed=tensors["embed"])
        model.params.update({k: tensors[k] for k in weights_file.MLP_NAMES})
        for i in (0, 7, 1000):
            code, body = _http(f"http://127.0.0.1:{port}/predict?i={i}")
            assert code == 200
            assert body["probs"] == [float(p) for p in model.predict_proba(X[i])[0]]
        assert model.accuracy(split_indices(len(y))[1]) > 0.8  # 100 steps learnt the digits
    finally:
        _kill(proc)
