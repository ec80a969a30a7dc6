"""The baseline's exposure beside the work lost per interruption (weekly report and record)."""

from __future__ import annotations

import pandas as pd

from tasks.window.weekly.interruptions import against_baseline, latest_exposure, loss_rows


def _exposure() -> pd.DataFrame:
    base = {"kind": "state", "workload": None}
    rows = [
        {**base, "run_id": "old", "state": "TIMEOUT", "exposed_gpu_hours": 1.0,
         "timeout_gpu_hours": 1.0, "computed_at": pd.Timestamp("2026-11-01", tz="UTC")},
        {**base, "run_id": "b2", "state": "TIMEOUT", "exposed_gpu_hours": 120.0,
         "timeout_gpu_hours": 120.0, "computed_at": pd.Timestamp("2026-11-30", tz="UTC")},
        {**base, "run_id": "b2", "state": "PREEMPTED", "exposed_gpu_hours": 30.0,
         "timeout_gpu_hours": 0.0, "computed_at": pd.Timestamp("2026-11-30", tz="UTC")},
        {**base, "run_id": "b2", "state": "FAILED", "exposed_gpu_hours": 50.0,
         "timeout_gpu_hours": 0.0, "computed_at": pd.Timestamp("2026-11-30", tz="UTC")},
    ]  # fmt: skip
    return pd.DataFrame(rows)


def _trials() -> pd.DataFrame:
    def t(fault: str, arm: str, lost: float, steps: int, notice: str | None, ok: bool = True):
        return {
            "measure": "recovery", "fault": fault, "arm": arm, "status": "ok" if ok else "failed",
            "work_lost_gpu_h": lost, "steps_lost": steps, "notice_checkpoint": notice,
        }  # fmt: skip

    return pd.DataFrame(
        [
            t("sigkill", "managed", 0.001, 10, None),
            t("sigkill", "unmanaged", 0.01, 40, None),
            t("sigterm-grace", "managed", 0.0, 0, "finished"),
            t("sigterm-grace", "managed", 0.002, 20, "missed"),
            t("sigterm-grace", "unmanaged", 0.009, 30, "none"),
            t("sigterm-grace", "unmanaged", 9.0, 999, "none", ok=False),  # not counted
        ]
    )


def test_the_latest_baseline_run_is_the_one_set_beside_the_trials() -> None:
    ex = latest_exposure(_exposure())
    assert ex is not None
    assert (ex.run_id, ex.exposed_gpu_h, ex.time_limit_gpu_h, ex.preempted_gpu_h) == (
        "b2",
        200.0,
        120.0,
        30.0,
    )


def test_the_sentence_names_the_exposure_and_each_arms_median_loss() -> None:
    line = against_baseline(_exposure(), _trials())
    assert line.startswith("The accounting history (baseline run b2) exposed 200 GPU-h")
    assert "120 of them to time limits and 30.0 to preemption" in line
    assert "the managed arm 0.00100 GPU-h (n=3)" in line
    assert "the unmanaged arm 0.00950 GPU-h (n=2)" in line  # the failed trial is left out


def test_rows_per_fault_and_arm_count_the_notice_checkpoints() -> None:
    rows = {(r[0], r[1]): r for r in loss_rows(_trials())}
    assert rows[("sigterm-grace", "managed")][2] == "2"
    assert rows[("sigterm-grace", "managed")][5] == "1 finished, 1 missed"
    assert rows[("sigterm-grace", "unmanaged")][5] == "1 none"
    assert rows[("sigkill", "managed")][5] == "—"


def test_without_a_baseline_or_trials_it_says_so() -> None:
    empty = pd.DataFrame(columns=["measure", "status", "arm", "work_lost_gpu_h"])
    line = against_baseline(pd.DataFrame(), empty)
    assert line == (
        "No baseline exposure to set beside the trials; no recovery trial measured the work "
        "lost per interruption yet."
    )
