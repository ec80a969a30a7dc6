"""Where the PoC stands (tasks/poc/progress.py) from committed datasets, and the `poc` flow
(flows/poc.py) run from the terminal: stages in order, done ones skipped, refused gates."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd
import pytest

from tasks.data.datasets import DATASETS, DatasetSpec
from tasks.data.plan import Plan, load_plan
from tasks.data.runs import commit_run
from tasks.data.store import write_dataset
from tasks.poc.progress import GateRefused, StageState, next_stage, poc_state
from tasks.poc.record.build import DecisionRecord
from tasks.poc.stages import STAGE_NAMES
from tests.support.common import REPO

NOW = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)


def _row(spec: DatasetSpec, **values: Any) -> dict[str, Any]:
    """A row of every column: required ones filled (its first allowed value, or a plain one)."""
    row: dict[str, Any] = {}
    for c in spec.columns:
        if c.nullable:
            row[c.name] = None
            continue
        t = str(c.type)
        if c.allowed:
            row[c.name] = c.allowed[0]
        elif t.startswith("timestamp"):
            row[c.name] = NOW
        elif t == "bool":
            row[c.name] = False
        elif t.startswith("int"):
            row[c.name] = 1
        elif t == "double":
            row[c.name] = 1.0
        else:
            row[c.name] = "x"
    return {**row, **values}


def _commit(
    plan: Plan,
    stage: str,
    rows: dict[str, list[dict[str, Any]]] | None = None,
    outcome: str = "complete",
) -> str:
    """One committed run of ``stage`` with ``rows`` written the way every stage writes them."""
    run_id = f"{stage}-{uuid.uuid4().hex[:8]}"
    for name, dicts in (rows or {}).items():
        spec = DATASETS[name]
        frame = pd.DataFrame([_row(spec, poc=plan.poc, run_id=run_id, **d) for d in dicts])
        write_dataset(frame, spec, data_dir=plan.data_dir, poc=plan.poc, run_id=run_id)
    commit_run(plan.data_dir, plan.poc, run_id, stage, outcome)
    return run_id


def _snapshot(node: str) -> dict[str, list[dict[str, Any]]]:
    return {"snapshots": [{"node": node, "phase": "before_install", "kind": "files", "key": "/a"}]}


def _trials(measure: str, **arms: str) -> dict[str, list[dict[str, Any]]]:
    return {"trials": [{"measure": measure, "arm": a, "status": s} for a, s in arms.items()]}


@pytest.fixture
def plan(write_plan) -> Plan:
    return load_plan(write_plan(), check_cluster=False)  # nodes local-a, local-b


def _status(plan: Plan) -> dict[str, tuple[str, str | None]]:
    state = poc_state(plan, plan.data_dir)
    return {s: (e.status, e.why) for s, e in state.stages.items()}


def test_a_new_poc_is_due_for_its_baseline_and_blocked_after_it(plan: Plan) -> None:
    st = _status(plan)
    assert list(st) == list(STAGE_NAMES)
    assert st["plan_check"] == ("done", None)
    assert st["baseline"] == ("due", "no committed baseline")
    assert st["before_install"] == ("blocked", "no committed baseline")
    status, why = st["install"]
    assert status == "blocked"
    assert "no committed baseline" in why
    assert "no before_install snapshot of node local-a" in why
    assert "no before_install snapshot of node local-b" in why
    assert st["record"][0] == "blocked"


def test_a_refused_baseline_does_not_count(plan: Plan) -> None:
    _commit(plan, "baseline", outcome="refused: gate 'jobs_valid' failed")
    status, why = _status(plan)["baseline"]
    assert status == "due"
    assert "no committed baseline" in why and "jobs_valid" in why


def test_install_waits_for_the_before_snapshot_of_every_node(plan: Plan) -> None:
    _commit(plan, "baseline")
    _commit(plan, "snapshot", _snapshot("local-a"))
    st = _status(plan)
    assert st["baseline"][0] == "done"
    assert st["before_install"] == ("due", "no before_install snapshot of node local-b")
    assert st["install"] == ("blocked", "no before_install snapshot of node local-b")
    # A partial snapshot is no before snapshot.
    _commit(
        plan, "snapshot", {"snapshots": [{**_snapshot("local-b")["snapshots"][0], "partial": True}]}
    )
    assert "before_install snapshot of node local-b is partial" in _status(plan)["install"][1]
    # A later whole snapshot is the one that counts (the newest, by taken_at).
    whole = {**_snapshot("local-b")["snapshots"][0], "taken_at": NOW + dt.timedelta(hours=1)}
    _commit(plan, "snapshot", {"snapshots": [whole]})
    st = _status(plan)
    assert st["before_install"][0] == "done"
    assert st["install"] == ("due", "not installed (no committed install)")
    assert st["opt_in"] == ("blocked", "not installed (no committed install)")


def _installed(plan: Plan) -> None:
    _commit(plan, "baseline")
    _commit(
        plan,
        "snapshot",
        {"snapshots": _snapshot("local-a")["snapshots"] + _snapshot("local-b")["snapshots"]},
    )
    _commit(plan, "install")
    _commit(plan, "opt_in")


def test_no_comparison_without_ok_trials_on_both_arms(plan: Plan) -> None:
    _installed(plan)
    _commit(plan, "recovery", _trials("recovery", managed="ok", unmanaged="failed"))
    st = _status(plan)
    msg = "recovery has no ok trials on the unmanaged arm"
    assert st["recovery"] == ("due", msg)
    assert st["overhead"] == ("blocked", msg)
    # Trials of a run a gate refused are not counted.
    _commit(
        plan, "recovery", _trials("recovery", unmanaged="ok"), outcome="refused: gate 'g' failed"
    )
    assert _status(plan)["recovery"] == ("due", msg)
    _commit(plan, "recovery", _trials("recovery", unmanaged="ok"))
    st = _status(plan)
    assert st["recovery"][0] == "done"
    assert st["overhead"] == ("due", "no committed overhead run")
    # The way out waits for the comparisons; the record for the exit diff.
    assert st["uninstall"] == ("blocked", "no committed cold_start run")
    _commit(plan, "uninstall")
    st = _status(plan)
    assert st["uninstall"][0] == "done"
    assert st["exit_diff"] == ("due", "no exit diff after the uninstall")
    assert "no exit diff after the uninstall" in st["record"][1]


def test_window_weeks_gaps_and_failed_gates(plan: Plan) -> None:
    _installed(plan)
    week2 = NOW + dt.timedelta(days=7)
    sample = {"t_from": NOW, "t_to": NOW}
    _commit(plan, "sample_window", {"samples": [sample, {"t_from": week2, "t_to": week2}]})
    gap = {"t_from": NOW, "t_to": NOW, "gap_s": 30.0, "reason": "sampler down"}
    _commit(plan, "sample_window", {"sample_gaps": [gap, {**gap, "gap_s": 12.5}]})
    gate = {"gate": "samples_valid", "dataset": "samples", "expectation": "e"}
    _commit(plan, "sample_window", {"gates": [{**gate, "success": False}]})
    state = poc_state(plan, plan.data_dir)
    assert state.window.weeks_sampled == 2
    assert state.window.gap_s == pytest.approx(42.5)
    assert state.stages["window"].to_json() == {
        "status": "due",
        "why": "window: 2 of 4 week(s) sampled",
    }
    assert state.stages["weekly_report"].status == "blocked"
    assert [g["gate"] for g in state.failed_gates] == ["samples_valid"]
    # A later passing check of the same gate clears it.
    later = NOW + dt.timedelta(hours=1)
    _commit(plan, "sample_window", {"gates": [{**gate, "success": True, "checked_at": later}]})
    assert poc_state(plan, plan.data_dir).failed_gates == []
    # The demo's short window needs one sampled week, not the plan's four.
    short = poc_state(plan, plan.data_dir, window_weeks=1)
    assert short.stages["window"].to_json() == {"status": "done", "why": None}
    assert short.weeks_planned == 1
    assert short.stages["weekly_report"].status == "due"
    # No PREFECT_API_URL: the scheduled runs are skipped, saying so.
    if not os.environ.get("PREFECT_API_URL"):
        assert poc_state(plan, plan.data_dir).scheduled.available is False


def test_the_next_stage_is_refused_at_a_gate_with_its_own_message(plan: Plan) -> None:
    _installed(plan)
    _commit(plan, "compatibility")
    _commit(plan, "recovery", _trials("recovery", managed="ok", unmanaged="failed"))
    state = poc_state(plan, plan.data_dir)
    assert next_stage(state, "opt_in", []) is None  # everything up to opt_in is done
    assert next_stage(state, "overhead", []) == "recovery"
    # It ran in this run and still is not done: refused, never run again.
    with pytest.raises(GateRefused, match="recovery ran but is not done: recovery has no ok"):
        next_stage(state, "overhead", ["recovery"])
    # A blocked stage first in line (install undone by hand here) is refused with why.
    state.stages["install"] = StageState("blocked", "no committed baseline")
    with pytest.raises(GateRefused, match="install refused: no committed baseline"):
        next_stage(state, "overhead", [])


# --- the flow, from the terminal ------------------------------------------------------------


def _env(tmp_path: Path) -> dict[str, str]:
    """No Prefect server configured: the command starts its own, with a private home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return {**env, "PREFECT_HOME": str(tmp_path / "prefect-home")}


def _poc(plan: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", "poc", str(plan), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def stack_api(prefect_stack, monkeypatch):
    """PREFECT_API_URL of the session's stack, in the environment and in Prefect's settings
    (Prefect read the environment once, when it was imported)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setenv("PREFECT_API_URL", prefect_stack.api_url)
    with temporary_settings({PREFECT_API_URL: prefect_stack.api_url}):
        yield prefect_stack


def test_the_record_is_done_once_written_after_the_last_committed_run(plan: Plan) -> None:
    assert _status(plan)["record"][0] == "blocked"
    for stage in ("uninstall", "weekly_report", "exit_diff"):
        _commit(plan, stage)
    assert _status(plan)["record"] == ("due", "no decision record")
    html = Path(plan.data_dir) / plan.poc / "record" / "decision-record.html"
    html.parent.mkdir(parents=True)
    html.write_text("<html></html>")
    assert _status(plan)["record"] == ("done", None)
    os.utime(html, (0, 0))  # written before the uninstall was committed: stale
    assert _status(plan)["record"] == (
        "due",
        "the decision record is older than the last committed run",
    )


def test_status_shows_the_stage_table_and_keeps_its_keys(write_plan, tmp_path) -> None:
    path = write_plan()
    plan = load_plan(path, check_cluster=False)
    _commit(plan, "baseline")
    env = _env(tmp_path)
    cli = [sys.executable, "-m", "cli", "status", str(path)]
    done = subprocess.run([*cli, "--json"], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert {"data_dir", "committed", "running", "uncommitted", "stale_tmp_files"} <= set(summary)
    assert summary["committed"]["baseline"]["runs"] == 1
    assert summary["stages"]["baseline"] == {"status": "done", "why": None}
    assert summary["stages"]["before_install"]["status"] == "due"
    assert summary["progress"]["weeks_sampled"] == 0
    text = subprocess.run(cli, cwd=REPO, env=env, capture_output=True, text=True)
    assert text.returncode == 0, text.stderr
    assert "baseline: 1 committed run(s)" in text.stdout
    assert "install         blocked: no before_install snapshot of node local-a" in text.stdout


# --- a second demo says what it is (cli/poc.py) ------------------------------------------------


def _finished_result(plan: Plan) -> dict[str, Any]:
    """What `poc(..., short_window=True)` returns over a PoC folder already complete: only
    plan_check ran, every other stage skipped, no `exit` or `record` key."""
    return {
        "poc": plan.poc,
        "ran": ["plan_check"],
        "skipped": list(STAGE_NAMES[1:]),
        "stopped": "complete",
        "state": {"stages": {s: {"status": "done", "why": None} for s in STAGE_NAMES}},
    }


RECORD = {
    "verdicts": {"recovery_time_s": "met", "utilization_gain": "undecided: needs 4, has 1"},
    "decision": "extend",
    "decision_reason": "utilization_gain is undecided",
    "html": "data/demo/record/decision-record.html",
    "pdf": "data/demo/record/decision-record.pdf",
}


def _decision_record(**given: Any) -> DecisionRecord:
    """A decision record saying only ``given`` (the demo's ending reads no more of it)."""
    blank: dict[str, Any] = {
        "html": "",
        "pdf": "",
        "week": "",
        "decision": "",
        "decision_reason": "",
        "decision_detail": {},
        "verdicts": {},
        "gates": {},
        "exit": "",
        "table": [],
        "compatibility": {},
    }
    return DecisionRecord(**{**blank, **given})


def test_a_second_demo_prints_what_the_poc_has_and_says_nothing_was_rerun(plan: Plan) -> None:
    from cli.poc import demo_summary, demo_summary_lines

    _commit(
        plan,
        "exit_diff",
        {
            "exit_verdicts": [
                {"node": "local-a", "verdict": "leftovers", "leftovers": 1},
                {"node": "local-b", "verdict": "clean", "leftovers": 0},
            ],
            "exit_diff": [
                {"node": "local-a", "kind": "files", "key": "/etc/profile.d/criu.sh"},
            ],
        },
    )
    asked: list[str] = []

    def read_record(p: Plan) -> DecisionRecord:
        asked.append(p.poc)
        return _decision_record(**RECORD)

    summary = demo_summary(_finished_result(plan), plan, Path("p.yaml"), read_record=read_record)
    assert asked == [plan.poc]  # the record is read from the data, never written again
    lines = demo_summary_lines(summary)
    text = "\n".join(t for _, t in lines)
    assert lines[0] == ("rule", f"PoC {plan.poc}: every stage was already done; nothing was re-run")
    assert "exit verdict: not reached" not in text
    assert ("bad", "exit verdict: leftovers: 1 (committed before this run)") in lines
    assert "  leftover: local-a files /etc/profile.d/criu.sh (added)" in text
    assert "  recovery_time_s: met" in text and "  utilization_gain: undecided: needs 4" in text
    assert "decision: extend: utilization_gain is undecided" in text
    assert f"decision record: {RECORD['html']}" in text
    assert lines[-1][1].startswith("to run the demo afresh: ckpt-poc demo --fresh")
    assert "scripts/demo --fresh" in lines[-1][1] and "kept as it is" in lines[-1][1]


def test_a_second_demo_over_a_clean_exit_reads_clean(plan: Plan) -> None:
    from cli.poc import demo_summary, demo_summary_lines

    verdicts = [{"node": n, "verdict": "clean", "leftovers": 0} for n in plan.cluster.nodes]
    _commit(plan, "exit_diff", {"exit_verdicts": verdicts})
    summary = demo_summary(
        _finished_result(plan), plan, Path("p.yaml"), read_record=lambda p: _decision_record()
    )
    assert summary.exit["verdict"] == "clean" and summary.exit["leftovers"] == []
    assert ("good", "exit verdict: clean (committed before this run)") in demo_summary_lines(
        summary
    )


def test_a_first_demo_prints_its_own_results_and_no_rerun_notice(plan: Plan) -> None:
    from cli.poc import demo_summary, demo_summary_lines

    result = {
        **_finished_result(plan),
        "ran": ["plan_check", *STAGE_NAMES[1:]],
        "skipped": [],
        "exit": {"verdict": "clean", "leftovers": []},
        "record": {k: RECORD[k] for k in ("html", "pdf", "verdicts")},
    }

    def never(p: Plan) -> NoReturn:
        raise AssertionError("a stage that ran this time is not read back")

    summary = demo_summary(result, plan, Path("p.yaml"), read_exit=never, read_record=never)
    text = "\n".join(t for _, t in demo_summary_lines(summary))
    assert "nothing was re-run" not in text and "--fresh" not in text
    assert "exit verdict: clean (this run)" in text and "  recovery_time_s: met" in text


def test_a_demo_not_yet_at_the_way_out_says_so(plan: Plan) -> None:
    from cli.poc import demo_summary, demo_summary_lines

    result = _finished_result(plan)
    for name in ("uninstall", "exit_diff", "record"):
        result["state"]["stages"][name] = {"status": "blocked", "why": "x"}
    result["ran"], result["skipped"] = ["plan_check", "baseline"], ["before_install"]
    lines = demo_summary_lines(demo_summary(result, plan, Path("p.yaml")))
    assert ("note", "already done, not re-run: before_install") in lines
    assert ("bad", "exit verdict: not reached (uninstall and exit_diff not done)") in lines


def test_demo_fresh_starts_a_new_poc_folder_and_leaves_the_old_one(plan: Plan, write_plan) -> None:
    from cli.poc import fresh_plan
    from tasks.data.errors import CkptPocError

    path = write_plan()
    original = path.read_text()
    _commit(plan, "baseline")
    old = Path(plan.data_dir) / plan.poc
    before = sorted(p.relative_to(old) for p in old.rglob("*"))
    now = dt.datetime(2026, 12, 1, 15, 4, 5, tzinfo=dt.UTC)
    derived = fresh_plan(path, now=now)
    assert derived == Path(plan.data_dir) / "demo-20261201T150405Z" / "plan.yaml"
    fresh = load_plan(derived, check_cluster=False)
    assert fresh.poc == "demo-20261201T150405Z"
    # Only the poc differs: the same plan otherwise, the same data folder beside the old one.
    assert fresh.model_dump(exclude={"poc"}) == plan.model_dump(exclude={"poc"})
    assert path.read_text() == original
    assert sorted(p.relative_to(old) for p in old.rglob("*")) == before
    assert poc_state(fresh, fresh.data_dir, scheduled=False).stages["baseline"].status == "due"
    with pytest.raises(CkptPocError, match="already exists"):
        fresh_plan(path, now=now)
