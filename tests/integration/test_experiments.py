"""Overhead, cold start and checkpoint cost on the demo plan with real CRIU, end to end
through the CLI (and so through their Prefect flows), then their gates on constructed rows.

The demo workload is cut to 120 steps (about 2.5 s a run) so that three interleaved pairs
per variant take well under a minute.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pandas as pd
import pytest

from tasks.data.datasets import EVENTS, GATES, TRIALS
from tasks.data.plan import load_plan
from tasks.data.store import read_dataset
from tasks.engine.clock import Event
from tasks.experiments.checkpoints import WORKLOAD_EXITED
from tasks.experiments.clocks import clock_of
from tasks.experiments.overhead import pair_order
from tests.support.common import demo_plan_dict

SHORT_RUN = [
    *demo_plan_dict()["workload"]["command"][:3],
    "--steps",
    "120",
    *demo_plan_dict()["workload"]["command"][5:],
]


@pytest.fixture
def short_plan(write_plan) -> Path:
    return write_plan({"workload.command": SHORT_RUN})


def _json(done) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.criu
def test_overhead_on_the_demo_plan(cli, short_plan: Path, criu_binary: str) -> None:
    result = _json(cli("overhead", str(short_plan), "--json", env={"CKPT_POC_CRIU": criu_binary}))
    plan = load_plan(short_plan)
    assert result["failed"] == 0, result["failures"]
    trials = read_dataset(TRIALS, data_dir=plan.data_dir, poc=plan.poc, run_id=result["run_id"])
    runs = trials[trials["measure"] == "overhead"]
    assert len(runs) == 2 * plan.repeats * 2
    assert runs[["run_s", "steps", "steps_per_s", "pair"]].notna().all().all()
    assert (runs["steps"] >= 100).all()
    # Interleaved: the order within each pair alternates, A B then B A.
    for variant, rows in runs.groupby("variant"):
        order = rows.sort_values("started_at")[["pair", "arm"]].itertuples(index=False)
        assert [tuple(o) for o in order] == [
            (pair, arm) for pair in range(plan.repeats) for arm in pair_order(pair)
        ], variant
    for variant in ("steady", "checkpointing"):
        comparison = result["variants"][variant]["comparison"]
        assert comparison["n"] == plan.repeats
        assert comparison["ci_low_pct"] <= comparison["overhead_pct"] <= comparison["ci_high_pct"]
    assert result["variants"]["steady"]["comparison"]["verdict"] in ("met", "not met", "undecided")
    assert result["variants"]["checkpointing"]["comparison"]["verdict"] == "not judged"
    # Every dump is a checkpoint row; all came from the checkpointing variant's managed runs.
    dumps = trials[trials["measure"] == "checkpoint"]
    # A dump that fails does so because the copy reached its last step while CRIU dumped it
    # (the last tick of a run): said so in its reason, never a silent or unexplained failure.
    failed = dumps[dumps["status"] != "ok"]
    assert failed["reason"].str.startswith(WORKLOAD_EXITED).all(), failed["reason"].tolist()
    assert len(failed) <= plan.repeats  # at most the last dump of each checkpointing run
    dumps = dumps[dumps["status"] == "ok"]
    assert len(dumps) > 0
    assert dumps[["dump_s", "freeze_s", "checkpoint_bytes"]].notna().all().all()
    assert dumps["trial_id"].str.startswith("checkpointing-").all()
    gates = read_dataset(GATES, data_dir=plan.data_dir, poc=plan.poc, run_id=result["run_id"])
    assert "no_checkpoint_inside_a_steady_span" in set(gates["expectation"])
    assert gates["success"].all()


@pytest.mark.criu
def test_cold_start_on_the_demo_plan(cli, short_plan: Path, criu_binary: str) -> None:
    result = _json(cli("cold-start", str(short_plan), "--json", env={"CKPT_POC_CRIU": criu_binary}))
    plan = load_plan(short_plan)
    assert result["failed"] == 0, result["failures"]
    trials = read_dataset(TRIALS, data_dir=plan.data_dir, poc=plan.poc, run_id=result["run_id"])
    starts = trials[trials["measure"] == "cold_start"]
    assert sorted(starts["arm"]) == ["managed"] * plan.repeats + ["unmanaged"] * plan.repeats
    assert starts["ready_s"].notna().all() and starts["page_cache"].notna().all()
    restores = starts[starts["arm"] == "managed"]
    assert (restores["checkpoint_bytes"] > 0).all() and (restores["restore_gbps"] > 0).all()
    # Equal when the restored copy's first line came before `criu restore` returned.
    assert (restores["restore_s"] <= restores["ready_s"]).all()
    assert restores["restore_fork_s"].notna().all()
    assert (
        abs(restores["restore_s"] + restores["restore_warmup_s"] - restores["ready_s"]) < 1e-6
    ).all()
    assert set(starts["clock"]) == {"launch→ready", "restore_start→ready"}
    speedup = result["speedup"]
    assert speedup["native"]["n"] == speedup["restore"]["n"] == plan.repeats
    assert speedup["ci_low"] <= speedup["speedup"] <= speedup["ci_high"]
    assert speedup["verdict"] in ("met", "not met", "undecided")
    assert result["restore_throughput"]["gbps"] > 0
    assert Path(result["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The same ready probe ended both clocks: one `ready` event per start.
    events = read_dataset(EVENTS, data_dir=plan.data_dir, poc=plan.poc, run_id=result["run_id"])
    assert (events["event"] == "ready").sum() == 2 * plan.repeats


def _event(trial: str, arm: str, name: str, t: int) -> Event:
    return Event(trial, arm, name, dt.datetime.now(dt.UTC), t, "h", {})


def _rows(measure: str, **columns) -> pd.DataFrame:
    base = {
        "measure": measure,
        "status": "ok",
        "nodes": "local-a",
        "workload_hash": "w",
        **{c: "x" for c in TRIALS.column_names if c.startswith("fp_")},
    }
    n = len(next(iter(columns.values())))
    rows = [{**base, **{k: v[i] for k, v in columns.items()}} for i in range(n)]
    for r in rows:  # each arm on its declared clock, as the stages write it
        r.setdefault("clock", clock_of(measure, r["arm"]))
    return pd.DataFrame(rows)
