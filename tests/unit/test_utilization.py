"""Job-level utilization (tasks.window.utilization): constructed event sequences whose answers are
worked out by hand below, then the real recovery experiment's events on the demo plan."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tasks.data.datasets import EVENTS, UTILIZATION
from tasks.data.errors import CkptPocError
from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tasks.data.store import read_dataset, write_dataset
from tasks.window.chains import CATEGORIES, chain_events, classify_chain, classify_chains
from tasks.window.utilization import compute_utilization, utilization_rows
from tests.support.common import REPO

T0 = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)  # a Wednesday of ISO week 2026-W49
MONDAY = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)  # 2026-W50 starts here
H = 1 / 3600  # one GPU-second in GPU-hours


def events(
    seq: list[tuple[float, str, dict[str, Any]]],
    *,
    trial: str = "t",
    arm: str = "unmanaged",
    t0: dt.datetime = T0,
    run: str = "r1",
) -> pd.DataFrame:
    """An events frame: (seconds after t0, event, detail), one host, one clock."""
    return pd.DataFrame(
        {
            "run_id": run,
            "trial_id": trial,
            "arm": arm,
            "event": [name for _, name, _ in seq],
            "t_wall": [t0 + dt.timedelta(seconds=t) for t, _, _ in seq],
            "t_mono_ns": [10**12 + round(t * 1e9) for t, _, _ in seq],
            "host": "node-a",
            "detail": [json.dumps(d) for _, _, d in seq],
        }
    )


def ev(t: float, name: str, **detail: Any) -> tuple[float, str, dict[str, Any]]:
    return (t, name, detail)


def progress(steps: range, t_first: float, dt_s: float = 1.0) -> list:
    return [ev(t_first + i * dt_s, "progress", step=s) for i, s in enumerate(steps)]


def seconds(frame: pd.DataFrame, arm: str = "unmanaged", gpus: int = 1) -> dict[str, float]:
    chain = classify_chains(frame, default_gpus=gpus)
    (one,) = [c for c in chain if c.arm == arm]
    out = {name: sum(b - a for a, b in ivs) for name, ivs in one.parts.items()}
    out["allocated"] = sum(b - a for a, b in one.allocated)
    return out


def assert_adds_up(rows: pd.DataFrame) -> None:
    parts = rows[[f"{c}_gpu_h" for c in CATEGORIES]].sum(axis=1)
    assert ((parts - rows["allocated_gpu_h"]).abs() <= 1e-12 + 1e-9 * parts.abs()).all(), rows
    goodput = rows["goodput"].dropna()
    assert ((goodput >= 0) & (goodput <= 1)).all()
    assert (rows.loc[rows["allocated_gpu_h"] == 0, "goodput"].isna()).all()


def unmanaged_killed_at_100() -> pd.DataFrame:
    """Starts at 0; 10 s init; steps 0..100 at 10..110 s (one a second); its own last app
    checkpoint at step 50; SIGKILL at step 100 (110 s); restarted with 5 s of init, it
    resumes from step 50: step 51 at 116 s (serving again), … step 150 at 215 s; exits."""
    return events(
        [
            ev(0, "launch", slot="a"),
            *progress(range(0, 101), 10),
            ev(110, "fault_injected", fault="sigkill"),
            ev(110.1, "detected"),
            ev(110.2, "started"),
            ev(110.3, "restart_start", recoverable_point="app_checkpoint"),
            ev(110.4, "restarted"),
            ev(110.5, "restored"),
            *progress(range(51, 151), 116),
            ev(116.001, "serving_again", step=51),
            ev(215, "exited", rc=0),
        ]
    )


def test_unmanaged_copy_killed_after_its_own_checkpoint() -> None:
    got = seconds(unmanaged_killed_at_100())
    # By hand: 10 s init (other); steps 0→50 kept (50 s) and 51→150 after the restart
    # (215 − 116.001 = 98.999 s) delivered; 50→100 redone (lost, 50 s); fault → serving
    # again 6.001 s (recovery). Nothing after the last step (exit at the last step's time).
    assert got["idle_other"] == pytest.approx(10)
    assert got["delivered"] == pytest.approx(50 + 98.999)
    assert got["lost"] == pytest.approx(50)
    assert got["idle_recovery"] == pytest.approx(6.001)
    assert got["idle_checkpoint"] == 0
    assert got["allocated"] == pytest.approx(215)
    trials = pd.DataFrame({"run_id": ["r1"], "trial_id": ["t"], "arm": ["unmanaged"], "gpus": [2]})
    rows = utilization_rows(
        unmanaged_killed_at_100(), trials, workload="w", default_gpus=1, computed_at=T0
    )
    assert_adds_up(rows)
    row = rows.set_index("arm").loc["unmanaged"]
    assert row["week"] == "2026-W49" and row["jobs"] == 2  # the first copy and its restart
    assert row["allocated_gpu_h"] == pytest.approx(215 * 2 * H)  # trials' 2 GPUs, not 1
    assert row["lost_gpu_h"] == pytest.approx(50 * 2 * H)
    assert row["goodput"] == pytest.approx(148.999 / 215)
    managed = rows.set_index("arm").loc["managed"]  # no managed chain: a row, nothing in it
    assert managed["jobs"] == 0 and managed["allocated_gpu_h"] == 0
    assert pd.isna(managed["goodput"])


def test_managed_copy_with_two_freezes_and_a_restore() -> None:
    # Steps 1..45 at 6..50 s; dumps at 20.5 and 40.5 s, each frozen 1 s at its end (21→22,
    # 41→42); fault at 50.5 s; CRIU restores checkpoint 2 (taken at 40.5 s, holding step
    # 35): step 36 at 53 s (serving again), … step 60 at 77 s; exits at 77.5 s.
    frame = events(
        [
            ev(0, "launch"),
            *progress(range(1, 46), 6),
            ev(20.5, "checkpoint_start", index=1),
            ev(22.0, "checkpoint_end", index=1, frozen_us=1_000_000, dump_s=1.5),
            ev(40.5, "checkpoint_start", index=2),
            ev(42.0, "checkpoint_end", index=2, frozen_us=1_000_000, dump_s=1.5),
            ev(50.5, "fault_injected", fault="sigkill"),
            ev(50.6, "detected"),
            ev(50.7, "started"),
            ev(50.8, "restore_start", index=2),
            ev(51.5, "restored", index=2),
            *progress(range(36, 61), 53),
            ev(53, "serving_again", step=36),
            ev(77.5, "exited"),
        ],
        arm="managed",
    )
    got = seconds(frame, "managed")
    # lost: checkpoint 2's moment (40.5) → fault (50.5), less its 1 s freeze = 9 s.
    # checkpoint: 2 × 1 s. recovery: 50.5 → 53 = 2.5 s. other: 0 → 6 and 77 → 77.5.
    # delivered: working 6 → 50.5 and 53 → 77 (68.5 s) − 2 s frozen − 9 s lost = 57.5 s.
    assert got["lost"] == pytest.approx(9)
    assert got["idle_checkpoint"] == pytest.approx(2)
    assert got["idle_recovery"] == pytest.approx(2.5)
    assert got["idle_other"] == pytest.approx(6.5)
    assert got["delivered"] == pytest.approx(57.5)
    assert got["allocated"] == pytest.approx(77.5)


def test_managed_loses_less_than_unmanaged_on_the_same_fault() -> None:
    both = pd.concat(
        [
            unmanaged_killed_at_100(),
            events(
                [
                    ev(0, "launch"),
                    *progress(range(0, 101), 10),
                    ev(104.5, "checkpoint_start", index=7),
                    ev(105.0, "checkpoint_end", index=7, frozen_us=200_000),
                    ev(110, "fault_injected"),
                    ev(110.2, "started"),
                    ev(111, "restored", index=7),
                    *progress(range(95, 151), 112),
                    ev(112, "serving_again", step=95),
                    ev(167, "exited"),
                ],
                arm="managed",
            ),
        ]
    )
    rows = utilization_rows(both, workload="w", default_gpus=1).set_index("arm")
    assert_adds_up(rows.reset_index())
    # managed: lost 104.5 → 110 less the 0.2 s freeze = 5.3 s; unmanaged: 50 s.
    assert rows.loc["managed", "lost_gpu_h"] == pytest.approx(5.3 * H)
    assert rows.loc["unmanaged", "lost_gpu_h"] == pytest.approx(50 * H)
    assert rows.loc["managed", "goodput"] > rows.loc["unmanaged", "goodput"]


def test_batched_progress_reports_are_interpolated() -> None:
    # The probe saw steps ten at a time: step 10k at 10k s. Restarted, the copy's first new
    # step is 46 (it resumed from 45): step 45 was reached at 45 s (between the reports of
    # 40 and 50), so 45 → 105 (the fault) is lost, the in-flight time after step 100 too.
    frame = events(
        [
            ev(0, "launch"),
            *[ev(10.0 * k, "progress", step=10 * k) for k in range(1, 11)],
            ev(105, "fault_injected"),
            ev(105.5, "restart_start"),
            ev(115, "progress", step=46),
            ev(115, "serving_again", step=46),
            ev(120, "progress", step=50),
        ]
    )
    got = seconds(frame)
    assert got["lost"] == pytest.approx(60)
    assert got["delivered"] == pytest.approx(35 + 5)  # 10 → 45 and 115 → 120
    assert got["idle_recovery"] == pytest.approx(10)
    assert got["idle_other"] == pytest.approx(10)


def test_restart_from_the_start_loses_all_progress() -> None:
    frame = events(
        [
            ev(0, "launch"),
            *progress(range(1, 31), 5),
            ev(40, "fault_injected"),
            ev(40.5, "restart_start", recoverable_point="start"),
            ev(47, "progress", step=1),
            ev(47, "serving_again", step=1),
            *progress(range(2, 11), 48),
            ev(57, "exited"),
        ]
    )
    got = seconds(frame)
    assert got["lost"] == pytest.approx(35)  # 5 → 40: everything before the fault
    assert got["delivered"] == pytest.approx(9)  # 47 → 56
    assert got["idle_other"] == pytest.approx(5 + 1)  # init, and 56 → 57 after the last step
    assert got["idle_recovery"] == pytest.approx(7)


def test_a_fault_nothing_came_back_from_loses_its_attempt() -> None:
    frame = events(
        [
            ev(0, "launch"),
            *progress(range(1, 21), 1),
            ev(20.5, "fault_injected"),
            ev(20.6, "detected"),
            ev(25, "trial_failed", reason="restore failed"),
        ]
    )
    got = seconds(frame)
    assert got == pytest.approx(
        {
            "lost": 19.5,
            "idle_recovery": 4.5,
            "idle_other": 1,
            "delivered": 0,
            "idle_checkpoint": 0,
            "allocated": 25,
        }
    )


def test_a_copy_with_no_progress_is_all_idle() -> None:
    frame = events([ev(0, "launch"), ev(3, "started"), ev(30, "trial_failed", reason="x")])
    got = seconds(frame)
    assert got["idle_other"] == pytest.approx(30) and got["allocated"] == pytest.approx(30)
    assert got["delivered"] == got["lost"] == 0
    rows = utilization_rows(frame, workload="w", default_gpus=1).set_index("arm")
    assert rows.loc["unmanaged", "goodput"] == 0 and rows.loc["unmanaged", "jobs"] == 1


def test_an_allocation_across_sunday_midnight_counts_in_both_weeks() -> None:
    start = MONDAY - dt.timedelta(seconds=60)  # Sunday 23:59:00
    frame = events(
        [ev(0, "launch"), *progress(range(0, 121), 10), ev(130, "exited")],
        t0=start,
    )
    rows = utilization_rows(frame, workload="w", default_gpus=4, week=None).set_index(
        ["week", "arm"]
    )
    assert_adds_up(rows.reset_index())
    sunday, monday = rows.loc[("2026-W49", "unmanaged")], rows.loc[("2026-W50", "unmanaged")]
    assert sunday["allocated_gpu_h"] == pytest.approx(60 * 4 * H)
    assert sunday["idle_other_gpu_h"] == pytest.approx(10 * 4 * H)
    assert sunday["delivered_gpu_h"] == pytest.approx(50 * 4 * H)
    assert monday["allocated_gpu_h"] == pytest.approx(70 * 4 * H)
    assert monday["delivered_gpu_h"] == pytest.approx(70 * 4 * H)
    assert sunday["jobs"] == monday["jobs"] == 1
    assert sunday["week_start"] == MONDAY - dt.timedelta(days=7)
    assert monday["week_start"] == MONDAY
    # One week asked for: only its rows; a week with nothing allocated: both arms, empty.
    only = utilization_rows(frame, workload="w", default_gpus=4, week="2026-W50")
    assert set(only["week"]) == {"2026-W50"} and len(only) == 2
    empty = utilization_rows(frame, workload="w", default_gpus=4, week="2027-W01")
    assert (empty["jobs"] == 0).all() and empty["goodput"].isna().all()


def test_slurm_release_between_jobs_is_not_allocated() -> None:
    frame = events(
        [
            ev(0, "launch"),
            ev(30, "job_started"),  # 30 s queued: not allocated
            *progress(range(1, 11), 35),
            ev(45, "fault_injected"),
            ev(47, "detected"),
            ev(48, "recovery_submitted"),
            ev(60, "job_started"),  # 47 → 60: Slurm had released the allocation
            ev(61, "restored", index=None),
            ev(63, "progress", step=6),
            ev(63, "serving_again", step=6),
            ev(64, "progress", step=7),
        ]
    )
    got = seconds(frame)
    assert got["allocated"] == pytest.approx((47 - 30) + (64 - 60))
    assert got["idle_recovery"] == pytest.approx((47 - 45) + (63 - 60))
    assert got["lost"] == pytest.approx(45 - 39)  # it resumed from step 5, reported at 39 s
    assert sum(got[c] for c in CATEGORIES) == pytest.approx(got["allocated"])


def samples(rows: list[dict[str, Any]]) -> pd.DataFrame:
    base = {"workload": None, "trial_id": None, "device": "gpu", "unit": "percent"}
    frame = pd.DataFrame([{**base, **r} for r in rows])
    for col in ("t_from", "t_to"):
        frame[col] = [T0 + dt.timedelta(seconds=s) for s in frame[col]]
    return frame


def test_busy_fraction_is_the_overlap_weighted_mean_of_gpu_samples() -> None:
    frame = pd.concat(
        [
            events(
                [ev(0, "launch"), *progress(range(1, 16), 0.5), ev(15, "exited")], arm="managed"
            ),
            events([ev(0, "launch"), *progress(range(1, 6), 1), ev(20, "exited")]),
        ]
    )
    got = samples(
        [
            dict(arm="managed", metric="gpu_utilization", t_from=0, t_to=10, value=50.0),
            dict(arm="managed", metric="gpu_utilization", t_from=10, t_to=20, value=100.0),
            dict(arm="managed", metric="gpu_utilization", t_from=900, t_to=910, value=0.0),
            dict(arm="managed", metric="sm_activity", t_from=0, t_to=10, value=1.0),
            dict(
                arm="managed",
                metric="cpu_utilization",
                device="cpu",
                t_from=0,
                t_to=15,
                value=1.0,
                unit="cores",
            ),
            dict(
                arm="unmanaged",
                metric="cpu_utilization",
                device="cpu",
                t_from=0,
                t_to=20,
                value=0.8,
                unit="cores",
            ),
            dict(arm=None, metric="gpu_utilization", t_from=0, t_to=20, value=100.0),
        ]
    )
    rows = utilization_rows(frame, samples=got, workload="w", default_gpus=1).set_index("arm")
    # managed holds 0 → 15 s: 10 s at 50 % and 5 s at 100 % → 2/3; the sample at 900 s,
    # the sm_activity, the CPU and the unattributed rows are not in it.
    assert rows.loc["managed", "busy_fraction"] == pytest.approx((0.5 * 10 + 1.0 * 5) / 15)
    assert rows.loc["managed", "busy_metric"] == "gpu_utilization"
    assert rows.loc["managed", "samples"] == 2
    # unmanaged has only CPU data: labelled so, in its own unit, never as GPU data.
    assert rows.loc["unmanaged", "busy_metric"] == "cpu_utilization [cores]"
    assert rows.loc["unmanaged", "busy_fraction"] == pytest.approx(0.8)
    assert rows.loc["unmanaged", "samples"] == 1
    none = utilization_rows(frame, workload="w", default_gpus=1)
    assert none["busy_fraction"].isna().all() and (none["samples"] == 0).all()
    assert none["busy_metric"].isna().all()


def test_a_trial_labelled_sample_counts_only_against_its_trial() -> None:
    frame = pd.concat(
        [
            events([ev(0, "launch"), ev(10, "exited")], trial="a"),
            events([ev(100, "launch"), ev(110, "exited")], trial="b"),
        ]
    )
    got = samples(
        [
            dict(
                arm="unmanaged",
                trial_id="b",
                metric="gpu_utilization",
                t_from=0,
                t_to=10,
                value=100.0,
            ),
            dict(
                arm="unmanaged",
                trial_id="a",
                metric="gpu_utilization",
                t_from=0,
                t_to=10,
                value=20.0,
                unit="percent",
            ),
        ]
    )
    rows = utilization_rows(frame, samples=got, workload="w", default_gpus=1).set_index("arm")
    assert rows.loc["unmanaged", "busy_fraction"] == pytest.approx(0.2)
    assert rows.loc["unmanaged", "samples"] == 1


def test_one_chain_on_several_hosts_uses_the_wall_clock() -> None:
    frame = events([ev(0, "launch"), *progress(range(1, 4), 1), ev(5, "exited")])
    frame.loc[2:, "host"] = "node-b"  # a Slurm job's events come from its node
    frame.loc[2:, "t_mono_ns"] = 5  # another host's monotonic clock: not comparable
    chain = classify_chain(chain_events(frame), "r1", "t", "unmanaged", 1)
    assert sum(b - a for a, b in chain.allocated) == pytest.approx(5)


def test_a_malformed_week_is_refused() -> None:
    with pytest.raises(CkptPocError, match="not an ISO week"):
        utilization_rows(unmanaged_killed_at_100(), workload="w", default_gpus=1, week="2026-49")


def test_a_sample_of_no_trial_is_not_counted_twice_by_overlapping_chains() -> None:
    frame = pd.concat(
        [
            events([ev(0, "launch"), ev(10, "exited")], trial="a"),
            events([ev(5, "launch"), ev(20, "exited")], trial="b"),
        ]
    )
    got = samples(
        [
            dict(arm="unmanaged", metric="gpu_utilization", t_from=0, t_to=10, value=40.0),
            dict(arm="unmanaged", metric="gpu_utilization", t_from=10, t_to=20, value=100.0),
        ]
    )
    rows = utilization_rows(frame, samples=got, workload="w", default_gpus=1).set_index("arm")
    # The arm holds 0 → 20 s (two allocations 5 → 10): each sample weighs its 10 s once.
    assert rows.loc["unmanaged", "busy_fraction"] == pytest.approx(0.7)
    assert rows.loc["unmanaged", "allocated_gpu_h"] == pytest.approx(25 * H)


def test_compute_utilization_reads_committed_events_and_writes_its_rows(tmp_path: Path) -> None:
    plan_path = REPO / "plans" / "demo.yaml"
    plan = load_plan(plan_path).model_copy(update={"data_dir": str(tmp_path / "data")})
    for commit in (True, False):  # a run not committed (killed, or still running) is not read
        ctx = make_run_context(plan, plan_path, stage="recovery")
        unmanaged = unmanaged_killed_at_100()
        # The same trial on the managed arm (a comparison has both), and a trial on the
        # managed arm only (a compatibility cycle): not the comparison's, not counted.
        managed = unmanaged.assign(arm="managed")
        alone = unmanaged.assign(arm="managed", trial_id="compat-digits-train")
        frame = pd.concat([unmanaged, managed, alone]).assign(**ctx.stamp())
        write_dataset(frame, EVENTS, data_dir=ctx.data_dir, poc=ctx.poc, run_id=ctx.run_id)
        if commit:
            ctx.commit()
    uctx = make_run_context(plan, plan_path, stage="utilization")
    rows = compute_utilization(plan, uctx, week="2026-W49")
    uctx.commit()
    assert_adds_up(rows)
    stored = read_dataset(UTILIZATION, data_dir=uctx.data_dir, poc=plan.poc)
    assert len(stored) == 2 and set(stored["run_id"]) == {uctx.run_id}
    row = stored.set_index("arm").loc["unmanaged"]
    assert row["workload"] == plan.workload.name and row["jobs"] == 2
    assert row["allocated_gpu_h"] == pytest.approx(215 * plan.workload.gpus * H)
    assert row["lost_gpu_h"] == pytest.approx(50 * plan.workload.gpus * H)
    assert row["fp_host"] == uctx.fingerprint["fp_host"]
    managed_row = stored.set_index("arm").loc["managed"]
    assert managed_row["allocated_gpu_h"] == pytest.approx(row["allocated_gpu_h"])
    assert managed_row["chains"] == 1 and managed_row["jobs"] == 2


# --- real events: the local recovery experiment on the demo plan ---------------------------


@pytest.fixture
def criu_path(request: pytest.FixtureRequest) -> str:
    """A working CRIU: $CKPT_POC_CRIU or the project's build, else scripts/install-criu."""
    from tasks.engine.checkpointers.criu import CriuError, find_criu

    try:
        return find_criu()
    except CriuError:
        return request.getfixturevalue("criu_binary")
