"""Where the PoC stands (tasks/poc/progress.py) from committed datasets, and the `poc` flow
(flows/poc.py) run from the terminal: stages in order, done ones skipped, refused gates."""

from __future__ import annotations

import json
import time

import pytest

from tasks.data.plan import load_plan
from tasks.data.runs import committed_runs
from tasks.poc.stages import WINDOW_DEPLOYMENTS
from tests.unit.test_poc import _commit, _env, _poc, _trials, plan, stack_api  # noqa: F401

# alone: its PoC's exit diff snapshots the whole node
pytestmark = pytest.mark.alone


def test_poc_runs_stages_in_order_and_a_rerun_skips_what_is_done(write_plan, tmp_path) -> None:
    path = write_plan({"cluster.nodes": ["local-a"]})  # one node: one snapshot (~5-10 s)
    plan = load_plan(path, check_cluster=False)
    env = _env(tmp_path)

    first = _poc(path, "--until", "baseline", "--json", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    result = json.loads(first.stdout.strip().splitlines()[-1])
    assert result["ran"] == ["plan_check", "baseline"]
    assert result["stopped"] == "after baseline"
    assert result["state"]["stages"]["before_install"]["status"] == "due"
    assert [r["stage"] for r in committed_runs(plan.data_dir, plan.poc).values()] == ["baseline"]

    second = _poc(path, "--until", "opt_in", "--json", env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    result = json.loads(second.stdout.strip().splitlines()[-1])
    assert result["skipped"] == ["baseline"]
    assert result["ran"] == ["plan_check", "before_install", "install", "opt_in"]
    assert result["state"]["stages"]["opt_in"]["status"] == "done"
    assert result["state"]["stages"]["recovery"] == {
        "status": "due",
        "why": "no committed recovery run",
    }
    runs = committed_runs(plan.data_dir, plan.poc)

    third = _poc(path, "--until", "opt_in", env=env)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "ran: plan_check; skipped (done): baseline, before_install, install, opt_in" in (
        third.stdout
    )
    assert committed_runs(plan.data_dir, plan.poc) == runs  # nothing ran again

    # The range and the comparisons done (planted here: they take minutes): next is the
    # window, which is never run inline. This command's own Prefect server has no window
    # deployments: said.
    _commit(plan, "compatibility")
    for measure in ("recovery", "overhead", "cold_start"):
        _commit(plan, measure, _trials(measure, managed="ok", unmanaged="ok"))
    fourth = _poc(path, "--until", "record", "--json", env=env)
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    result = json.loads(fourth.stdout.strip().splitlines()[-1])
    assert result["ran"] == ["plan_check"]
    assert result["stopped"] == "window"
    assert result["window"]["missing"] == list(WINDOW_DEPLOYMENTS)
    assert "could not switch on the window's schedules" in fourth.stderr + fourth.stdout


def test_an_invalid_plan_stops_poc_with_the_plans_own_problems(write_plan, tmp_path) -> None:
    path = write_plan({"repeats": 0})
    result = _poc(path, env=_env(tmp_path))
    assert result.returncode == 1
    assert "repeats" in result.stderr
    assert not (tmp_path / "data").exists()  # nothing ran


def test_the_window_deployments_schedules_are_switched_on_and_their_next_runs_read(
    stack_api, prefect_stack
) -> None:
    """On a real server with prefect.yaml's deployments (the demo plan deploys the window's
    schedules inactive): poc's activation switches them on, status reads the next runs."""
    from flows.poc import activate_window
    from tasks.poc.progress import next_scheduled_runs

    def actives() -> dict[str, list[bool]]:
        return {
            name: [s["active"] for s in prefect_stack.deployment(*name.split("/"))["schedules"]]
            for name in WINDOW_DEPLOYMENTS
        }

    assert all(v and not any(v) for v in actives().values()), actives()
    try:
        out = activate_window()
        assert out.to_json()["missing"] == []
        assert all(v and all(v) for v in actives().values()), actives()
        deadline = time.monotonic() + 60  # the scheduler makes the runs every 5 s here
        sched = next_scheduled_runs()
        while time.monotonic() < deadline and not (sched.runs or {}).get(
            "sample_window/sample_window"
        ):
            time.sleep(2)
            sched = next_scheduled_runs()
        assert sched.available is True, sched
        assert (sched.runs or {})["sample_window/sample_window"], sched
    finally:
        activate_window(active=False)
        # The session's other tests must not meet hourly sampler runs made meanwhile.
        for name in WINDOW_DEPLOYMENTS:
            dep = prefect_stack.deployment(*name.split("/"))
            runs = prefect_stack.api(
                "POST",
                "flow_runs/filter",
                {
                    "flow_runs": {
                        "deployment_id": {"any_": [dep["id"]]},
                        "state": {"type": {"any_": ["SCHEDULED"]}},
                    }
                },
            )
            for run in runs:
                prefect_stack.api("DELETE", f"flow_runs/{run['id']}")
    assert all(v and not any(v) for v in actives().values()), actives()
