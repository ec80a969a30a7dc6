"""The plan: every problem reported with its field path and YAML line; valid plans load."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.data.errors import PlanError
from tasks.data.plan import load_plan

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["demo.yaml", "slurm-example.yaml", "k8s-example.yaml"])
def test_shipped_plans_are_valid(name: str) -> None:
    # The examples' nodes are placeholders: checked on paper, not against whatever Slurm
    # SLURM_CONF may point at (tests/unit/test_plan_cluster.py checks against a real one).
    plan = load_plan(REPO / "plans" / name, check_cluster=False)
    assert plan.repeats >= 3


def _problems(path: Path) -> list[str]:
    with pytest.raises(PlanError) as info:
        load_plan(path)
    return info.value.problems


def test_missing_success_criterion_names_field_and_line(write_plan, delete_marker) -> None:
    path = write_plan({"success.overhead_pct": delete_marker})
    problems = _problems(path)
    assert any("success.overhead_pct: required field is missing" in p for p in problems)
    # The line is the 'success:' mapping that lacks it.
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if t == "success:")
    assert any(p.startswith(f"{path}:{line}: success.overhead_pct") for p in problems)


def test_every_problem_is_listed_at_once(write_plan) -> None:
    path = write_plan(
        {
            "cluster.nodes": ["node1; rm -rf /", "ok-node"],
            "faults": [{"kind": "meteor-strike"}],
            "repeats": 1,
        }
    )
    problems = _problems(path)
    text = "\n".join(problems)
    assert "cluster.nodes" in text and "not a safe name" in text
    assert "faults.0.kind" in text and "unknown fault kind 'meteor-strike'" in text
    assert "repeats" in text
    assert len(problems) >= 3
    lines = path.read_text().splitlines()
    for p in problems:
        line_no = int(p.split(":")[1])
        assert 1 <= line_no <= len(lines)
    node_line = next(p for p in problems if "cluster.nodes" in p)
    assert "rm -rf" in lines[int(node_line.split(":")[1]) - 1]


def test_fault_kind_must_fit_the_cluster(write_plan) -> None:
    problems = _problems(write_plan({"faults": [{"kind": "scancel"}]}))
    assert any("faults.0.kind: 'scancel' does not apply to a local cluster" in p for p in problems)


def test_window_shorter_than_the_measures_need(write_plan) -> None:
    problems = _problems(write_plan({"window.weeks": 2}))
    assert any("window.weeks" in p and "utilization_gain needs" in p for p in problems)


def test_exit_test_date_outside_window(write_plan) -> None:
    problems = _problems(write_plan({"exit.test_by": "2027-06-01"}))
    assert any("exit.test_by" in p for p in problems)


def test_command_must_be_an_argv_list(write_plan) -> None:
    problems = _problems(write_plan({"workload.command": "python train.py && rm -rf /"}))
    assert any("workload.command" in p and "argv list" in p for p in problems)


def test_more_than_two_nodes_is_not_a_contained_install(write_plan) -> None:
    problems = _problems(write_plan({"cluster.nodes": ["a", "b", "c"]}))
    assert any("cluster.nodes" in p for p in problems)


def test_unknown_field_is_reported(write_plan) -> None:
    problems = _problems(write_plan({"checkpointer.intervl_s": 3}))
    assert any("checkpointer.intervl_s" in p for p in problems)


def test_broken_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("poc: demo\nworkload: [unclosed\n")
    problems = _problems(path)
    assert problems[0].startswith(f"{path}:")
    assert "not valid YAML" in problems[0]


def test_missing_file(tmp_path: Path) -> None:
    problems = _problems(tmp_path / "nope.yaml")
    assert "cannot read plan" in problems[0]


def test_baseline_max_quarantined_share_defaults_and_is_bounded(write_plan) -> None:
    assert load_plan(write_plan()).baseline.max_quarantined_share == 0.5
    strict = load_plan(write_plan({"baseline.max_quarantined_share": 0.1}))
    assert strict.baseline.max_quarantined_share == 0.1
    for bad in (-0.1, 1.5, float("nan"), float("inf")):
        problems = _problems(write_plan({"baseline.max_quarantined_share": bad}))
        assert any(": baseline.max_quarantined_share: " in p for p in problems), problems


def test_slurmrestd_source_checks_url_and_names(write_plan) -> None:
    good = {"kind": "slurmrestd", "url": "https://rest.example:6820/", "token_secret": "jwt-1"}
    plan = load_plan(write_plan({"baseline.source": {**good, "window_days": 7}}))
    assert plan.baseline.source.url == "https://rest.example:6820"
    assert plan.baseline.source.window_days == 7 and plan.baseline.source.user is None
    bad = {
        **good,
        "url": "ftp://rest.example",
        "token_secret": "a b",
        "user": "x;y",
        "window_days": 0,
    }
    problems = "\n".join(_problems(write_plan({"baseline.source": bad})))
    for field in ("url", "token_secret", "user", "window_days"):
        assert f"baseline.source.{field}:" in problems, field
    assert "http(s) URL" in problems
    secret_in_url = {**good, "url": "https://me:hunter2@rest.example"}
    problems = "\n".join(_problems(write_plan({"baseline.source": secret_in_url})))
    assert "must not carry credentials" in problems
