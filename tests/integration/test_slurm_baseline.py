"""The baseline on a real single-node Slurm: real jobs in every state, live sacct, exact numbers.

The cluster is fresh for the session (its own folder and ports), so its accounting holds
exactly the jobs this test submits; the expected numbers are computed here from those jobs.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tasks.baseline.dump_layout import SACCT_FIELDS
from tasks.baseline.fields import parse_duration_s
from tasks.baseline.run import run_baseline
from tasks.baseline.source_sacct import sacct_argv
from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tests.support import slurm_cluster

pytestmark = pytest.mark.slurm

EXPOSED = {"FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


@pytest.fixture(scope="session")
def job_mix(pristine_slurm_env: dict[str, str], request: pytest.FixtureRequest) -> list[dict]:
    """The mix takes 60-90 s, most of it waiting for its TIMEOUT job's limit to lapse: the
    session's Prefect server (the live baseline's `cli` needs it) starts in that time."""
    with ThreadPoolExecutor(1) as pool:
        mix = pool.submit(slurm_cluster.submit_job_mix, pristine_slurm_env)
        request.getfixturevalue("prefect_stack")
        return mix.result()


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


@pytest.mark.parametrize("time_format", ["%s", "relative"])
def test_a_dump_in_the_sites_time_format_reads_as_the_live_baseline(
    job_mix, slurm_env, write_plan, tmp_path: Path, time_format: str
) -> None:
    """The same jobs dumped by the real sacct with SLURM_TIME_FORMAT=%s (epoch seconds, as
    jobstats asks for) or =relative ("11:09:05" today, "Ystday 10:00", …), header-less in the
    product's --format, read back as a file: the live baseline's numbers, and the format named."""
    end = dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(minutes=1)
    argv = sacct_argv(end - dt.timedelta(days=1), end)
    env = {**slurm_env, "TZ": "UTC", "SLURM_TIME_FORMAT": time_format}
    done = subprocess.run(argv, capture_output=True, env=env, timeout=60, check=True)
    dump = tmp_path / "site.psv"
    dump.write_bytes(done.stdout)  # its mtime, now, dates a relative dump's times
    first = done.stdout.decode().splitlines()[0].split("|")
    start = first[SACCT_FIELDS.index("Start")]
    # Not ISO: today's relative start is "HH:MM:SS", which starts "20" from 20:00 on.
    iso = re.match(r"\d{4}-\d\d-\d\dT", start) is not None
    assert start.isdigit() if time_format == "%s" else not iso, start
    path = write_plan({"baseline.source": {"kind": "sacct-file", "path": str(dump)}})
    plan = load_plan(path)  # in this process: the CLI's path is the live test's above
    got = run_baseline(plan, make_run_context(plan, path)).summary.to_json()
    want = _expected(job_mix)
    assert got["rows_quarantined"] == 0
    assert got["allocations_by_state"] == want["allocations_by_state"]
    assert got["gpu_hours_by_state"] == pytest.approx(want["gpu_hours_by_state"], abs=1e-9)
    assert got["exposed_gpu_hours"] == pytest.approx(want["exposed_gpu_hours"], abs=1e-9)
    assert got["chains"] == want["chains"]
    named = " ".join(got["time_formats"].values())
    assert ("epoch seconds" if time_format == "%s" else "relative") in named, got["time_formats"]
