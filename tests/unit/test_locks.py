"""One experiment at a time on a node: a second run waits saying for whom, or refuses with
--no-wait; the lock dies with its holder, so a killed run never leaves a node locked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tasks.data.locks import LOCK_DIR_ENV, NodesBusy, hold_nodes

HOLDER = textwrap.dedent(
    """
    import time
    from tasks.data.locks import hold_nodes
    with hold_nodes("local", ["local-a", "local-b"], poc="demo", run_id="run-1",
                    stage="recovery"):
        print("held", flush=True)
        time.sleep(120)
    """
)


@pytest.fixture
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "locks"
    monkeypatch.setenv(LOCK_DIR_ENV, str(path))
    return path


def _holder(lock_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, LOCK_DIR_ENV: str(lock_dir)},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_refuses_or_waits_naming_the_holder(lock_dir: Path) -> None:
    holder = _holder(lock_dir)
    try:
        with (
            pytest.raises(NodesBusy) as refused,
            hold_nodes(
                "local", ["local-b"], poc="demo", run_id="run-2", stage="overhead", wait=False
            ),
        ):
            pytest.fail("held a node another run holds")
        message = str(refused.value)
        assert "node local-b is held by recovery run run-1 of PoC demo" in message
        assert f"pid {holder.pid}" in message and "--no-wait" in message

        notices: list[str] = []
        t0 = time.monotonic()
        with (
            pytest.raises(NodesBusy, match="waited 1 s"),
            hold_nodes(
                "local",
                ["local-a"],
                poc="demo",
                run_id="run-2",
                stage="overhead",
                timeout_s=1.0,
                notify=notices.append,
            ),
        ):
            pytest.fail("held a node another run holds")
        assert 1.0 <= time.monotonic() - t0 < 3
        assert notices and notices[0].startswith("waiting for node local-a: held by recovery")
        # Other nodes, or the same names on another kind of cluster, are not held.
        with hold_nodes("slurm", ["local-a"], poc="demo", run_id="run-3", stage="recovery"):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    # Killed, the holder took its locks with it: the waiting run gets both nodes at once.
    t0 = time.monotonic()
    with hold_nodes("local", ["local-b", "local-a"], poc="demo", run_id="run-2", stage="x"):
        assert time.monotonic() - t0 < 1
        record = json.loads((lock_dir / "local-local-a.lock").read_text())
        assert record["run_id"] == "run-2" and record["pid"] == os.getpid()


def test_a_waiting_run_starts_when_the_holder_ends(lock_dir: Path) -> None:
    holder = _holder(lock_dir)
    subprocess.Popen(["sh", "-c", f"sleep 1; kill -KILL {holder.pid}"])
    notices: list[str] = []
    t0 = time.monotonic()
    with hold_nodes(
        "local", ["local-a"], poc="demo", run_id="run-2", stage="overhead", notify=notices.append
    ):
        waited = time.monotonic() - t0
    holder.wait(timeout=10)
    assert 0.8 <= waited < 5 and len(notices) == 1
