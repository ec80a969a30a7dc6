"""The baseline on a real single-node Slurm: real jobs in every state, live sacct, exact numbers.

The cluster is fresh for the session (its own folder and ports), so its accounting holds
exactly the jobs this test submits; the expected numbers are computed here from those jobs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tasks.baseline.fields import parse_duration_s
from tests import slurm_cluster

pytestmark = pytest.mark.slurm

EXPOSED = {"FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


@pytest.fixture(scope="session")
def job_mix(pristine_slurm_env: dict[str, str]) -> list[dict]:
    return slurm_cluster.submit_job_mix(pristine_slurm_env)


@pytest.fixture
def slurm_env(pristine_slurm_env: dict[str, str]) -> dict[str, str]:
    """The live baseline reads every job of the last day: a cluster whose accounting holds
    only the job mix (tests/conftest.py: pristine_slurm_env)."""
    return pristine_slurm_env


def _expected(records: list[dict]) -> dict:
    """What the baseline must report, computed from the jobs this test submitted."""
    states: Counter[str] = Counter()
    gpu_hours: Counter[str] = Counter()
    for rec in records:
        assert len(rec["attempts"]) == len(rec["expected_states"])
        for state, attempt in zip(rec["expected_states"], rec["attempts"], strict=True):
            states[state] += 1
            elapsed = parse_duration_s(attempt["Elapsed"])
            gpu_hours[state] += elapsed * rec["gpus"] / 3600
    chains: dict[str, list[tuple[int, str]]] = {}
    for rec in records:
        if rec["chain"]:
            chains.setdefault(rec["chain"], []).append((rec["chain_position"], rec["job_id"]))
    return {
        "allocations_by_state": dict(states),
        "gpu_hours_by_state": dict(gpu_hours),
        "exposed_gpu_hours": sum(v for k, v in gpu_hours.items() if k in EXPOSED),
        "timeout_gpu_hours": gpu_hours["TIMEOUT"],
        "chains": [[jid for _, jid in sorted(c)] for c in chains.values()],
    }


def test_live_baseline_equals_the_submitted_jobs(
    job_mix, slurm_env, cli, write_plan, tmp_path: Path
) -> None:
    submitted = {s for rec in job_mix for s in rec["expected_states"]}
    assert {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "REQUEUED"} <= submitted
    assert any(rec["gpus"] for rec in job_mix) and any(not rec["gpus"] for rec in job_mix)
    plan = write_plan({"baseline.source": {"kind": "sacct-live"}, "baseline.days": 1})
    result = cli(
        "baseline", str(plan), "--live", "--json", env={"SLURM_CONF": slurm_env["SLURM_CONF"]}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout)
    want = _expected(job_mix)
    assert got["rows_quarantined"] == 0
    assert got["allocations_by_state"] == want["allocations_by_state"]
    assert got["gpu_hours_by_state"] == pytest.approx(want["gpu_hours_by_state"], abs=1e-9)
    assert got["exposed_gpu_hours"] == pytest.approx(want["exposed_gpu_hours"], abs=1e-9)
    assert got["timeout_gpu_hours"] == pytest.approx(want["timeout_gpu_hours"], abs=1e-9)
    assert got["chains"] == want["chains"]
    # Allocations and their steps were all read, and every row was parsed.
    assert got["rows_read"] > sum(want["allocations_by_state"].values())
    data = tmp_path / "data" / "demo"
    for dataset in ("jobs", "exposure", "gates"):  # no quarantine file: nothing was quarantined
        assert list((data / dataset).rglob("*.parquet")), dataset
