"""A Slurm plan's nodes and partition checked against the cluster with sinfo, when it answers.

The tests marked ``slurm`` run against the real single-node Slurm of scripts/slurm-up (node
``ckpt-node1`` in partition ``poc``); the others check that a missing, broken or silent sinfo
skips the check with a warning instead of failing the plan.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tasks.data.plan import load_plan
from tasks.data.plan_cluster import check_slurm_nodes, parse_sinfo_nodes


def _slurm_plan(write_plan, nodes: list[str], queue: str = "poc") -> Path:
    return write_plan(
        {
            "cluster.kind": "slurm",
            "cluster.nodes": nodes,
            "cluster.queue": queue,
            "faults": [{"kind": "scancel"}],
        }
    )


def _line_of(path: Path, text: str) -> int:
    return next(i for i, t in enumerate(path.read_text().splitlines(), 1) if t == text)


# --- without a cluster: the check is skipped and says why -------------------------------------


def test_parse_sinfo_nodes_reads_node_partition_pairs() -> None:
    out = "gpu-a poc*\ngpu-a debug\ngpu-b debug\n\n"
    assert parse_sinfo_nodes(out) == {"gpu-a": {"poc", "debug"}, "gpu-b": {"debug"}}


def test_no_sinfo_on_path_skips_with_a_warning(
    write_plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    path = _slurm_plan(write_plan, ["gpu-test-01"])

    plan = load_plan(path)

    line = _line_of(path, "  nodes:")
    assert plan.check_warnings == (
        f"{path}:{line}: cluster.nodes: not checked against the cluster: sinfo is not on PATH",
    )


NO_SINFO = shutil.which("sinfo") is None


@pytest.mark.skipif(
    NO_SINFO or Path("/etc/slurm/slurm.conf").exists(),
    reason="needs Slurm's client (sinfo) on a machine with no Slurm configured",
)
def test_sinfo_without_a_configuration_skips_with_its_reason() -> None:
    # The real sinfo with no slurm.conf anywhere: it looks for DNS SRV records and exits 1.
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    check = check_slurm_nodes(["gpu-test-01"], "poc", env=env)
    assert check.problems == []
    assert (
        check.skipped == "sinfo exited 1: sinfo: fatal: Could not establish a configuration source"
    )


@pytest.mark.skipif(NO_SINFO, reason="needs Slurm's client (sinfo)")
def test_sinfo_that_does_not_answer_is_abandoned(tmp_path: Path) -> None:
    # The real sinfo, pointed at a slurm.conf that is not there (yet): it retries for 60 s.
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "absent" / "slurm.conf")}
    started = time.monotonic()
    check = check_slurm_nodes(["gpu-test-01"], "poc", env=env, timeout_s=1)
    assert time.monotonic() - started < 10
    assert check.problems == []
    assert check.skipped == "sinfo did not answer within 1 s"


def test_local_plan_never_asks_sinfo(write_plan, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo, and no warning about it either
    assert load_plan(write_plan()).check_warnings == ()


# --- against a real Slurm -----------------------------------------------------------------------


@pytest.fixture
def slurm_conf(slurm_env: dict[str, str]) -> str:
    """The session's cluster (tests/conftest.py)."""
    return slurm_env["SLURM_CONF"]


@pytest.fixture
def on_cluster(slurm_conf: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """load_plan's sinfo talks to the test cluster, as it would with the site's SLURM_CONF."""
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    return slurm_conf
