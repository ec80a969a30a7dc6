"""Gates bind the verdicts: the six checks, computed once per week's rows, hold only
the verdicts they guard; evidence short of the plan's minimum is undecided; the plan's decision
rule turns the verdicts into adopt / reject / extend / undecided."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from tasks.data.datasets import EXPOSURE, TRIALS
from tasks.data.errors import PlanError
from tasks.data.plan import load_plan
from tasks.experiments.clocks import MEASURE_CLOCKS, clock_problems
from tasks.poc.record.decision import decide
from tasks.window.weekly.rows import week_report
from tests.unit.test_weekly import (
    REPO,
    W1,
    exposure_rows,
    frame,
    full_frames,
    make_plan,
    row,
)

JUDGED = ("recovery_s", "work_lost_gpu_h", "overhead_pct", "cold_start_speedup")


def _with_trials(frames: dict[str, pd.DataFrame], edit: Any) -> dict[str, pd.DataFrame]:
    rows = frames["trials"].to_dict("records")
    rows = edit(rows)
    return {**frames, "trials": frame(rows, TRIALS)}


def _verdicts(frames: dict[str, pd.DataFrame]) -> tuple[dict[str, dict[str, Any]], Any]:
    report = week_report(make_plan(), frames, W1, n_resamples=200)
    judged = {
        m: row(report.rows, m, "managed" if m in ("recovery_s", "work_lost_gpu_h") else "both")
        for m in JUDGED
    }
    return judged, {g.gate: g for g in report.gates}


def test_clock_declaration_cold_start_pair_ends_on_ready() -> None:
    cold = MEASURE_CLOCKS["cold_start"]
    assert cold["unmanaged"].start != cold["managed"].start
    assert cold["unmanaged"].stop == cold["managed"].stop == "ready"
    ok = {a: [c.name] for a, c in cold.items()}
    assert clock_problems("cold_start", ok) == []
    swapped = {"unmanaged": [cold["managed"].name], "managed": [cold["managed"].name]}
    assert clock_problems("cold_start", swapped)


def test_cold_starts_two_clocks_pass_gate_two() -> None:
    verdicts, gates = _verdicts(full_frames())
    assert gates["different_clocks"].passed, gates["different_clocks"].reason
    assert verdicts["cold_start_speedup"]["verdict"] == "met"


def test_a_failed_gate_blocks_the_verdicts_it_guards_and_only_those() -> None:
    before, _ = _verdicts(full_frames())

    def other_clock(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for r in rows:
            if r["measure"] == "recovery" and r["arm"] == "unmanaged":
                r["clock"] = "fault_delivered→first_progress"
        return rows

    after, gates = _verdicts(_with_trials(full_frames(), other_clock))
    g = gates["different_clocks"]
    assert not g.passed and set(g.guards) == {"recovery_s", "work_lost_gpu_h"}
    for m in ("recovery_s", "work_lost_gpu_h"):
        assert after[m]["verdict"] == "blocked"
        assert after[m]["note"].startswith("different_clocks: recovery/unmanaged: timed on")
    for m in ("overhead_pct", "cold_start_speedup"):  # untouched
        assert (after[m]["verdict"], after[m]["note"]) == (before[m]["verdict"], before[m]["note"])


def test_arms_on_different_pairs_fail_gate_two_for_that_measure() -> None:
    def native_clock_on_restore(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for r in rows:
            if r["measure"] == "cold_start" and r["arm"] == "managed":
                r["clock"] = MEASURE_CLOCKS["cold_start"]["unmanaged"].name
        return rows

    after, gates = _verdicts(_with_trials(full_frames(), native_clock_on_restore))
    assert not gates["different_clocks"].passed
    assert list(gates["different_clocks"].guards) == ["cold_start_speedup"]
    assert after["cold_start_speedup"]["verdict"] == "blocked"
    assert after["recovery_s"]["verdict"] == "met"


def test_evidence_short_of_repeats_is_undecided_needs_has() -> None:
    def two_managed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        managed = [r for r in rows if r["measure"] == "recovery" and r["arm"] == "managed"]
        drop = {id(r) for r in managed[2:]}
        return [r for r in rows if id(r) not in drop]

    after, gates = _verdicts(_with_trials(full_frames(), two_managed))
    five = gates["one_run_per_configuration"]
    assert not five.passed and five.effect == "undecided"
    rec = after["recovery_s"]
    assert rec["verdict"] == "undecided" and rec["note"].startswith("needs 3, has 2")
    assert after["cold_start_speedup"]["verdict"] == "met"


def test_no_unmanaged_rows_block_that_comparison_only() -> None:
    frames = _with_trials(
        full_frames(),
        lambda rows: [
            r for r in rows if not (r["measure"] == "cold_start" and r["arm"] == "unmanaged")
        ],
    )
    after, gates = _verdicts(frames)
    assert not gates["no_baseline"].passed
    assert list(gates["no_baseline"].guards) == ["cold_start_speedup"]
    # Nothing to compare: the row has no data to judge (held or not), the others stand.
    assert after["cold_start_speedup"]["verdict"] == "no data"
    assert after["recovery_s"]["verdict"] == "met"


def test_a_check_with_nothing_to_look_at_guards_nothing() -> None:
    frames = {"exposure": frame(exposure_rows(), EXPOSURE)}
    report = week_report(make_plan(), frames, W1, n_resamples=100)
    assert all(not g.guards for g in report.gates)
    assert set(report.rows[report.rows["criterion"].notna()]["verdict"]) == {"no data"}


# --- the decision --------------------------------------------------------------------------------


def _rows(**verdicts: str) -> dict[str, dict[str, Any]]:
    base = {"n": 5, "value": 1.0, "ci_low": 0.5, "ci_high": 1.5, "threshold": 2.0, "note": ""}
    return {m: {**base, "verdict": v} for m, v in verdicts.items()}


ALL_MET = dict.fromkeys((*JUDGED, "goodput_gain", "exit_leftovers"), "met")


def test_decision_adopt_reject_and_rule_text() -> None:
    plan = make_plan()
    today = plan.window.start
    d = decide(plan, _rows(**ALL_MET), today)
    assert d.decision == "adopt" and "every criterion met" in d.reason
    d = decide(plan, _rows(**{**ALL_MET, "overhead_pct": "not met"}), today)
    assert (d.decision, d.reason) == ("reject", "not met: overhead_pct")
    assert "reject when any is not met" in d.rule


def test_decision_open_criteria_say_what_settles_them() -> None:
    plan = make_plan()
    rows = _rows(**{**ALL_MET, "overhead_pct": "undecided", "recovery_s": "blocked"})
    rows["goodput_gain"].update(verdict="undecided", note="needs 4, has 1: weeks with both arms")
    rows["recovery_s"]["note"] = "different_clocks: recovery/unmanaged: timed on x"
    del rows["exit_leftovers"]
    d = decide(plan, rows, plan.window.start)
    assert d.decision == "undecided" and f"the window runs to {plan.window.end}" in d.reason
    settle = {o.criterion: o for o in d.open}
    assert set(settle) == {"recovery_time_s", "utilization_gain", "overhead_pct", "exit"}
    assert settle["recovery_time_s"].basis == "gate"
    assert settle["recovery_time_s"].verdict.startswith("blocked: different_clocks")
    assert settle["utilization_gain"].settle.startswith("3 more weeks with both arms")
    est = settle["overhead_pct"]
    assert est.basis == "estimate" and "an estimate" in est.settle
    assert est.inputs == {"n": 5, "value": 1.0, "ci": [0.5, 1.5], "threshold": 2.0}
    assert settle["exit"].basis == "not run" and "`exit_diff`" in settle["exit"].settle


def test_decision_extends_after_the_window_then_stays_undecided() -> None:
    plan = make_plan(**{"decision.extend_weeks": 2})
    rows = _rows(**{**ALL_MET, "overhead_pct": "undecided"})
    end = plan.window.end
    d = decide(plan, rows, end)
    assert d.decision == "extend" and d.extend_to == (end + dt.timedelta(weeks=2)).isoformat()
    assert decide(plan, rows, end + dt.timedelta(weeks=3)).decision == "undecided"
    never = make_plan(**{"decision.extend_weeks": 0})
    assert decide(never, rows, end).decision == "undecided"


def test_decision_all_not_met_rule() -> None:
    plan = make_plan(**{"decision.reject": "all-not-met", "decision.criteria": ["overhead_pct"]})
    assert decide(plan, _rows(overhead_pct="not met"), plan.window.start).decision == "reject"
    plan = make_plan(
        **{"decision.reject": "all-not-met", "decision.criteria": ["overhead_pct", "exit"]}
    )
    rows = _rows(overhead_pct="not met", exit_leftovers="met")
    assert decide(plan, rows, plan.window.start).decision == "undecided"


@pytest.mark.parametrize(
    ("decision", "field"),
    [
        ({"criteria": ["recovery_time_s", "speed"]}, "decision.criteria.1"),
        ({"criteria": ["exit", "exit"]}, "decision.criteria"),
        ({"reject": "sometimes"}, "decision.reject"),
        ({"extend_weeks": -1}, "decision.extend_weeks"),
    ],
)
def test_plan_check_names_the_bad_decision_field(
    tmp_path: Path, decision: dict[str, Any], field: str
) -> None:
    data = yaml.safe_load((REPO / "plans" / "demo.yaml").read_text())
    data["decision"] = decision
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(PlanError) as err:
        load_plan(path, check_cluster=False)
    assert f"{field}:" in str(err.value)


def test_example_plans_state_their_decision_rule() -> None:
    for name in ("demo.yaml", "slurm-example.yaml", "k8s-example.yaml"):
        data = yaml.safe_load((REPO / "plans" / name).read_text())
        assert "decision" in data, name
