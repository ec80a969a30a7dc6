from __future__ import annotations

import os
import shutil
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


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def sample_psv(tmp_path: Path) -> Path:
    src = REPO / "data" / "samples" / "sacct-sample.psv"
    dst = tmp_path / "sample.psv"
    shutil.copy(src, dst)
    return dst
