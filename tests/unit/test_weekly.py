"""The weekly report: Young/Daly, rows from constructed datasets, segments, gaps, HTML."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from tasks.data.datasets import (
    EXPOSURE,
    GATES,
    REPORTS,
    SAMPLE_GAPS,
    TRIALS,
    UTILIZATION,
    DatasetSpec,
)
from tasks.data.fingerprint import FINGERPRINT_COLUMNS
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext
from tasks.data.runs import commit_run
from tasks.data.store import normalise_dtypes, read_dataset, write_dataset
from tasks.experiments.clocks import MEASURE_CLOCKS, clock_of
from tasks.experiments.stats import compare_paired, compare_speedup
from tasks.window.weekly import build_weekly_report
from tasks.window.weekly.extrapolation import daly_interval, expected_waste, young_interval
from tasks.window.weekly.render import weekly_html, weekly_markdown, weekly_table_rows
from tasks.window.weekly.rows import weekly_report_rows, weekly_series
from tasks.window.weekly.segments import week_start

REPO = Path(__file__).resolve().parents[2]
W1, W2, W3, W4 = "2026-W49", "2026-W50", "2026-W51", "2026-W52"
EVIL = "<script>alert(1)</script>"


def make_plan(**overrides: Any) -> Plan:
    data = yaml.safe_load((REPO / "plans" / "demo.yaml").read_text())
    data["checkpointer"]["interval_s"] = 600
    data["faults"] = [{"kind": "sigkill"}]  # the recovery rows here are all sigkill trials
    for dotted, value in overrides.items():
        node = data
        *parents, last = dotted.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return Plan.model_validate(data)


def fp(driver: str = "535.1", host: str = "node-a") -> dict[str, Any]:
    out: dict[str, Any] = {c: "x" for c in FINGERPRINT_COLUMNS}
    out.update(
        fp_cores=4,
        fp_mem_bytes=1,
        fp_gpu_count=1,
        fp_driver=driver,
        fp_cuda="12.4",
        fp_kernel="6.1",
        fp_host=host,
        fp_versions=json.dumps({"criu": "4.0"}),
    )
    return out


def at(week: str, hours: float = 12) -> pd.Timestamp:
    return week_start(week) + pd.Timedelta(hours=hours)


def frame(rows: list[dict[str, Any]], spec: DatasetSpec) -> pd.DataFrame:
    return normalise_dtypes(pd.DataFrame(rows, columns=spec.column_names), spec)


_counter = iter(range(10**6))


def trial(measure: str, arm: str, week: str, run_id: str = "run-1", **kw: Any) -> dict[str, Any]:
    row = {
        "poc": "demo",
        "run_id": run_id,
        "measure": measure,
        "trial_id": f"t{next(_counter)}",
        "arm": arm,
        "repeat": 0,
        "status": "ok",
        "started_at": at(week),
        "gpus": 1,
        "gpus_from": "plan",
        "clock": clock_of(measure, arm) if measure in MEASURE_CLOCKS else "c",
        "workload_hash": "h",
        "nodes": "node-a",
        **fp(kw.pop("driver", "535.1")),
    }
    row.update(kw)
    return row


def recoveries(week: str, arm: str, values: list[float], **kw: Any) -> list[dict[str, Any]]:
    kw.setdefault("fault", "sigkill")
    return [trial("recovery", arm, week, recovery_s=v, **kw) for v in values]


def util(week: str, arm: str, delivered: float, allocated: float = 10.0, **kw: Any) -> dict:
    row = {
        "poc": "demo",
        "run_id": "util-1",
        "week": week,
        "week_start": week_start(week),
        "arm": arm,
        "workload": "digits-train",
        "jobs": 2,
        "allocated_gpu_h": allocated,
        "delivered_gpu_h": delivered,
        "lost_gpu_h": 0.0,
        "idle_checkpoint_gpu_h": 0.0,
        "idle_recovery_gpu_h": 0.0,
        "idle_other_gpu_h": allocated - delivered,
        "goodput": delivered / allocated,
        "busy_fraction": 0.5,
        "busy_metric": "cpu_utilization",
        "samples": 100,
        "computed_at": at(week, 100),
        **fp(),
    }
    row.update(kw)
    return row


def exposure_rows() -> list[dict[str, Any]]:
    base = {
        "poc": "demo",
        "run_id": "base-1",
        "kind": "state",
        "node_hours": 0.0,
        "exposed_gpu_hours": 0.0,
        "timeout_gpu_hours": 0.0,
        "exposed_allocations": 0,
        "chains": 0,
        "computed_at": at(W1, 1),
        "provenance": "measured",
        **fp(),
    }
    return [
        {**base, "state": "COMPLETED", "allocations": 90, "gpu_hours": 90.0, "node_hours": 90.0},
        {**base, "state": "FAILED", "allocations": 10, "gpu_hours": 10.0, "node_hours": 10.0},
    ]


def row(rows: pd.DataFrame, measure: str, arm: str) -> dict[str, Any]:
    hit = rows[(rows["measure"] == measure) & (rows["arm"] == arm)]
    assert len(hit) == 1, (measure, arm, hit)
    return hit.iloc[0].to_dict()


def full_frames() -> dict[str, pd.DataFrame]:
    trials = [
        *recoveries(W1, "managed", [1, 2, 3, 4, 5], work_lost_gpu_h=0.002),
        *recoveries(W1, "unmanaged", [10, 20, 30], work_lost_gpu_h=0.05),
    ]
    for t, lost in zip(trials[5:], (100.0, 200.0, 300.0), strict=True):
        t["work_lost_s"] = lost
    trials += [
        trial("checkpoint", "managed", W1, dump_s=d, freeze_s=f)
        for d, f in ((1.0, 2.0), (3.0, 4.0), (5.0, 6.0))
    ]
    # Two overhead runs whose pair numbers both start at 0: six pairs, not three.
    for run in ("oh-1", "oh-2"):
        for pair, m in enumerate((101.0, 102.0, 103.0)):
            trials.append(
                trial("overhead", "managed", W1, run, variant="steady", pair=pair, run_s=m)
            )
            trials.append(
                trial("overhead", "unmanaged", W1, run, variant="steady", pair=pair, run_s=100.0)
            )
    trials += [trial("cold_start", "unmanaged", W1, ready_s=3.0) for _ in range(3)]
    trials += [trial("cold_start", "managed", W1, ready_s=v) for v in (1.0, 1.0, 1.5)]
    return {
        "trials": frame(trials, TRIALS),
        "exposure": frame(exposure_rows(), EXPOSURE),
        "utilization": frame([util(W1, "managed", 9.0), util(W1, "unmanaged", 8.0)], UTILIZATION),
    }


# --- Young / Daly ------------------------------------------------------------------------------


def test_young_daly_vectors_from_window_notes() -> None:
    # window.md: R = 10 min, δ = 5 min (minutes throughout).
    assert daly_interval(5, 24 * 60) == pytest.approx(116.7, abs=0.05)
    assert daly_interval(5, 6 * 60) == pytest.approx(56.7, abs=0.05)
    assert daly_interval(5, 15) == pytest.approx(9.14, abs=0.005)
    assert young_interval(5, 24 * 60) == pytest.approx(120.0)
    assert daly_interval(40, 15) == 15  # δ ≥ 2M: τ = M
    assert expected_waste(5, 116.7, 1 / (24 * 60), 10) == pytest.approx(
        5 / 116.7 + (116.7 / 2 + 10) / (24 * 60)
    )
    with pytest.raises(ValueError):
        daly_interval(0, 10)
    with pytest.raises(ValueError):
        young_interval(5, math.inf)


# --- rows --------------------------------------------------------------------------------------


def test_measured_rows_exact_values_and_verdicts() -> None:
    rows, cps, gaps = weekly_report_rows(make_plan(), full_frames(), W1)
    assert cps == [] and gaps == []
    assert set(rows["verdict"]) <= {"met", "not met", "undecided", "no data", "blocked", "info"}
    assert not rows.duplicated(["measure", "arm"]).any()  # the REPORTS key stays unique

    m = row(rows, "recovery_s", "managed")
    assert (m["n"], m["value"], m["threshold"], m["verdict"]) == (5, 3.0, 30.0, "met")
    assert m["ci_low"] <= 3.0 <= m["ci_high"] and m["basis"] == "measured"
    u = row(rows, "recovery_s", "unmanaged")
    assert (u["n"], u["value"], u["verdict"]) == (3, 20.0, "info")
    assert u["threshold"] is None or pd.isna(u["threshold"])
    wl = row(rows, "work_lost_gpu_h", "managed")
    assert (wl["value"], wl["verdict"]) == (0.002, "met")

    assert row(rows, "checkpoint_dump_s", "managed")["value"] == 3.0
    assert row(rows, "checkpoint_freeze_s", "managed")["value"] == 4.0

    oh = row(rows, "overhead_pct", "both")
    want = compare_paired([101, 102, 103] * 2, [100.0] * 6, threshold_pct=2)
    assert oh["n"] == 6
    assert oh["value"] == pytest.approx(want.overhead_pct)
    assert (oh["ci_low"], oh["ci_high"]) == pytest.approx((want.ci_low_pct, want.ci_high_pct))
    assert oh["verdict"] == "undecided"  # CI [1, 3] % straddles 2 %: more runs decide

    cs = row(rows, "cold_start_speedup", "both")
    want = compare_speedup([3.0] * 3, [1.0, 1.0, 1.5], threshold=1.5)
    assert cs["value"] == pytest.approx(3.0) == pytest.approx(want.speedup)
    assert cs["verdict"] == "met"

    g = row(rows, "goodput", "managed")
    assert (g["value"], g["n"], g["verdict"]) == (pytest.approx(0.9), 2, "info")
    assert row(rows, "utilization", "unmanaged")["value"] == pytest.approx(0.5)
    gain = row(rows, "goodput_gain", "both")
    assert gain["value"] == pytest.approx(0.1) and gain["n"] == 1
    # One week of the four the plan asks for decides nothing yet, either way.
    assert gain["verdict"] == "undecided" and gain["note"].startswith("needs 4, has 1")


def test_threshold_decides_not_met() -> None:
    rows, _, _ = weekly_report_rows(
        make_plan(**{"success.recovery_time_s.threshold": 2.5}), full_frames(), W1
    )
    assert row(rows, "recovery_s", "managed")["verdict"] == "not met"


def test_extrapolated_rows_carry_basis_and_inputs() -> None:
    plan = make_plan()
    rows, _, _ = weekly_report_rows(plan, full_frames(), W1)
    lam_s = 0.1 / 3600  # 10 FAILED of 100 GPU-hours, 1 GPU
    delta, r_m, r_u, lost_u = 4.0, 3.0, 20.0, 200.0

    iv = row(rows, "checkpoint_interval_s", "managed")
    assert iv["basis"] == "extrapolated" and iv["verdict"] == "info"
    assert iv["value"] == pytest.approx(daly_interval(delta, 1 / lam_s))
    inputs = json.loads(iv["inputs"])
    assert inputs["exposure"]["lambda_per_h"] == pytest.approx(0.1)
    assert inputs["exposure"]["run_id"] == "base-1"
    assert inputs["exposure"]["interruptions"] == 10
    assert (inputs["delta_s"], inputs["delta_from"]) == (4.0, "median freeze_s")
    assert inputs["R_managed_s"] == r_m
    assert inputs["young_s"] == pytest.approx(math.sqrt(2 * delta * 36000))
    assert inputs["waste_at_plan"] == pytest.approx(expected_waste(delta, 600, lam_s, r_m))

    w = row(rows, "waste_fraction", "managed")
    assert w["value"] == pytest.approx(delta / 600 + lam_s * (300 + r_m))

    eg = row(rows, "goodput_gain_expected", "both")
    assert eg["basis"] == "extrapolated"
    want = (1 - (delta / 600 + lam_s * (300 + r_m))) - (1 - lam_s * (lost_u + r_u))
    assert eg["value"] == pytest.approx(want)
    eg_inputs = json.loads(eg["inputs"])
    assert eg_inputs["goodput_gain_measured"] == pytest.approx(0.1)
    assert eg_inputs["L_unmanaged_s"] == lost_u
    # Measured rows carry no inputs.
    assert pd.isna(row(rows, "recovery_s", "managed")["inputs"])


def test_a_week_with_nothing_is_no_data() -> None:
    rows, cps, gaps = weekly_report_rows(make_plan(), {}, W4)
    assert len(rows) >= 12
    assert set(rows["verdict"]) == {"no data"}
    assert (rows["n"] == 0).all() and rows["value"].isna().all()
    assert cps == [] and gaps == []
    # An empty week after a week with data: per-week measures have nothing.
    rows, _, _ = weekly_report_rows(make_plan(), full_frames(), W2)
    assert row(rows, "goodput", "managed")["verdict"] == "no data"
    assert row(rows, "recovery_s", "managed")["n"] == 5  # cumulative within the segment


def test_driver_change_splits_segments_and_stops_pooling() -> None:
    trials = [
        *recoveries(W1, "managed", [1, 1, 1]),
        *recoveries(W2, "managed", [2, 2, 2]),
        *recoveries(W3, "managed", [10, 20, 30], driver="550.2"),
    ]
    frames = {"trials": frame(trials, TRIALS)}
    rows2, cps2, _ = weekly_report_rows(make_plan(), frames, W2)
    m2 = row(rows2, "recovery_s", "managed")
    assert (m2["n"], m2["value"], m2["segment"]) == (6, 1.5, 0)
    assert cps2 == []

    rows3, cps3, _ = weekly_report_rows(make_plan(), frames, W3)
    m3 = row(rows3, "recovery_s", "managed")
    assert (m3["n"], m3["value"], m3["segment"]) == (3, 20.0, 1)
    assert (rows3["segment"] == 1).all()
    assert cps3 == [
        {
            "week": W3,
            "segment": 1,
            "changes": [
                {"source": "trials", "field": "driver", "before": "535.1", "after": "550.2"}
            ],
        }
    ]


def test_goodput_gain_needs_min_weeks_and_latest_utilization_row_wins() -> None:
    weeks = (W1, W2, W3, W4)
    rows = [r for w in weeks for r in (util(w, "managed", 9.0), util(w, "unmanaged", 8.0))]
    # An earlier computation of week 1 (the daily flow recomputes the week): superseded.
    rows.append(util(W1, "managed", 1.0, computed_at=at(W1, 1)))
    frames = {"utilization": frame(rows, UTILIZATION)}
    g3, _, _ = weekly_report_rows(make_plan(), frames, W3)
    assert row(g3, "goodput", "managed")["value"] == pytest.approx(0.9)
    gain3 = row(g3, "goodput_gain", "both")
    assert (gain3["n"], gain3["verdict"]) == (3, "undecided")
    assert gain3["note"].startswith("needs 4, has 3")
    g4, _, _ = weekly_report_rows(make_plan(), frames, W4)
    gain4 = row(g4, "goodput_gain", "both")
    assert (gain4["n"], gain4["value"], gain4["verdict"]) == (4, pytest.approx(0.1), "met")


def test_failed_gate_blocks_only_its_measure() -> None:
    frames = full_frames()
    gate = {
        "poc": "demo",
        "run_id": "run-1",
        "gate": "recovery",
        "dataset": "trials",
        "expectation": "expect_column_values_to_not_be_null",
        "success": False,
        "checked_at": at(W1),
        **fp(),
    }
    frames["gates"] = frame([gate, {**gate, "gate": "overhead", "run_id": "other"}], GATES)
    rows, _, _ = weekly_report_rows(make_plan(), frames, W1)
    blocked = row(rows, "recovery_s", "managed")
    assert blocked["verdict"] == "blocked" and "expect_column_values" in blocked["note"]
    assert json.loads(blocked["inputs"])["blocked_by"][0]["gate"] == "recovery"
    # run "other" refused its gate but is not pooled here: the row is not blocked
    assert row(rows, "overhead_pct", "both")["verdict"] == "undecided"
    assert row(rows, "cold_start_speedup", "both")["verdict"] == "met"


def test_gaps_of_the_week_are_listed_with_reasons() -> None:
    base = {"poc": "demo", "run_id": "s-1", "source": "procfs", "detected_by": "next_run", **fp()}
    gaps = [
        {
            **base,
            "node": "local-a",
            "t_from": at(W2, 1),
            "t_to": at(W2, 3),
            "gap_s": 7200.0,
            "reason": "sampler not running",
        },
        {
            **base,
            "node": "local-a",
            "t_from": at(W3, 1),
            "t_to": at(W3, 2),
            "gap_s": 3600.0,
            "reason": "other week",
        },
    ]
    _, _, listed = weekly_report_rows(make_plan(), {"sample_gaps": frame(gaps, SAMPLE_GAPS)}, W2)
    assert len(listed) == 1
    g = listed[0]
    assert (g["node"], g["seconds"], g["reason"]) == ("local-a", 7200.0, "sampler not running")
    assert g["from"] == at(W2, 1).isoformat() and g["to"] == at(W2, 3).isoformat()


# --- rendering ---------------------------------------------------------------------------------


def test_html_has_verdicts_first_images_and_escapes(tmp_path: Path) -> None:
    plan = make_plan()
    frames = full_frames()
    frames["utilization"] = frame(
        [util(W1, "managed", 9.0, workload=EVIL), util(W1, "unmanaged", 8.0)], UTILIZATION
    )
    gap = {
        "poc": "demo",
        "run_id": "s-1",
        "node": "local-a",
        "source": "procfs",
        "t_from": at(W1, 1),
        "t_to": at(W1, 2),
        "gap_s": 3600.0,
        "reason": EVIL,
        "detected_by": "sampler",
        **fp(),
    }
    frames["sample_gaps"] = frame([gap], SAMPLE_GAPS)
    rows, cps, gaps = weekly_report_rows(plan, frames, W1)
    series = weekly_series(plan, frames, W1)
    out = weekly_html(rows, cps, gaps, series, tmp_path / "r" / "w.html", title=f"demo / {EVIL}")
    page = out.read_text()
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # Figures inline as SVG (nothing fetched), after the verdicts and the table.
    assert page.count("<svg") >= 4 and "data:image/png" not in page and "<img" not in page
    assert page.index("<h2>Verdicts</h2>") < page.index("<table") < page.index("<svg")
    assert "recovery_s" in page and "checkpoint_interval_s" in page
    assert not list(out.parent.glob("*.tmp"))

    md = weekly_markdown(rows, cps, gaps, out)
    assert md.splitlines()[0].startswith(f"# Weekly report {W1}")
    first = next(line for line in md.splitlines() if line.startswith("- "))
    assert first.startswith("- recovery time median 3.00 s") and first.endswith(": met")
    assert str(out) in md
    # Undecided for want of weeks, whatever the value: one week of the plan's four.
    gain = next(line for line in md.splitlines() if line.startswith("- goodput gain"))
    assert "vs ≥" in gain and ": undecided: needs 4, has 1" in gain and "min_weeks" in gain
    table = weekly_table_rows(rows)
    assert len(table) == len(rows) and table[0]["verdict"] == "met"


def test_build_weekly_report_writes_rows_and_html(tmp_path: Path) -> None:
    plan = make_plan(data_dir=str(tmp_path / "data"))
    data_dir = tmp_path / "data"
    for name, df in full_frames().items():
        spec = {"trials": TRIALS, "exposure": EXPOSURE, "utilization": UTILIZATION}[name]
        write_dataset(df, spec, data_dir=data_dir, poc="demo", run_id=f"in-{name}")
        commit_run(data_dir, "demo", f"in-{name}", name, "complete")
    ctx = RunContext(
        poc="demo",
        run_id="report-1",
        plan_path="plan.yaml",
        plan_hash="h",
        git_sha="g",
        data_dir=data_dir,
        started_at=dt.datetime.now(dt.UTC),
        fingerprint=fp(),
        stage="weekly_report",
    )
    result = build_weekly_report(plan, ctx, W1)
    assert result.week == W1
    assert Path(result.html) == data_dir / "demo" / "reports_html" / f"{W1}.html"
    assert Path(result.html).exists()
    iv = next(r for r in result.rows if r["measure"] == "checkpoint_interval_s")
    assert iv["basis"] == "extrapolated" and iv["inputs"]["delta_s"] == 4.0
    json.dumps(result.to_json())  # JSON-ready for the CLI
    stored = read_dataset(REPORTS, data_dir=data_dir, poc="demo", include_uncommitted=True)
    assert len(stored) == len(result.rows)
    assert set(stored["run_id"]) == {"report-1"} and set(stored["week"]) == {W1}
    rec = stored[(stored["measure"] == "recovery_s") & (stored["arm"] == "managed")]
    assert rec["value"].iloc[0] == 3.0 and rec["verdict"].iloc[0] == "met"
    assert np.isfinite(stored["value"].dropna()).all()


def test_a_malformed_week_is_refused_clearly() -> None:
    from tasks.data.errors import CkptPocError

    for bad in ("2026-W99", "2026-49", "last week"):
        with pytest.raises(CkptPocError, match="is not an ISO week"):
            weekly_report_rows(make_plan(), {}, bad)


def test_the_exit_verdict_is_a_row_of_the_week() -> None:
    from tasks.data.datasets import EXIT_VERDICTS

    def verdict(node: str, week: str, leftovers: int) -> dict[str, Any]:
        return {
            "poc": "p",
            "run_id": f"exit-{node}-{week}",
            "node": node,
            "from_phase": "before_install",
            "to_phase": "after_uninstall",
            "verdict": "leftovers" if leftovers else "clean",
            "leftovers": leftovers,
            "items_compared": 1000,
            "diffed_at": at(week),
            **fp(),
        }

    frames = {
        "exit_verdicts": frame(
            [verdict("node-a", W2, 0), verdict("node-b", W2, 0), verdict("node-b", W3, 3)],
            EXIT_VERDICTS,
        )
    }
    assert (
        row(weekly_report_rows(make_plan(), frames, W1)[0], "exit_leftovers", "both")["verdict"]
        == "no data"
    )  # not tried yet
    w2 = row(weekly_report_rows(make_plan(), frames, W2)[0], "exit_leftovers", "both")
    assert (w2["n"], w2["value"], w2["verdict"]) == (2, 0.0, "met")
    w3 = row(weekly_report_rows(make_plan(), frames, W3)[0], "exit_leftovers", "both")
    assert (w3["n"], w3["value"], w3["verdict"]) == (2, 3.0, "not met")
    assert "node-b: 3 leftover(s)" in w3["note"]


# --- figures and extrapolation inputs ----------------------------------------------------------


def _svg_points(svg: str, gid: str) -> int:
    """Markers drawn in the SVG group ``gid`` (matplotlib writes one <use> per marker)."""
    import re

    group = re.search(rf'<g id="{re.escape(gid)}">(.*?)</g>', svg, re.S)
    return group.group(1).count("<use") if group else 0


def test_figures_draw_every_trial_and_the_rows_statistics() -> None:
    from tasks.data.render import records
    from tasks.window.weekly.plots import (
        overhead_chart,
        overhead_pairs,
        recovery_chart,
        weekly_goodput,
        work_lost_chart,
    )

    plan, frames = make_plan(), full_frames()
    rows = records(weekly_report_rows(plan, frames, W1, n_resamples=200)[0])
    trials = frames["trials"]
    rec = recovery_chart(trials, rows)
    # A point per trial of each arm (5 managed, 3 unmanaged), in the data and in the SVG.
    assert {k: len(v) for k, v in rec.points.items()} == {
        "sigkill/managed": 5,
        "sigkill/unmanaged": 3,
    }
    assert sorted(rec.points["sigkill/managed"]) == [1, 2, 3, 4, 5]
    assert _svg_points(rec.svg, "recovery-recovery-0") == 5
    assert _svg_points(rec.svg, "recovery-recovery-1") == 3
    assert "<title>Recovery time per fault and arm (every trial)</title>" in rec.svg
    assert "n = 8" in rec.caption and "30.0 s" in rec.caption  # the plan's threshold
    lost = work_lost_chart(trials, rows)
    assert {k: len(v) for k, v in lost.points.items()} == {"managed": 5, "unmanaged": 3}
    # Overhead: the six pairs of two runs, the row's median among them.
    oh = overhead_chart(trials, rows)
    pairs = overhead_pairs(trials)
    assert len(oh.points["pairs"]) == len(pairs) == 6
    assert _svg_points(oh.svg, "overhead-overhead-pairs") == 6
    row_oh = next(r for r in rows if r["measure"] == "overhead_pct")
    assert float(np.median(oh.points["pairs"])) == pytest.approx(row_oh["value"])
    # Goodput per week as the rows compute it.
    gp = weekly_goodput(frames["utilization"])
    for r in rows:
        if r["measure"] == "goodput":
            got = gp[(gp["week"] == W1) & (gp["arm"] == r["arm"])]["value"]
            assert got.iloc[0] == pytest.approx(r["value"])
    # The same rows draw the same bytes (fixed jitter, hash salt, no date).
    assert recovery_chart(trials, rows).svg == rec.svg


def test_cold_start_figure_places_each_native_at_its_copys_checkpoint_size() -> None:
    from tasks.window.weekly.plots import cold_start_chart

    trials = []
    for i, (size, native, restore) in enumerate(((1e9, 3.0, 1.0), (2e9, 3.5, 1.4))):
        trials.append(trial("cold_start", "unmanaged", W1, trial_id=f"cold-{i}", ready_s=native))
        trials.append(
            trial(
                "cold_start",
                "managed",
                W1,
                trial_id=f"cold-{i}",
                ready_s=restore,
                checkpoint_bytes=int(size),
            )
        )
    trials.append(trial("cold_start", "unmanaged", W1, trial_id="lone", ready_s=9.0))
    df = frame(trials, TRIALS)
    chart = cold_start_chart(df, [])
    assert chart.points["restore_mb"] == (1000.0, 2000.0)
    assert chart.points["native_mb"] == (1000.0, 2000.0)
    assert chart.points["native"] == (3.0, 3.5)  # the lone native has no size: median only
    assert "1 without a size" in chart.caption
    for clock in set(df["clock"]):
        assert clock in chart.caption and clock in chart.svg  # both clocks, named


def test_a_figure_without_data_says_so_in_one_line() -> None:
    from tasks.window.weekly.plots import shared_charts, weekly_goodput

    empty = frame([], TRIALS)
    charts = shared_charts(empty, weekly_goodput(frame([], UTILIZATION)), [], [])
    assert len(charts) == 7
    for c in charts:
        assert c.empty and not c.png and "\n" not in c.caption and "nothing to draw" in c.caption


def test_extrapolation_inputs_are_tables_not_json() -> None:
    from tasks.data.errors import CkptPocError
    from tasks.data.render import records
    from tasks.window.weekly.render import extrapolation_inputs, inputs_table_rows

    rows = records(weekly_report_rows(make_plan(), full_frames(), W1, n_resamples=200)[0])
    groups = extrapolation_inputs(rows)
    measures = [m for ms, _ in groups for m in ms]
    assert {"checkpoint_interval_s", "waste_fraction", "goodput_gain_expected"} <= set(measures)
    table = {r[0]: r for _, t in groups for r in t}
    assert table["δ, checkpoint cost"] == [
        "δ, checkpoint cost",
        "4.00",
        "s",
        "median freeze_s of the checkpoint trials",
    ]
    lam = table["λ, interruptions per hour of job time"]
    assert lam[1] == "0.100" and "baseline run base-1" in lam[3]
    for _, t in groups:
        for cells in t:
            assert len(cells) == 4 and not any(c.startswith(("{", "[")) for c in cells), cells
    # A key the table does not know still reads as a row, a blocking gate as a line.
    extra = inputs_table_rows(
        json.dumps(
            {"new_cost_s": 1.5, "blocked_by": [{"run_id": "r", "gate": "g", "expectation": "e"}]}
        )
    )
    assert extra == [
        ["new_cost_s", "1.50", "s", "the row's inputs"],
        ["blocked by a failed gate", "g/e", "", "run r"],
    ]
    assert inputs_table_rows(None) == []
    with pytest.raises(CkptPocError, match="reports row x: inputs: not JSON"):
        inputs_table_rows("{oops", "reports row x: inputs")
    with pytest.raises(CkptPocError, match="a JSON object expected, got list"):
        inputs_table_rows("[1]")


def test_weekly_page_shows_inputs_as_tables(tmp_path: Path) -> None:
    plan, frames = make_plan(), full_frames()
    rows, cps, gaps = weekly_report_rows(plan, frames, W1, n_resamples=200)
    series = weekly_series(plan, frames, W1, rows, n_resamples=200)
    page = weekly_html(rows, cps, gaps, series, tmp_path / "w.html").read_text()
    inputs = page[page.index("<h2>Extrapolation inputs</h2>") : page.index("<h2>Change points")]
    assert "<pre>" not in inputs and '"delta_s"' not in inputs
    assert "<th>name</th><th>value</th><th>unit</th><th>source</th>" in inputs
    assert "δ, checkpoint cost" in inputs
    # matplotlib's page-wide style rule stays inside the figures.
    assert '<style type="text/css">*{' not in page and "svg *{" in page
    md = weekly_markdown(rows, cps, gaps, None)
    assert "### Inputs of optimal checkpoint interval (Daly)" in md
    assert "| name | value | unit | source |" in md and '"delta_s"' not in md
