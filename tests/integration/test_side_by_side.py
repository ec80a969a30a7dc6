"""The engine end to end from the CLI (a real Prefect server, real CRIU): both copies of the
demo workload run to the end, the managed one is checkpointed, every event is on disk (in
the `events` dataset and the run's journal alike)."""

from __future__ import annotations

import json

import pytest

from tasks.data.datasets import EVENTS
from tasks.data.store import read_dataset
from tasks.engine.clock import read_journal

pytestmark = pytest.mark.criu


def test_side_by_side_demo_plan(cli, write_plan, tmp_path, criu_binary) -> None:
    plan = write_plan({"checkpointer.interval_s": 1.0})
    result = cli("side-by-side", str(plan), "--json", env={"CKPT_POC_CRIU": criu_binary})
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert {a: r["last_step"] for a, r in summary["arms"].items()} == {
        "managed": 300,
        "unmanaged": 300,
    }
    assert all(r["exited"] for r in summary["arms"].values())
    assert summary["checkpoints"] >= 2 and not summary["checkpoint_errors"]
    events = read_dataset(EVENTS, data_dir=tmp_path / "data", poc="demo")
    assert len(events) == summary["events"]
    by_arm = {arm: set(group["event"]) for arm, group in events.groupby("arm")}
    assert {"launch", "started", "progress", "exited"} <= by_arm["unmanaged"]
    assert {
        "launch",
        "started",
        "progress",
        "checkpoint_start",
        "checkpoint_end",
        "exited",
    } <= by_arm["managed"]
    assert "checkpoint_start" not in by_arm["unmanaged"]
    # One clock: wall and monotonic orders agree. Wall times are kept to the microsecond, and
    # the two copies' progress lines, timed by their logs' (jiffy-coarse) mtimes, often share
    # one: a tie is no disagreement, so ties are taken in monotonic order.
    mono = events.sort_values(["t_wall", "t_mono_ns"])["t_mono_ns"].astype("int64")
    assert mono.is_monotonic_increasing
    # The run's journal, written as the events happened, holds the same events.
    (run_id,) = set(events["run_id"])
    journal = read_journal(tmp_path / "data" / "demo" / "runs" / run_id / "events.jsonl")
    assert sorted((e.arm, e.event, e.t_mono_ns) for e in journal) == sorted(
        zip(events["arm"], events["event"], events["t_mono_ns"].astype("int64"), strict=True)
    )
