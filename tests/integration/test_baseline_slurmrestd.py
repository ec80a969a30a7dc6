"""The baseline through a real slurmrestd (Debian's 22.05, dbv0.0.38, auth/jwt) on the tests'
Slurm, against the same jobs read by live sacct; a wrong token; the token in no log or dataset.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.baseline.source_slurmrestd import TZ_PAD, RestClient, read_slurmrestd
from tests.support import slurm_cluster

pytestmark = pytest.mark.slurm

SECRET = "ckpt-poc-test-slurm-jwt"
JOBS_PATH = "/slurmdb/v0.0.38/jobs"


def _save_secret(api_url: str, name: str, value: str) -> None:
    """A real Prefect Secret block on the session's server (the value via env, not argv)."""
    code = (
        "import os, sys; from prefect.blocks.system import Secret; "
        "Secret(value=os.environ['SECRET_VALUE']).save(sys.argv[1], overwrite=True)"
    )
    env = {**os.environ, "PREFECT_API_URL": api_url, "SECRET_VALUE": value}
    subprocess.run([sys.executable, "-c", code, name], env=env, check=True, timeout=120)


@pytest.fixture
def rest(slurm_env: dict[str, str]) -> tuple[str, dict[str, str]]:
    url = slurm_env.get(slurm_cluster.REST_URL_ENV)
    assert url, "the session's Slurm was started without a slurmrestd port"
    return url, slurm_env


def _jobs(data_dir: Path, job_ids: set[str]) -> list[tuple]:
    table = pq.read_table(data_dir / "jobs").to_pandas()
    mine = table[table["job_id_raw"].isin(job_ids)]
    cols = ["job_id", "is_allocation", "state", "elapsed_s", "gpus", "submit", "start", "end"]
    return sorted(tuple(r) for r in mine[cols].astype(str).itertuples(index=False))


def _all_text(data_dir: Path) -> str:
    """Every string value of every parquet file under data_dir, and every other file's text."""
    parts = []
    for f in data_dir.rglob("*"):
        if f.suffix == ".parquet":
            parts.append(json.dumps(pq.read_table(f).to_pylist(), default=str))
        elif f.is_file():
            parts.append(f.read_bytes().decode(errors="replace"))
    return "\n".join(parts)


def _windowed(client: RestClient, a: dt.datetime, b: dt.datetime) -> dict[str, dict]:
    """slurmdbd's jobs of the window [a, b) (naive UTC), by job id."""
    query = {"start_time": f"{a:%Y-%m-%dT%H:%M:%S}", "end_time": f"{b:%Y-%m-%dT%H:%M:%S}"}
    return {str(j["job_id"]): j for j in client.get_json(JOBS_PATH, query)["jobs"]}


def _submit_mix(env: dict[str, str]) -> dict[str, str]:
    """COMPLETED (1 GPU), FAILED (2 GPUs), CANCELLED: job id -> the state it ends in."""
    cases = {
        "COMPLETED": ("sleep 3", ["--gres=gpu:1"]),
        "FAILED": ("sleep 1\nexit 3", ["--gres=gpu:2"]),
        "CANCELLED": ("sleep 300", []),
    }
    ids = {}
    for state, (body, args) in cases.items():
        script = f"#!/bin/bash\n{body}\n"
        name = f"--job-name=rest-{state.lower()}"
        ids[slurm_cluster.submit(script, name, *args, env=env)] = state
    cancel = next(j for j, s in ids.items() if s == "CANCELLED")
    slurm_cluster.wait_state(cancel, {"RUNNING"}, 30, env=env)
    subprocess.run(["scancel", cancel], env=env, check=True, timeout=30)
    for job, state in ids.items():
        slurm_cluster.wait_state(job, {state}, 60, env=env)
    slurm_cluster.wait_windowed(ids, env=env)
    return ids


def test_slurmrestd_baseline_equals_live_sacct_and_keeps_the_token_out(
    rest, cli, write_plan, prefect_stack, tmp_path: Path, caplog
) -> None:
    url, env = rest
    token = slurm_cluster.jwt_token(env)
    with ThreadPoolExecutor(1) as pool:  # the secret is saved while the jobs run
        saved = pool.submit(_save_secret, prefect_stack.api_url, SECRET, token)
        ids = _submit_mix(env)
        saved.result()
    source = {"kind": "slurmrestd", "url": url, "token_secret": SECRET, "user": "nobody"}
    rest_plan = write_plan({"baseline.source": source, "baseline.days": 1}, "rest.yaml")
    live = {"kind": "sacct-live"}
    live_plan = write_plan(
        {"baseline.source": live, "baseline.days": 1, "data_dir": str(tmp_path / "live")},
        "live.yaml",
    )
    slurm = {"SLURM_CONF": env["SLURM_CONF"]}
    # The two reads side by side: each its own command, plan and data folder.
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(cli, "baseline", str(live_plan), "--live", "--json", env=slurm)
        by_rest = cli("baseline", str(rest_plan), "--json", env=slurm)
        by_sacct = pending.result()
    assert by_rest.returncode == 0, by_rest.stderr[-3000:]
    assert by_sacct.returncode == 0, by_sacct.stderr[-3000:]
    got, want = json.loads(by_rest.stdout), json.loads(by_sacct.stdout)

    rest_jobs = _jobs(tmp_path / "data" / "demo", set(ids))
    assert rest_jobs == _jobs(tmp_path / "live" / "demo", set(ids))
    allocations = {(j[0], j[2]) for j in rest_jobs if j[1] == "True"}
    assert allocations == {(job, state) for job, state in ids.items()}
    for key in ("allocations_by_state", "gpu_hours_by_state", "exposed_gpu_hours"):
        assert got[key] == pytest.approx(want[key], abs=1e-9), key
    assert got["rows_quarantined"] == 0

    # The token: not in the command's output, nor any dataset, nor this process's log.
    assert token not in by_rest.stdout + by_rest.stderr
    assert token not in _all_text(tmp_path / "data")
    caplog.set_level(logging.DEBUG)
    end = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    read_slurmrestd(RestClient(url, token, "nobody", 30), end - dt.timedelta(hours=1), end)
    assert "slurmrestd" in caplog.text and token not in caplog.text


def test_paged_windows_union_is_the_history_once(rest) -> None:
    """A job running across a window edge comes back in both windows and is kept once."""
    url, env = rest
    job = slurm_cluster.submit("#!/bin/bash\nsleep 4\n", "--job-name=rest-edge", env=env)
    slurm_cluster.wait_state(job, {"COMPLETED"}, 60, env=env)
    slurm_cluster.wait_windowed([job], env=env)
    client = RestClient(url, slurm_cluster.jwt_token(env), "nobody", 30)

    # The edge from slurmdbd's own times, not sacct's text: a window holds a job eligible
    # before its end and not ended before its start, so an edge strictly between the job's
    # eligible time and its end puts it in both windows (slurmrestd reads local time: UTC).
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    times = _windowed(client, now - dt.timedelta(days=1), now + dt.timedelta(days=1))[job]["time"]
    eligible, ended = times["eligible"], times["end"]
    assert ended - eligible >= 2, times  # a 4 s job
    edge = dt.datetime.fromtimestamp((eligible + ended + 1) // 2, dt.UTC).replace(tzinfo=None)
    # Windows begin at start - TZ_PAD: the first one ends at the edge.
    start = edge + TZ_PAD - dt.timedelta(days=1)
    for a, b in ((edge - dt.timedelta(days=1), edge), (edge, edge + dt.timedelta(days=1))):
        assert job in _windowed(client, a, b), (a, b, times)  # in both windows
    data, requests = read_slurmrestd(client, start, start + dt.timedelta(days=2), window_days=1)
    whole, one = read_slurmrestd(client, start, start + dt.timedelta(days=2), window_days=4)
    assert requests == 4 and one == 1
    lines = data.decode().splitlines()
    assert lines[0].startswith("JobID|")
    assert sum(1 for line in lines if line.split("|")[1] == job) == 1  # the allocation, once
    assert sorted(lines) == sorted(whole.decode().splitlines())


def test_a_wrong_token_is_a_clear_error_without_the_token(
    rest, cli, write_plan, prefect_stack, tmp_path: Path
) -> None:
    url, env = rest
    wrong = slurm_cluster.jwt_token(env)[:-6] + "AAAAAA"  # a forged signature
    _save_secret(prefect_stack.api_url, SECRET + "-wrong", wrong)
    source = {"kind": "slurmrestd", "url": url, "token_secret": SECRET + "-wrong"}
    plan = write_plan({"baseline.source": source, "baseline.days": 1})
    result = cli("baseline", str(plan), "--json", env={"SLURM_CONF": env["SLURM_CONF"]})
    assert result.returncode != 0
    text = result.stdout + result.stderr
    # 22.05 refuses a forged signature at its first request (/openapi/v3) with HTTP 401.
    assert f"slurmrestd {url}/" in text and "HTTP 401" in text, text[-2000:]
    assert "is the token valid and unexpired?" in text
    assert wrong not in text and wrong[:-6] not in text
    assert not list((tmp_path / "data").rglob("jobs/**/*.parquet"))
