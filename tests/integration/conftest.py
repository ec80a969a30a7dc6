"""The real services the integration tests use, one of each for the session: a single-node
Slurm with accounting, a Prefect server with its worker and deployments, and CRIU."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import service_watchdog, slurm_cluster
from tests.support.common import REPO
from tests.support.prefect_server import PrefectStack, alive, free_port


@pytest.fixture(scope="session")
def prefect_stack(tmp_path_factory) -> Iterator[PrefectStack]:
    """A real Prefect server, the process work pool, the deployments and a worker, shared by
    the session (scripts/prefect-up on a free port with a private PREFECT_HOME)."""
    directory = tmp_path_factory.mktemp("prefect")
    # Started before the server: if this run is killed, even while prefect-up runs, the
    # watchdog stops what prefect-up started (and every flow run carrying its home).
    watchdog = service_watchdog.start("prefect", directory)
    stack = PrefectStack(
        directory,
        env={
            "CKPT_POC_PSEUDONYM_KEY": os.environ["CKPT_POC_PSEUDONYM_KEY"],
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            # The scheduler makes due runs within seconds, not a minute (the scheduled-run test)
            "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5",
        },
    )
    try:
        stack.up()
        yield stack
    finally:
        report = stack.down()
        service_watchdog.disarm(watchdog)
    assert set(stack.started) == {"server", "worker"}
    assert report.clean, (
        f"prefect-down rc={report.returncode}; alive after it (killed now): "
        f"{report.still_alive}; still carrying PREFECT_HOME: {report.leftovers}\n{report.output}"
    )
    assert not any(alive(pid) for pid in stack.started.values())


# The session's Slurm: private ports, so that a developer's own scripts/slurm-up cluster
# (default ports) can run beside it; CKPT_POC_TEST_SLURM_PORTS ("DB,CTLD,D,DBD") moves them
# (a test session started from a test: tests/integration/test_service_watchdog.py).
# A fifth port, if given, is slurmrestd's; else one free now is taken.
_PORTS = os.environ.get("CKPT_POC_TEST_SLURM_PORTS", "23306,26817,26818,26819").split(",")


SLURM_PORTS = dict(
    zip(
        ("CKPT_SLURM_DB_PORT", "CKPT_SLURM_CTLD_PORT", "CKPT_SLURM_D_PORT", "CKPT_SLURM_DBD_PORT"),
        _PORTS[:4],
        strict=True,
    )
)


SLURM_PORTS["CKPT_SLURM_REST_PORT"] = _PORTS[4] if len(_PORTS) > 4 else str(free_port())


# A second cluster, only for a test that needs accounting of its own (pristine_slurm_env).
PRIVATE_SLURM_PORTS = {
    "CKPT_SLURM_DB_PORT": "23316",
    "CKPT_SLURM_CTLD_PORT": "26827",
    "CKPT_SLURM_D_PORT": "26828",
    "CKPT_SLURM_DBD_PORT": "26829",
}


@contextlib.contextmanager
def _slurm_cluster(directory: Path, ports: dict[str, str]) -> Iterator[dict[str, str]]:
    """A real Slurm under ``directory`` (scripts/slurm-up), stopped and removed on exit, and
    by its watchdog if the test run dies first."""
    watchdog = service_watchdog.start("slurm", directory)
    try:
        yield slurm_cluster.ensure_slurm_up(directory, ports)
    finally:
        subprocess.run(
            [str(REPO / "scripts" / "slurm-down"), "--purge", str(directory)],
            check=False,
            timeout=180,
        )
        service_watchdog.disarm(watchdog)
    pids = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(directory) not in pids, "a Slurm daemon outlived slurm-down"


@pytest.fixture(scope="session")
def slurm_session(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The session's one real single-node Slurm (with accounting), shared by every test that
    submits jobs: they keep apart by their own data folders, PoC and job names, and one at
    a time (pytest runs tests in turn), each handed the cluster clean by ``slurm_env``.
    Tests that need something of their own say so in their fixture (pristine_slurm_env)."""
    with _slurm_cluster(tmp_path_factory.mktemp("slurm"), SLURM_PORTS) as env:
        yield env


@pytest.fixture
def slurm_env(slurm_session: dict[str, str]) -> dict[str, str]:
    """The session's Slurm, with no job of an earlier test left and its node in service."""
    slurm_cluster.reset(slurm_session)
    return slurm_session


@pytest.fixture(scope="module")
def slurm_harness(slurm_session: dict[str, str], criu_binary: str) -> Iterator[None]:
    """The harness and the jobs it submits (sbatch exports this environment) use the
    session's cluster and the session's CRIU."""
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "CKPT_POC_CRIU")}
    os.environ["SLURM_CONF"] = slurm_session["SLURM_CONF"]
    os.environ["CKPT_POC_CRIU"] = criu_binary
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def slurm_jobs_env(slurm_harness: None, slurm_env: dict[str, str]) -> dict[str, str]:
    """``slurm_env`` for a test whose harness submits the jobs itself."""
    return slurm_env


@pytest.fixture(scope="session")
def pristine_slurm_env(slurm_session: dict[str, str], tmp_path_factory) -> Iterator[dict]:
    """A Slurm whose accounting holds no job yet (the live baseline reads every job of the
    last day and must find only its own). The session's cluster while no test has used it —
    the tests that ask for this fixture run first (pytest_collection_modifyitems) — else,
    e.g. when run after others by hand, a cluster of its own."""
    if not slurm_cluster.accounted_jobs(slurm_session):
        slurm_cluster.reset(slurm_session)
        yield slurm_session
        return
    with _slurm_cluster(tmp_path_factory.mktemp("slurm-pristine"), PRIVATE_SLURM_PORTS) as env:
        yield env


@pytest.fixture
def cli(prefect_stack: PrefectStack):
    """Run `ckpt-poc ARGS` as a user would; its flow runs show on the session's server."""

    def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        full_env = {**os.environ, "PREFECT_API_URL": prefect_stack.api_url, **(env or {})}
        full_env = {k: v for k, v in full_env.items() if v is not None}
        return subprocess.run(
            [sys.executable, "-m", "cli", *args],
            cwd=REPO,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    return _run


@pytest.fixture(scope="session")
def criu_binary() -> str:
    done = subprocess.run(
        [str(REPO / "scripts" / "install-criu")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()
