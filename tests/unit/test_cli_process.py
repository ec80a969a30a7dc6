"""The CLI as a process, run the way users run it: without PREFECT_API_URL (the command
starts its own Prefect server), killed with SIGKILL, four at once, piped into a log."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_cli_process import _alive, _children, _cmdline, _env
from tests.support.common import REPO


def test_the_commands_prefect_server_dies_with_the_command(tmp_path: Path) -> None:
    command = subprocess.Popen(
        [sys.executable, "-m", "cli", "baseline", str(REPO / "plans" / "demo.yaml")],
        cwd=REPO,
        env=_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = None
    deadline = time.monotonic() + 120
    while server is None and time.monotonic() < deadline and command.poll() is None:
        server = next((c for c in _children(command.pid) if "uvicorn" in _cmdline(c)), None)
        time.sleep(0.05)
    assert server is not None, "the command never started its Prefect server"
    command.send_signal(signal.SIGKILL)
    command.wait(timeout=10)
    deadline = time.monotonic() + 5
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(server), f"the Prefect server (pid {server}) outlived its command"


@pytest.mark.parametrize(
    "args", [["plan", "check", "plans/demo.yaml"], ["status", "plans/demo.yaml"]]
)
def test_commands_that_only_read_start_no_server_and_never_load_prefect(
    tmp_path: Path, args: list[str]
) -> None:
    # What keeps them fast is structural, so that is what is checked (their speed is a
    # machine's): Prefect is never imported (-X importtime lists every module loaded) and
    # no server is started.
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cli", *args],
        cwd=REPO,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "pandas" in loaded  # the listing works: what they do need is in it
    assert not {m for m in loaded if m == "prefect" or m.startswith("prefect.")}
    assert not (tmp_path / "prefect-home").exists()  # no Prefect server was started
