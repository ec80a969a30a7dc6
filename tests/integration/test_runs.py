"""A killed run is never half visible: readers take committed runs only, `status` reports
what a killed run left, `clean` deletes it (never a committed or a live run), and the next
run removes temp files of killed writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tasks.data.datasets import GATES
from tasks.data.runs import clean_uncommitted, status_summary, uncommitted_runs
from tasks.data.store import read_dataset
from tests.support.common import REPO
from tests.unit.test_runs import _plan, _start_writer


def test_a_killed_run_is_invisible_reported_and_cleaned(tmp_path: Path) -> None:
    data = tmp_path / "data"
    committed = _start_writer(data, "run-committed", commit=True)
    killed = _start_writer(data, "run-killed", commit=False)
    running = _start_writer(data, "run-live", commit=False)
    try:
        for proc in (committed, killed):
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)

        # Readers see the committed run only: not the killed one, not the one still writing.
        rows = read_dataset(GATES, data_dir=data, poc="demo")
        assert set(rows["run_id"]) == {"run-committed"} and len(rows) == 4
        every = read_dataset(GATES, data_dir=data, poc="demo", include_uncommitted=True)
        assert set(every["run_id"]) == {"run-committed", "run-killed", "run-live"}

        summary = status_summary(data, "demo")
        assert summary.committed["baseline"].runs == 1
        assert [r.run_id for r in summary.running] == ["run-live"]
        assert [r.run_id for r in summary.uncommitted] == ["run-killed"]
        assert len(summary.uncommitted[0].files) == 1

        # The command says the same (no Prefect server to start).
        done = subprocess.run(
            [sys.executable, "-m", "cli", "status", str(_plan(tmp_path, data)), "--json"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["uncommitted"] == summary.to_json()["uncommitted"]

        removed = clean_uncommitted(data, "demo")
        assert {p.name for p in removed} == {"run-killed.parquet", "run-killed.json"}
        assert [r.run_id for r in uncommitted_runs(data, "demo")] == ["run-live"]
        assert len(read_dataset(GATES, data_dir=data, poc="demo")) == 4  # committed intact
    finally:
        running.kill()
        running.wait(timeout=10)


def test_a_baseline_killed_after_its_first_jobs_file_leaves_nothing_visible(
    tmp_path: Path,
) -> None:
    """A baseline killed mid-write: SIGKILL once the out-of-core path has written its first `jobs`
    block. Before commit records, every reader took those rows without an exposure."""
    from bench.synth_sacct import write_dump
    from tasks.data.datasets import EXPOSURE, JOBS

    dump = write_dump(tmp_path / "big.psv", rows=400_000, seed=7)
    data = tmp_path / "data"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "CKPT_POC_PSEUDONYM_KEY": "0123456789abcdef0123456789abcdef",
    }
    command = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "baseline",
            str(_plan(tmp_path, data)),
            "--sacct-file",
            str(dump),
            "--dask",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    jobs = data / "demo" / "jobs"
    deadline = time.monotonic() + 240
    while not list(jobs.glob("week=*/*.parquet")) and time.monotonic() < deadline:
        assert command.poll() is None, "the baseline ended before writing its first block"
        time.sleep(0.05)
    command.send_signal(signal.SIGKILL)
    command.wait(timeout=10)
    assert list(jobs.glob("week=*/*.parquet")), "no jobs block was written within 240 s"

    assert read_dataset(JOBS, data_dir=data, poc="demo").empty
    assert read_dataset(EXPOSURE, data_dir=data, poc="demo").empty
    left = status_summary(data, "demo").uncommitted
    assert len(left) == 1 and left[0].stage == "baseline" and left[0].files
    clean_uncommitted(data, "demo")
    assert not list((data / "demo").glob("*/week=*/*.parquet"))
