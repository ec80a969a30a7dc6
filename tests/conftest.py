from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prefect_server import PrefectStack, alive

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


@pytest.fixture(scope="session")
def prefect_stack(tmp_path_factory) -> Iterator[PrefectStack]:
    """A real Prefect server, the process work pool, the deployments and a worker, shared by
    the session (scripts/prefect-up on a free port with a private PREFECT_HOME)."""
    stack = PrefectStack(
        tmp_path_factory.mktemp("prefect"),
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
    assert set(stack.started) == {"server", "worker"}
    assert report.clean, (
        f"prefect-down rc={report.returncode}; alive after it (killed now): "
        f"{report.still_alive}; still carrying PREFECT_HOME: {report.leftovers}\n{report.output}"
    )
    assert not any(alive(pid) for pid in stack.started.values())


@pytest.fixture
def cli(prefect_stack: PrefectStack):
    """Run `ckpt-poc ARGS` as a user would; its flow runs show on the session's server."""

    def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        full_env = {**os.environ, "PREFECT_API_URL": prefect_stack.api_url, **(env or {})}
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
