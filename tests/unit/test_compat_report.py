"""The range of applications and restore reliability in the weekly report and the record:
the Compatibility section from `compatibility` rows, every restore counted per checkpointer
version, and the plan's restore_success_rate criterion (met, not met, undecided; plan check)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tasks.data.datasets import COMPATIBILITY, TRIALS
from tasks.data.errors import PlanError
from tasks.data.plan import Plan, load_plan
from tasks.data.runs import commit_run
from tasks.data.store import read_dataset
from tasks.experiments.compatibility_result import wilson
from tasks.poc.record.decision import decide
from tasks.window.weekly.render import weekly_markdown
from tasks.window.weekly.restores import restores_to_decide
from tasks.window.weekly.rows import week_report
from tests.unit.test_weekly import REPO, W1, W2, at, fp, frame, make_plan, row, trial

CRIU_NEW = json.dumps({"criu": "Version: 4.2.1"})  # as fingerprint.py records it
DROP = object()  # _check: remove the key
TCP = "Connected TCP socket, consider using --tcp-established option."


def cycle(workload: str, run_id: str, n: int, week: str = W1, **kw: Any) -> dict[str, Any]:
    row = {
        "poc": "demo",
        "run_id": run_id,
        "workload": workload,
        "row": "cycle",
        "cycle": n,
        "started_at": at(week),
        "moment": "steady",
        "dump": "ok",
        "freeze_s": 0.02 * n,
        "dump_s": 0.1,
        "image_bytes": 1_000_000 * n,
        "restore": "ok",
        "restore_s": 0.2,
        "resumed_step": 10 * n,
        "criu_version": "4.2.1",
        **fp(),
    }
    row.update(kw)
    return row


def summary(workload: str, run_id: str, cycles: list[dict[str, Any]], **kw: Any) -> dict:
    k = sum(c["dump"] == "ok" and c["restore"] == "ok" for c in cycles)
    lo, hi = wilson(k, len(cycles)) or (None, None)
    row = {
        **cycles[0],
        "row": "workload",
        "cycle": 0,
        "cycles": len(cycles),
        "restored": k,
        "success_rate": k / len(cycles),
        "ci_low": lo,
        "ci_high": hi,
        "fidelity": "same",
    }
    for c in ("moment", "dump", "freeze_s", "dump_s", "image_bytes", "restore", "restore_s"):
        row[c] = None
    row.update(kw)
    return row


def compat_rows() -> list[dict[str, Any]]:
    """An older run of lammps (superseded), its latest run failing two dumps on a TCP
    socket, and redis restored 10/10."""
    old = [cycle("lammps", "cmp-0", i, restore="failed", cause="old") for i in (1, 2)]
    lammps = [cycle("lammps", "cmp-1", 1)] + [
        cycle(
            "lammps",
            "cmp-1",
            i,
            dump="failed",
            restore="not tried",
            freeze_s=None,
            image_bytes=None,
            cause=TCP.replace("socket", f"socket {i}07"),  # differs per cycle only by a number
            wants_option="--tcp-established",
            criu_log=f"/runs/cmp-1/lammps/{i}/dump.log",
        )
        for i in (2, 3)
    ]
    redis = [cycle("redis", "cmp-1", i) for i in range(1, 11)]
    return [
        *old,
        summary("lammps", "cmp-0", old, fidelity="not checked"),
        *lammps,
        summary("lammps", "cmp-1", lammps, fidelity="not checked", cause=TCP),
        *redis,
        summary("redis", "cmp-1", redis),
    ]


def restores_trials(week: str = W1) -> list[dict[str, Any]]:
    """Managed recovery: 4 restores ok, 1 failed, 1 that failed before any restore; cold
    start: 3 ok; unmanaged trials never count (they restart, they do not restore)."""
    new = {"fp_versions": CRIU_NEW}
    rows = [trial("recovery", "managed", week, "rec-1", restore="ok", **new) for _ in range(4)]
    rows.append(
        trial("recovery", "managed", week, "rec-1", status="failed", restore="failed", **new)
    )
    rows.append(trial("recovery", "managed", week, "rec-1", status="failed", **new))
    rows += [trial("recovery", "unmanaged", week, "rec-1", **new) for _ in range(3)]
    rows += [trial("cold_start", "managed", week, "cs-1", restore="ok", **new) for _ in range(3)]
    return rows


def frames(trials: list[dict[str, Any]] | None = None) -> dict[str, pd.DataFrame]:
    old_version = [trial("recovery", "managed", W1, "rec-0", restore="ok")]  # criu 4.0
    return {
        "trials": frame(old_version + (restores_trials() if trials is None else trials), TRIALS),
        "compatibility": frame(compat_rows(), COMPATIBILITY),
    }


def test_section_latest_run_per_workload_causes_grouped_with_the_option() -> None:
    report = week_report(make_plan(), frames(), W1, n_resamples=50)
    s = report.compatibility
    by_name = {w.name: w for w in s.workloads}
    assert set(by_name) == {"lammps", "redis"}
    lammps, redis = by_name["lammps"], by_name["redis"]
    assert lammps.run_id == "cmp-1" and (lammps.restored, lammps.cycles) == (1, 3)
    assert lammps.ci == wilson(1, 3)
    (group,) = lammps.causes  # two cycles, one cause: numbers in it do not split it
    assert (group.phase, group.cycles, group.wants_option) == ("dump", (2, 3), "--tcp-established")
    assert group.criu_log == "/runs/cmp-1/lammps/2/dump.log"
    assert (redis.restored, redis.cycles, redis.fidelity, redis.causes) == (10, 10, "same", ())
    assert redis.faithful and not lammps.faithful
    assert redis.image_bytes_median == 5_500_000 and redis.freeze_s_median == pytest.approx(0.11)
    assert s.headline == (
        "2 application(s) tried; 1 restored faithfully in all their cycles; 11/13 cycles "
        "restored in all; failures in lammps (causes below)"
    )
    md = weekly_markdown(report.rows, [], [], None, s)
    assert "## Compatibility" in md and "## Restore reliability" in md
    lammps_line = next(ln for ln in md.splitlines() if ln.startswith("| lammps | dump"))
    assert "--tcp-established" in lammps_line and "2, 3" in lammps_line
    assert "| redis | cmp-1 (" in md and "| 10/10 |" in md


def test_a_workload_not_yet_tried_by_the_week_is_not_shown() -> None:
    later = [{**r, "started_at": at(W2)} for r in compat_rows() if r["workload"] == "redis"]
    f = {"compatibility": frame(later, COMPATIBILITY)}

    def names(week: str) -> list[str]:
        return [
            w.name
            for w in week_report(make_plan(), f, week, n_resamples=50).compatibility.workloads
        ]

    assert names(W1) == [] and names(W2) == ["redis"]


def test_every_restore_counted_per_checkpointer_version() -> None:
    report = week_report(make_plan(), frames(), W1, n_resamples=50)
    versions = {v.version: v for v in report.compatibility.restores}
    assert set(versions) == {"criu 4.0", "criu 4.2.1"}
    new = versions["criu 4.2.1"]
    # compatibility: 1 + 10 restores ok, the two dumps that failed are no restore and the
    # superseded run's 2 failed restores count; recovery 4/5 (one failed before any
    # restore); cold start 3/3; unmanaged none.
    assert new.by_source == {"compatibility": (11, 13), "recovery": (4, 5), "cold_start": (3, 3)}
    assert (new.ok, new.attempted, new.ci) == (18, 21, wilson(18, 21))
    assert versions["criu 4.0"].by_source == {"recovery": (1, 1)}
    r = row(report.rows, "restore_success_rate", "managed")
    # The demo plan's 0.99: 18/21 has its upper bound 0.95 below it.
    assert r["verdict"] == "not met" and r["threshold"] == 0.99
    assert r["n"] == 21 and r["value"] == pytest.approx(wilson(18, 21)[0])
    assert r["ci_high"] == pytest.approx(wilson(18, 21)[1]) and r["ci_high"] < 0.99
    assert "criu 4.2.1" in r["method"]
    # A plan without the criterion: the same row informs, judged by nothing.
    unset = make_plan(**{"success.restore_success_rate": None})
    r = row(
        week_report(unset, frames(), W1, n_resamples=50).rows, "restore_success_rate", "managed"
    )
    assert r["verdict"] == "info" and pd.isna(r["threshold"]) and r["n"] == 21
    md = weekly_markdown(report.rows, [], [], None, report.compatibility)
    line = next(ln for ln in md.splitlines() if ln.startswith("Restore reliability:"))
    assert "criu 4.0: 1/1 restores ok" in line and "criu 4.2.1: 18/21 restores ok" in line
    assert "compatibility 11/13, recovery 4/5, cold_start 3/3" in line


def _plan(threshold: float, **extra: Any) -> Any:
    return make_plan(
        **{"success.restore_success_rate": {"statistic": "lower_ci", "threshold": threshold}},
        **extra,
    )


def _judged(plan: Any, ok: int, failed: int) -> dict[str, Any]:
    rows = [trial("cold_start", "managed", W1, "cs-1", restore="ok") for _ in range(ok)]
    rows += [trial("cold_start", "managed", W1, "cs-1", restore="failed") for _ in range(failed)]
    f = {"trials": frame(rows, TRIALS)}
    return row(week_report(plan, f, W1, n_resamples=50).rows, "restore_success_rate", "managed")


def test_restore_criterion_met_not_met_undecided() -> None:
    met = _judged(_plan(0.8), 20, 0)  # lower bound 20/(20 + z²) = 0.839
    assert met["verdict"] == "met" and met["value"] == pytest.approx(20 / (20 + 1.96**2), 1e-3)
    not_met = _judged(_plan(0.99), 9, 3)  # upper bound 0.911 < 0.99
    assert not_met["verdict"] == "not met" and not_met["ci_high"] < 0.99
    und = _judged(_plan(0.99), 10, 0)  # 0.722 … 1: straddles it
    assert und["verdict"] == "undecided"
    # All ok: the lower bound n/(n + z²) reaches 0.99 at n ≥ 0.99·z²/0.01 = 380.3.
    assert und["note"].startswith("needs 381, has 10:")
    assert restores_to_decide(10, 10, 0.99) == 381
    assert restores_to_decide(9, 12, 0.99) is None or restores_to_decide(9, 12, 0.99) > 12
    assert restores_to_decide(10, 10, 1.0) is None  # a lower bound never reaches 1


def test_decision_waits_on_restores_as_an_estimate() -> None:
    plan = _plan(0.99, **{"decision.criteria": ["restore_success_rate"]})
    und = _judged(plan, 10, 0)
    d = decide(plan, {"restore_success_rate": und}, plan.window.start)
    assert d.decision == "undecided"
    (o,) = d.open
    assert o.basis == "estimate" and o.settle.startswith("about 381 restores in all (371 more)")
    not_met = _judged(plan, 9, 3)
    assert decide(plan, {"restore_success_rate": not_met}, plan.window.start).decision == "reject"


def _check(tmp_path: Path, edit: dict[str, Any]) -> str:
    data = yaml.safe_load((REPO / "plans" / "demo.yaml").read_text())
    for dotted, value in edit.items():
        node = data
        *parents, last = dotted.split(".")
        for p in parents:
            node = node[p]
        if value is DROP:
            node.pop(last)
        else:
            node[last] = value
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        load_plan(path, check_cluster=False)
    except PlanError as err:
        return str(err)
    return ""


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (
            {"success.restore_success_rate": {"statistic": "median", "threshold": 0.99}},
            "success.restore_success_rate.statistic:",
        ),
        (
            {"success.restore_success_rate": {"statistic": "lower_ci", "threshold": 1.5}},
            "success.restore_success_rate.threshold:",
        ),
        (
            {"success.restore_success_rate": DROP, "decision.criteria": ["restore_success_rate"]},
            "decision.criteria: names restore_success_rate, which success does not set",
        ),
    ],
)
def test_plan_check_names_the_bad_restore_field(
    tmp_path: Path, edit: dict[str, Any], field: str
) -> None:
    assert field in _check(tmp_path, edit)


def test_plans_with_and_without_the_criterion() -> None:
    for name in ("range.yaml", "demo.yaml"):
        plan = load_plan(REPO / "plans" / name, check_cluster=False)
        assert plan.success.restore_success_rate is not None, name
        assert plan.success.restore_success_rate.threshold == 0.99
    ranged = load_plan(REPO / "plans" / "range.yaml", check_cluster=False)
    assert "restore_success_rate" in ranged.decision.criteria
    demo = load_plan(REPO / "plans" / "demo.yaml", check_cluster=False)
    assert "restore_success_rate" not in demo.decision.criteria  # shown, not decided by
    # Without a decision rule, the default names it only when success sets it.
    data = yaml.safe_load((REPO / "plans" / "demo.yaml").read_text())
    data.pop("decision")
    assert "restore_success_rate" in Plan.model_validate(data).decision.criteria
    data["success"].pop("restore_success_rate")
    assert "restore_success_rate" not in Plan.model_validate(data).decision.criteria


def test_trials_written_before_the_restore_column_still_read(tmp_path: Path) -> None:
    rows = frame([trial("recovery", "managed", W1, "old-1")], TRIALS).drop(columns="restore")
    table = pa.Table.from_pandas(rows, preserve_index=False)
    target = tmp_path / "demo" / "trials" / f"week={W1}" / "old-1.parquet"
    target.parent.mkdir(parents=True)
    pq.write_table(table, target)
    commit_run(tmp_path, "demo", "old-1", "test", "complete")
    back = read_dataset(TRIALS, data_dir=tmp_path, poc="demo")
    assert len(back) == 1 and back["restore"].isna().all()
    report = week_report(make_plan(), {"trials": back}, W1, n_resamples=50)
    assert row(report.rows, "restore_success_rate", "managed")["verdict"] == "no data"


def test_record_carries_the_section_and_restores_per_version(tmp_path: Path) -> None:
    from tasks.data.store import write_dataset
    from tasks.poc.record.build import build_document, record_markdown
    from tasks.poc.record.document import render_html

    for rows, spec, run_id in (
        (compat_rows(), COMPATIBILITY, "cmp-1"),
        (restores_trials(), TRIALS, "rec-1"),
    ):
        df = frame(rows, spec)
        write_dataset(df, spec, data_dir=tmp_path, poc="demo", run_id=run_id)
        commit_run(tmp_path, "demo", run_id, "test", "complete")
    plan = make_plan(poc="demo", data_dir=str(tmp_path))
    doc, summary = build_document(plan, tmp_path, n_resamples=50, today=plan.window.start)
    page = render_html(doc, "record")
    assert "Compatibility and restore reliability" in page
    assert "2 application(s) tried; 1 restored faithfully" in page
    assert "--tcp-established" in page and "criu 4.2.1: 18/21 restores ok" in page
    assert summary["verdicts"]["restore_success_rate"].startswith("not met")
    md = record_markdown({**summary, "html": "h", "pdf": "p"})
    assert "## Compatibility" in md and "CRIU asks for --tcp-established" in md
    assert "Restore reliability: criu 4.2.1: 18/21" in md
