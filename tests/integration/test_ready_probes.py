"""Ready probes as Kubernetes offers them (url, tcp, exec) and a log line: each says ready when
its server is, and its last answer when it never is; the plan's cold_start.workload picks the
server cold start times; and cold start times a real server that speaks no HTTP (Redis, by
a TCP connect and by its own log line) through real CRIU."""

from __future__ import annotations

import pytest
import yaml

from tasks.data.plan import load_plan
from tasks.data.runctx import open_run
from tests.unit.test_ready_probes import _plan_file, _redis_cold_start_plan


@pytest.mark.criu
@pytest.mark.parametrize(
    ("ready_probe", "signal"),
    [
        ({"tcp": "{port}"}, "accepts a connection"),
        ({"log": "Ready to accept connections"}, "has a line matching"),
    ],
)
def test_cold_start_times_redis_by_a_probe_that_is_not_http(
    tmp_path, criu_binary, monkeypatch, ready_probe, signal
) -> None:
    from tasks.data.datasets import EVENTS
    from tasks.data.store import read_dataset
    from tasks.experiments.cold_start import cold_start_result, run_cold_start

    monkeypatch.setenv("CKPT_POC_CRIU", criu_binary)
    path = _redis_cold_start_plan(tmp_path, ready_probe)
    plan = load_plan(path, check_cluster=False)
    with open_run(plan, path, "cold_start") as ctx:
        run = run_cold_start(plan, ctx, timeout_s=60)
    starts = run.trials[run.trials["measure"] == "cold_start"]
    assert (starts["status"] == "ok").all(), starts[["arm", "reason"]].to_dict("records")
    assert sorted(starts["arm"]) == ["managed"] * 3 + ["unmanaged"] * 3
    restores = starts[starts["arm"] == "managed"]
    assert (restores["checkpoint_bytes"] > 0).all()
    assert (restores["restore_s"] <= restores["ready_s"]).all()
    events = read_dataset(EVENTS, data_dir=plan.data_dir, poc=plan.poc, run_id=ctx.run_id)
    ready = events[events["event"] == "ready"]
    assert len(ready) == 6  # one per start, native and restored
    result = cold_start_result(run, plan, ctx, [], tmp_path / "plot.png")
    assert result.workload == "redis" and signal in result.ready_signal


@pytest.mark.criu
def test_images_go_to_the_plans_images_dir_and_every_row_says_where(
    tmp_path, criu_binary, monkeypatch
) -> None:
    """checkpointer.images_dir: the images of every dump and restore are there, each row
    names the folder and its file system, the restores carry a plain read of the same bytes
    beside their own GB/s, the dumps their write GB/s; and the exit snapshots never walk it."""
    from tasks.data.runctx import make_run_context
    from tasks.exit.snapshots import _data_dirs
    from tasks.experiments.cold_start import run_cold_start

    monkeypatch.setenv("CKPT_POC_CRIU", criu_binary)
    data = yaml.safe_load(_redis_cold_start_plan(tmp_path, {"tcp": "{port}"}).read_text())
    scratch = tmp_path / "scratch"
    data["checkpointer"]["images_dir"] = str(scratch)
    path = _plan_file(tmp_path, data)
    plan = load_plan(path, check_cluster=False)
    with open_run(plan, path, "cold_start") as ctx:
        run = run_cold_start(plan, ctx, timeout_s=60)
    rows = run.trials
    restores = rows[(rows["measure"] == "cold_start") & (rows["arm"] == "managed")]
    dumps = rows[rows["measure"] == "checkpoint"]
    assert (restores["status"] == "ok").all() and len(dumps) == 3
    for part in (restores, dumps):
        assert part["images_dir"].str.startswith(str(scratch / plan.poc / "runs")).all()
        assert part["images_fs"].notna().all()
    assert (restores["raw_read_gbps"] > 0).all() and (dumps["images_write_gbps"] > 0).all()
    assert not list(run.run_dir.rglob("*.img"))  # none beside the run's records
    assert list(scratch.rglob("*.img"))
    assert run.summary.images is not None and run.summary.images.raw_read_gbps > 0
    assert str(scratch.resolve() / plan.poc) in _data_dirs(plan, make_run_context(plan, path))
