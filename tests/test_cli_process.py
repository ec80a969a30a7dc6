"""The CLI as a process, run the way users run it: without PREFECT_API_URL (the command
starts its own Prefect server), killed with SIGKILL, four at once, piped into a log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

KEY = "0123456789abcdef0123456789abcdef"


def _env(tmp_path: Path) -> dict[str, str]:
    """A user's environment with no Prefect server configured, and a private PREFECT_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return {**env, "PREFECT_HOME": str(tmp_path / "prefect-home"), "CKPT_POC_PSEUDONYM_KEY": KEY}


def _cli(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


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


def test_four_commands_at_once_all_work(tmp_path: Path) -> None:
    # A fresh PREFECT_HOME: four servers start at once on one new database.
    env = _env(tmp_path)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "cli", "baseline", "plans/demo.yaml", "--json"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (stdout, stderr) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, stderr[-3000:]
        assert '"rows_read"' in stdout


def test_an_error_is_said_once_and_never_wrapped(tmp_path: Path) -> None:
    dump = tmp_path / ("a-long-folder-name-" * 4) / "not-sacct.txt"
    dump.parent.mkdir(parents=True)
    dump.write_text("hello\n")
    done = _cli("baseline", "plans/demo.yaml", "--sacct-file", str(dump), env=_env(tmp_path))
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "not-sacct.txt" in line]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("error: ") and str(dump) in errors[0]  # one unbroken line
    assert "Finished in state Failed" not in done.stderr and "View at" not in done.stderr


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
