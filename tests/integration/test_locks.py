"""One experiment at a time on a node: a second run waits saying for whom, or refuses with
--no-wait; the lock dies with its holder, so a killed run never leaves a node locked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.data.locks import LOCK_DIR_ENV
from tests.unit.test_locks import lock_dir  # noqa: F401


@pytest.mark.criu
def test_two_side_by_side_runs_never_share_the_slots(
    cli, prefect_stack, write_plan, lock_dir: Path, criu_binary: str
) -> None:
    # A long first run (about 40 s of steps) and a second started while it holds the slots.
    command = [
        "python",
        "-m",
        "examples.train_digits",
        "--steps",
        "2000",
        "--step-sleep",
        "0.02",
        "--checkpoint-every",
        "50",
        "--checkpoint-dir",
        "{copy_dir}",
    ]
    plan = write_plan({"workload.command": command, "checkpointer.interval_s": 2.0})
    env = {"CKPT_POC_CRIU": criu_binary, LOCK_DIR_ENV: str(lock_dir)}
    first = subprocess.Popen(
        [sys.executable, "-m", "cli", "side-by-side", str(plan), "--json"],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, **env, "PREFECT_API_URL": prefect_stack.api_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lock = lock_dir / "local-local-a.lock"
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert lock.read_text(), "the first run never held its slots"
        second = cli("side-by-side", str(plan), "--no-wait", env=env)
        assert second.returncode == 1
        assert "node local-a is held by side_by_side run" in second.stderr.replace("\n", " ")
        assert first.poll() is None, "the first run ended before the second was refused"
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=60)
