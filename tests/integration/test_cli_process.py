"""The CLI as a process, run the way users run it: without PREFECT_API_URL (the command
starts its own Prefect server), killed with SIGKILL, four at once, piped into a log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.common import REPO

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
