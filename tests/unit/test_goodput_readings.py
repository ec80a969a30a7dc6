"""Goodput read two ways (the seed's split and ml-goodput-measurement's job span), figures
provisional until every chain in them has ended, and the plan's exclusions cut out of both
arms alike (tasks/window/chains.py, tasks/window/utilization.py, tasks/window/weekly/goodput.py).
Constructed event sequences whose answers are worked out by hand in each test."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tasks.data.datasets import UTILIZATION
from tasks.data.errors import PlanError
from tasks.data.plan import load_plan
from tasks.window.chains import paired_trials
from tasks.window.utilization import utilization_rows
from tasks.window.weekly.goodput import goodput_section
from tasks.window.weekly.render import weekly_markdown
from tasks.window.weekly.rows import week_report
from tests.support.common import REPO
from tests.unit.test_utilization import T0, H, assert_adds_up, ev, events, progress
from tests.unit.test_weekly import W1, W2, frame, make_plan, row, util


def rows_of(frame_: pd.DataFrame, trials: pd.DataFrame | None = None, **kw) -> pd.DataFrame:
    return utilization_rows(frame_, trials, workload="digits-train", default_gpus=1, **kw)


def one(rows: pd.DataFrame, arm: str = "unmanaged") -> dict:
    (hit,) = rows[rows["arm"] == arm].to_dict("records")
    return hit


def killed_mid_step() -> pd.DataFrame:
    """Steps 1..10 at 1..10 s; SIGKILL at 10.6 s, in step 11; restarted from its app checkpoint
    at step 5: step 6 at 15 s (serving again), … step 10 at 19 s; exits at 19 s."""
    return events(
        [
            ev(0, "launch"),
            *progress(range(1, 11), 1),
            ev(10.6, "fault_injected", fault="sigkill"),
            ev(10.7, "detected"),
            ev(11, "restart_start"),
            *progress(range(6, 11), 15),
            ev(15.001, "serving_again", step=6),
            ev(19, "exited", rc=0),
        ]
    )


def test_the_step_in_flight_is_lost_in_the_seeds_split_and_recovery_in_the_job_span() -> None:
    rows = rows_of(killed_mid_step())
    got = one(rows)
    assert_adds_up(rows)
    # By hand: resumed at step 6, so steps after 5 (reached at 5 s) were redone: 5 → 10.6 s
    # is lost (5.6 s), of which 10 → 10.6 s (after step 10's report) was the step in flight.
    assert got["lost_gpu_h"] == pytest.approx(5.6 * H)
    assert got["unfinished_step_gpu_h"] == pytest.approx(0.6 * H)
    assert got["idle_recovery_gpu_h"] == pytest.approx(4.401 * H)
    assert got["queued_gpu_h"] == 0  # never released: both readings share the denominator
    assert got["goodput_job_span"] == pytest.approx(got["goodput"])
    section = goodput_section(make_plan(), rows.assign(run_id="u1"))
    seed, job_span = (r for r in section.rows if r[0] == "unmanaged")
    assert seed[1] == "the seed's split" and job_span[1] == "ml-goodput-measurement"
    assert seed[5] == f"{5.6 * H:.3g}" and job_span[5] == f"{5.0 * H:.3g}"
    assert job_span[6] == f"{5.001 * H:.3g}"  # recovery 4.401 s + the unfinished 0.6 s
    assert seed[4] == job_span[4]  # delivered is the same in both readings


def requeued_on_slurm() -> pd.DataFrame:
    """A Slurm job: steps 1..10 at 1..10 s; preempted at 10.5 s, gone at 11 s; requeued, it
    waits in the queue until its next attempt starts at 20 s, restored from the checkpoint
    taken at 8 s (index 0): step 9 at 22 s, … step 12 at 25 s; exits at 26 s."""
    return events(
        [
            ev(0, "job_started"),
            *progress(range(1, 8), 1),
            ev(8, "checkpoint_start", index=0),
            ev(8.2, "checkpoint_end", index=0, frozen_us=100_000),
            *progress(range(8, 11), 8.5),
            ev(10.75, "fault_injected", fault="preempt"),
            ev(11, "detected"),
            ev(11.5, "recovery_submitted"),
            ev(20, "job_started"),
            ev(20.5, "restore_start", index=0),
            ev(21, "restored", index=0),
            ev(22.001, "serving_again", step=9),
            *progress(range(9, 13), 22),
            ev(26, "workload_exited", rc=0),
        ]
    )


def test_the_job_span_counts_the_queue_between_attempts() -> None:
    rows = rows_of(requeued_on_slurm())
    got = one(rows)
    assert_adds_up(rows)
    # Allocated: 0 → 11 s and 20 → 26 s = 17 s; released 11 → 20 s = 9 s in the queue.
    assert got["allocated_gpu_h"] == pytest.approx(17 * H)
    assert got["queued_gpu_h"] == pytest.approx(9 * H)
    # Restored from the checkpoint begun at 8 s: 8 → 10.75 s lost, less the 0.1 s it was
    # frozen (checkpointing, not progress): 2.65 s; of it the step in flight after step 10's
    # report at 10.5 s: 0.25 s.
    assert got["idle_checkpoint_gpu_h"] == pytest.approx(0.1 * H)
    assert got["lost_gpu_h"] == pytest.approx(2.65 * H)
    assert got["unfinished_step_gpu_h"] == pytest.approx(0.25 * H)
    delivered = got["delivered_gpu_h"]
    assert got["goodput"] == pytest.approx(delivered / (17 * H))
    assert got["goodput_job_span"] == pytest.approx(delivered / (26 * H))
    assert got["goodput_job_span"] < got["goodput"]
    assert (got["chains"], got["chains_open"], got["provisional"]) == (1, 0, False)


def steady(arm: str, trial: str = "pair") -> pd.DataFrame:
    """A copy launched at 0, a step a second from 1 to 100 s, exiting at 101 s."""
    return events(
        [ev(0, "launch"), *progress(range(1, 101), 1), ev(101, "exited", rc=0)],
        arm=arm,
        trial=trial,
    )


def test_exclusions_cut_both_arms_alike_and_are_listed() -> None:
    pair = pd.concat([steady("managed"), steady("unmanaged")])
    t0 = T0.timestamp()
    window = (t0 + 40, t0 + 60)
    rows = rows_of(pair, exclusions=[window])
    assert_adds_up(rows)
    for arm in ("managed", "unmanaged"):
        got = one(rows, arm)
        assert got["excluded_gpu_h"] == pytest.approx(20 * H)
        assert got["allocated_gpu_h"] == pytest.approx(81 * H)  # 101 s less the 20 excluded
        assert got["delivered_gpu_h"] == pytest.approx(79 * H)  # 1 → 100 s less the 20
    untouched = rows_of(pair, exclusions=[(t0 + 500, t0 + 600)])
    assert (untouched["excluded_gpu_h"] == 0).all()
    assert untouched["allocated_gpu_h"].tolist() == pytest.approx([101 * H] * 2)
    plan = make_plan(
        exclusions=[
            {
                "start": dt.datetime.fromtimestamp(window[0], dt.UTC),
                "end": dt.datetime.fromtimestamp(window[1], dt.UTC),
                "reason": "firmware upgrade",
            }
        ]
    )
    lines = goodput_section(plan, rows.assign(run_id="u1")).exclusions
    assert lines[0] == "2026-12-02 12:00 → 2026-12-02 12:01 UTC: firmware upgrade"
    assert lines[1] == f"removed from both arms alike: managed {20 * H:.3g} GPU-h, " + (
        f"unmanaged {20 * H:.3g} GPU-h"
    )


def test_a_chain_on_one_arm_only_is_not_the_comparisons() -> None:
    """The compatibility sweep's cycles and the install steps run on the managed arm only:
    counted, they would be idle or delivered time on that arm alone."""
    install = events([ev(0, "install_step"), ev(5, "installed")], arm="managed", trial="install")
    compat = steady("managed", trial="compat-digits-train")
    pair = pd.concat([steady("managed"), steady("unmanaged"), compat, install])
    kept = paired_trials(pair)
    assert set(kept["trial_id"]) == {"pair"}
    rows = rows_of(kept)
    assert one(rows, "managed")["allocated_gpu_h"] == one(rows, "unmanaged")["allocated_gpu_h"]


def test_figures_are_provisional_until_every_chain_has_ended() -> None:
    sunday = dt.datetime(2026, 12, 6, 23, 59, 30, tzinfo=dt.UTC)  # ISO week 2026-W49
    running = events([ev(0, "launch"), *progress(range(1, 60), 1)], t0=sunday)  # no end yet
    rows = rows_of(running)
    # It runs Sunday → Monday: both weeks hold it, and both are provisional.
    assert rows.loc[rows["arm"] == "unmanaged", "week"].tolist() == ["2026-W49", "2026-W50"]
    assert rows.loc[rows["arm"] == "unmanaged", "provisional"].tolist() == [True, True]
    assert rows.loc[rows["arm"] == "unmanaged", "chains_open"].tolist() == [1, 1]
    # The harness closed its trial (a trials row): ended.
    trials = pd.DataFrame({"run_id": ["r1"], "trial_id": ["t"], "arm": ["unmanaged"], "gpus": [1]})
    assert not rows_of(running, trials)["provisional"].any()
    # Its own end in the record: ended.
    ended = events(
        [ev(0, "launch"), *progress(range(1, 60), 1), ev(60, "stopped_by_harness")], t0=sunday
    )
    assert not rows_of(ended)["provisional"].any()


def test_a_provisional_week_reads_undecided_in_the_weekly_report() -> None:
    weeks = ("2026-W49", "2026-W50", "2026-W51", "2026-W52")
    util_rows = [r for w in weeks for r in (util(w, "managed", 9.0), util(w, "unmanaged", 8.0))]
    done = {"chains": 2, "chains_open": 0, "provisional": False, "queued_gpu_h": 0.0}
    util_rows = [
        {**r, **done, "unfinished_step_gpu_h": 0.0, "excluded_gpu_h": 0.0} for r in util_rows
    ]
    plan = make_plan()
    final = week_report(plan, {"utilization": frame(util_rows, UTILIZATION)}, "2026-W52")
    assert row(final.rows, "goodput_gain", "both")["verdict"] == "met"
    assert final.goodput.status.startswith("Final: every one of the 4 chains")
    util_rows[-1] = {**util_rows[-1], "chains_open": 1, "provisional": True}  # W52 unmanaged
    report = week_report(plan, {"utilization": frame(util_rows, UTILIZATION)}, "2026-W52")
    gain = row(report.rows, "goodput_gain", "both")
    assert (gain["verdict"], gain["provisional"]) == ("undecided", True)
    assert gain["note"] == "provisional: weeks 2026-W52 hold chains that had not ended"
    goodput = row(report.rows, "goodput", "unmanaged")
    assert goodput["provisional"] and goodput["note"].startswith("provisional: 1 of 2 chains")
    assert not row(report.rows, "goodput", "managed")["provisional"]
    assert row(report.rows, "goodput_job_span", "managed")["value"] == pytest.approx(0.9)
    assert report.goodput.status.startswith("Provisional: 1 of 4 chains had not ended")
    text = weekly_markdown(report.rows, [], [], None, goodput=report.goodput)
    assert "## Goodput, read two ways" in text and "ml-goodput-measurement" in text


def test_rows_written_before_the_job_span_reading_give_no_figure_for_it() -> None:
    rows = [util(W1, "managed", 9.0), util(W1, "unmanaged", 8.0), util(W2, "managed", 9.0)]
    report = week_report(make_plan(), {"utilization": frame(rows, UTILIZATION)}, W1)
    assert row(report.rows, "goodput", "managed")["value"] == pytest.approx(0.9)
    assert row(report.rows, "goodput_job_span", "managed")["verdict"] == "no data"
    seed, job_span = (r for r in report.goodput.rows if r[0] == "managed")
    assert seed[-1] == "0.900" and job_span[-1] == "—"


@pytest.mark.parametrize(
    ("exclusion", "problem"),
    [
        (
            {"start": "2026-12-05T02:00:00", "end": "2026-12-05T06:00:00Z", "reason": "x"},
            "exclusions.0.start: Input should have timezone info",
        ),
        (
            {"start": "2026-12-05T08:00:00Z", "end": "2026-12-05T06:00:00Z", "reason": "x"},
            "exclusions.0: end 2026-12-05T06:00:00+00:00 is not after start",
        ),
        (
            {"start": "2026-12-05T02:00:00Z", "end": "2026-12-05T06:00:00Z"},
            "exclusions.0.reason: required field is missing",
        ),
    ],
)
def test_a_bad_exclusion_is_refused_naming_it(
    tmp_path: Path, exclusion: dict, problem: str
) -> None:
    data = yaml.safe_load((REPO / "plans" / "demo.yaml").read_text())
    data["exclusions"] = [exclusion]
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(PlanError) as err:
        load_plan(path)
    assert problem in str(err.value)
    assert f"{path}:" in str(err.value)  # the file and the line
