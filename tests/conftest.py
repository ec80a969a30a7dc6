from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("CKPT_POC_PSEUDONYM_KEY", "test-key-0123456789abcdef-not-a-secret")

HEADER = (
    "JobID|JobIDRaw|Cluster|Partition|User|Account|JobName|State|ExitCode|Submit|Start|End|"
    "Elapsed|ElapsedRaw|Timelimit|NNodes|NCPUS|AllocTRES|NodeList"
)


def demo_plan_dict() -> dict:
    return yaml.safe_load((REPO / "plans" / "demo.yaml").read_text())


@pytest.fixture
def write_plan(tmp_path: Path):
    """Write a plan (the demo plan with overrides) into tmp_path; data_dir points there too."""

    def _write(overrides: dict | None = None, name: str = "plan.yaml") -> Path:
        plan = demo_plan_dict()
        plan["data_dir"] = str(tmp_path / "data")
        for dotted, value in (overrides or {}).items():
            node = plan
            *parents, last = dotted.split(".")
            for p in parents:
                node = node[p]
            if value is _DELETE:
                del node[last]
            else:
                node[last] = value
        path = tmp_path / name
        path.write_text(yaml.safe_dump(plan, sort_keys=False))
        return path

    return _write


class _Delete:
    pass


_DELETE = _Delete()


@pytest.fixture
def delete_marker():
    return _DELETE


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory) -> Iterator[str]:
    """A real `prefect server` for the session; its API URL, for CLI subprocesses."""
    home = tmp_path_factory.mktemp("prefect-home")
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    log = open(home / "server.log", "wb")  # noqa: SIM115 - closed in the finaliser
    server = subprocess.Popen(
        ["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prefect server did not start: see {home}/server.log")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.fixture
def cli(prefect_api: str):
    """Run `ckpt-poc ARGS` as a user would, against the session's Prefect server."""

    def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        full_env = {**os.environ, "PREFECT_API_URL": prefect_api, **(env or {})}
        full_env = {k: v for k, v in full_env.items() if v is not None}
        return subprocess.run(
            [sys.executable, "-m", "flows.cli", *args],
            cwd=REPO,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    return _run


@pytest.fixture
def sample_psv(tmp_path: Path) -> Path:
    src = REPO / "data" / "samples" / "sacct-sample.psv"
    dst = tmp_path / "sample.psv"
    shutil.copy(src, dst)
    return dst
