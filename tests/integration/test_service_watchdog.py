"""A killed test run leaves no Slurm or Prefect service behind: a pytest session that holds
both is SIGKILLed (no teardown runs), and the watchdogs that tests/conftest.py started with
the services stop every daemon, the server, the worker and whatever carries their folders."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.common import REPO
from tests.support.prefect_server import alive, processes_with_home

INNER = "CKPT_POC_WATCHDOG_INNER"  # set only for the session this test starts and kills
SLURM_DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd", "slurmrestd")


@pytest.mark.skipif(INNER not in os.environ, reason="the session test_a_killed_run_… kills")
def test_hold_the_services_until_killed(slurm_session, prefect_stack) -> None:
    """Inside the session the test below starts: say where the services are, then wait to
    be killed."""
    slurm_dir = Path(slurm_session["SLURM_CONF"]).parents[1]
    Path(os.environ[INNER]).write_text(
        json.dumps({"slurm": str(slurm_dir), "prefect": str(prefect_stack.dir)})
    )
    threading.Event().wait(600)


def _pids(run: Path) -> dict[str, int]:
    pids = {}
    for path in run.glob("*.pid"):
        text = path.read_text().strip()
        if text.isdigit():
            pids[path.stem] = int(text)
    return pids


def _carrying(text: str) -> list[str]:
    """Processes whose command line names ``text`` (a service folder)."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if text in line and "ps -eo" not in line]


@pytest.mark.slurm
@pytest.mark.prefect_server
def test_a_killed_run_leaves_no_service_running(tmp_path: Path) -> None:
    where = tmp_path / "services.json"
    env = {
        **os.environ,
        INNER: str(where),
        # Apart from this session's own cluster, which may be up.
        "CKPT_POC_TEST_SLURM_PORTS": "23336,26847,26848,26849,26850",
    }
    log = tmp_path / "inner.log"
    out = open(log, "wb")  # noqa: SIM115 (closed below; a pipe could fill and stall it)
    inner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'inner'}",
            f"{Path(__file__).resolve()}::test_hold_the_services_until_killed",
        ],
        cwd=REPO,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 600
        while not where.exists() and inner.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert where.exists(), "the inner session never held its services:\n" + log.read_text()
        dirs = json.loads(where.read_text())
        slurm, prefect = Path(dirs["slurm"]), Path(dirs["prefect"])
        daemons = _pids(slurm / "run")
        assert set(daemons) == set(SLURM_DAEMONS), daemons
        services = _pids(prefect / "run")
        assert set(services) == {"server", "worker"}, services
        held = [*daemons.values(), *services.values()]
        assert all(alive(pid) for pid in held)
    finally:
        os.kill(inner.pid, signal.SIGKILL)  # no teardown, no atexit: as a killed CI job
        inner.wait()
        out.close()

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and (
        any(alive(pid) for pid in held)
        or _carrying(str(slurm))
        or _carrying(str(prefect))
        or processes_with_home(prefect / "home")
    ):
        time.sleep(0.5)
    left = {name: pid for name, pid in {**daemons, **services}.items() if alive(pid)}
    assert left == {}, (left, (prefect / "watchdog.log").read_text())
    assert _carrying(str(slurm)) == [] and _carrying(str(prefect)) == []
    assert processes_with_home(prefect / "home") == []
    assert not slurm.exists()  # slurm-down --purge ran
