"""The procfs sampler on real workload copies, and the span runner under SIGKILL.

A sampler run is killed at random moments, again and again, then a last run completes:
the same sample is never written twice, every stretch of time from the first read to the
last is either a sample row or a gap row (no silent loss), and no half-written file is
visible to readers.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from tasks.data.datasets import SAMPLE_GAPS, SAMPLES
from tasks.data.plan import load_plan
from tasks.data.runctx import open_run
from tasks.data.runs import committed_runs
from tasks.data.store import read_dataset
from tasks.engine.clusters.local.cluster import LocalCluster
from tasks.window.sampling.nodes import sample
from tests.support.common import REPO

BURN = ["python", "-c", "import time\nwhile True: sum(range(100000))"]


def _plan(write_plan, **overrides):
    path = write_plan(overrides)
    return load_plan(path), path


# alone: the sampler attributes every copy on the machine by its environment, another test's too
@pytest.mark.alone
def test_procfs_rows_attribute_the_copies_and_keep_the_rest(write_plan, tmp_path) -> None:
    plan, path = _plan(write_plan)
    cluster = LocalCluster(
        list(plan.cluster.nodes), tmp_path / "runs" / "r1", REPO, workload=plan.workload.name
    )
    managed = cluster.start("local-a", "managed", BURN, tag="t1")
    unmanaged = cluster.start("local-b", "unmanaged", BURN, tag="t1")
    try:
        time.sleep(0.3)
        with open_run(plan, path, "sample_window") as ctx:
            result = sample(plan, ctx, span_s=2.0, interval_s=0.5)
    finally:
        for proc in (managed, unmanaged):
            os.killpg(proc.pid, signal.SIGKILL)
    assert result.reads == 4
    rows = read_dataset(SAMPLES, data_dir=plan.data_dir, poc=plan.poc)
    assert set(rows["device"]) == {"cpu"}  # procfs data is never labelled GPU
    jobs = rows[rows["entity"].str.startswith("job:")]
    by_arm = jobs[jobs["metric"] == "cpu_utilization"].groupby("arm")["value"].mean()
    # Each copy burns a core (two cores here, shared with the test): clearly busy, both.
    assert by_arm["managed"] > 0.2 and by_arm["unmanaged"] > 0.2, by_arm
    assert set(jobs["attributed_by"]) == {"env"}
    assert set(jobs.loc[jobs["arm"] == "managed", "node"]) == {"local-a"}
    assert set(jobs["workload"]) == {plan.workload.name}
    assert set(jobs["trial_id"]) == {"t1"}
    host = rows[rows["entity"] == "host"]
    assert set(host["attributed_by"]) == {"none"} and host["arm"].isna().all()
    # rows tile the span: each node's host CPU rows meet end to start
    cpu = host[(host["metric"] == "cpu_utilization") & (host["node"] == "local-a")]
    cpu = cpu.sort_values("t_from")
    assert (cpu["t_from"].iloc[1:].to_numpy() == cpu["t_to"].iloc[:-1].to_numpy()).all()


SAMPLER = """
import sys
from tasks.data.plan import load_plan
from tasks.data.runctx import open_run
from tasks.window.sampling.nodes import sample
plan = load_plan(sys.argv[1])
with open_run(plan, sys.argv[1], "sample_window") as ctx:
    print("started", flush=True)
    sample(plan, ctx, span_s=float(sys.argv[2]), interval_s=0.05, flush_s=0.2)
"""


def _start_sampler(path: Path, span_s: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SAMPLER, str(path), str(span_s)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    return proc


def test_sigkill_at_random_moments_loses_nothing_silently(write_plan) -> None:
    plan, path = _plan(write_plan)
    rng = random.Random(11)
    for _ in range(5):
        proc = _start_sampler(path, span_s=30)
        time.sleep(rng.uniform(0.05, 1.5))
        proc.kill()
        proc.wait()
    last = _start_sampler(path, span_s=1.0)
    assert last.wait(timeout=60) == 0

    data = Path(plan.data_dir) / plan.poc
    assert not list(data.rglob("*.tmp")), "a half-written file is left"
    for f in data.rglob("*.parquet"):
        pq.read_metadata(f)  # every visible file is whole
    outcomes = [r["outcome"] for r in committed_runs(plan.data_dir, plan.poc).values()]
    assert outcomes.count("complete") == 1
    assert any(o.startswith("killed") for o in outcomes)

    samples = read_dataset(SAMPLES, data_dir=plan.data_dir, poc=plan.poc)
    gaps = read_dataset(SAMPLE_GAPS, data_dir=plan.data_dir, poc=plan.poc)
    key = ["node", "source", "entity", "metric", "t_to"]
    assert not samples.duplicated(key).any(), "a sample was written twice"
    assert not gaps.duplicated(["node", "source", "entity", "metric", "t_from"]).any()
    assert (gaps["reason"].str.len() > 0).all()
    assert gaps["reason"].str.contains("killed or crashed").any()
    for node in plan.cluster.nodes:
        host = samples[
            (samples["node"] == node)
            & (samples["entity"] == "host")
            & (samples["metric"] == "cpu_utilization")
        ]
        spans = pd.concat(
            [host[["t_from", "t_to"]], gaps.loc[gaps["node"] == node, ["t_from", "t_to"]]]
        ).sort_values("t_from")
        starts, ends = spans["t_from"].to_numpy(), spans["t_to"].to_numpy()
        # Every stretch from the first row to the last is covered: each interval starts
        # where the previous one ended (no hole), and none overlaps another (no double count).
        assert (starts[1:] == ends[:-1]).all(), _holes(starts, ends)


def _holes(starts, ends) -> str:
    bad = [(str(e), str(s)) for s, e in zip(starts[1:], ends[:-1], strict=True) if s != e]
    return json.dumps(bad[:5])


def test_sigterm_ends_the_span_early_and_keeps_what_was_read(write_plan) -> None:
    plan, path = _plan(write_plan)
    proc = _start_sampler(path, span_s=60)
    time.sleep(0.8)
    started = time.monotonic()
    proc.terminate()
    assert proc.wait(timeout=20) == 0
    assert time.monotonic() - started < 5
    (record,) = committed_runs(plan.data_dir, plan.poc).values()
    assert record["outcome"] == "stopped early"
    samples = read_dataset(SAMPLES, data_dir=plan.data_dir, poc=plan.poc)
    assert len(samples) > 0
