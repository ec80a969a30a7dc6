"""What a platform engineer reads first in the Prefect UI: the verdicts, each with its
criterion, threshold and unit; then the numbers, in a table that fits a 1600 px window."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.experiments.report import (
    recovery_markdown,
    recovery_verdicts,
    verdict_line,
)
from tasks.experiments.report_cold_start import cold_start_markdown
from tasks.experiments.results import ColdStartResult, RecoveryResult


def _arm(fault: str, arm: str, median: float, verdicts: bool) -> dict:
    stats = {"n": 3, "median": median, "p90": median * 1.1, "min": median * 0.9, "max": median}
    entry = {
        "fault": fault,
        "arm": arm,
        "failed": 0,
        "recovery_s": stats,
        "work_lost_gpu_h": {**stats, "median": 0.000108},
        "steps_lost": {**stats, "median": 17.0},
        "managed_over_unmanaged_recovery": 0.26,
    }
    if verdicts:
        entry["recovery_time_verdict"] = {
            "value": median,
            "threshold": 30.0,
            "statistic": "median",
            "verdict": "met",
        }
        entry["work_lost_verdict"] = {
            "value": 0.02,
            "threshold": 0.01,
            "statistic": "median",
            "verdict": "not met",
        }
    return entry


RESULT = {
    "cluster": "local",
    "run_id": "0b5c2e0e-1111-4a4a-9c9c-000000000000",
    "trials": 12,
    "failed": 1,
    "includes": ["detection+scheduling+restore+warmup (local: scheduling is the slot)"],
    "summary": [
        _arm(f, a, m, a == "managed")
        for f in ("sigkill", "sigkill-group")
        for a, m in (("unmanaged", 0.19712), ("managed", 0.09049))
    ],
    "failures": [
        {
            "trial_id": "sigkill-2",
            "arm": "managed",
            "reason": "no new progress after recovery",
            "log_tail": "step=130 loss=0.1\nKilled",
        }
    ],
}


def test_verdict_lines_name_criterion_threshold_unit_and_outcome() -> None:
    lines = recovery_verdicts(RecoveryResult.from_json(RESULT))
    assert lines[0] == "sigkill: recovery time median 0.090 s (managed, n=3) ≤ 30 s: met"
    assert lines[1] == (
        "sigkill: work lost per interruption median 0.0200 GPU-h (managed, n=3) > 0.01 GPU-h: "
        "not met"
    )
    assert len(lines) == 4
    assert verdict_line("x", "median", "—", "1 s", "undecided") == "x median — vs ≤ 1 s: undecided"
    assert verdict_line("s", "median", "2×", "1.5×", "met", at_most=False).endswith("≥ 1.5×: met")


def test_recovery_markdown_leads_with_verdicts_and_fits_a_1600px_window() -> None:
    md = recovery_markdown(RecoveryResult.from_json(RESULT))
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[0].startswith("## Verdicts") and sections[1].startswith("## Numbers")
    assert "met/met" not in md and "| verdict" not in md
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 4
    # The UI gives a markdown artifact about 1050 of a 1600 px window, and a table cell
    # about 9 px per character plus 24 px of padding: measured in a headless Chromium
    # screenshot, where a 190-character header row overflowed.
    assert max(len(line) for line in table) < 120, max(table, key=len)
    assert "managed / unmanaged median recovery time: sigkill 0.26, sigkill-group 0.26" in md
    assert "0.090 [0.081–0.090]" in md  # to the millisecond the local clock resolves
    assert "| 0.000108 |" in md  # three significant digits, never 1.08e-04
    # A failed trial: its reason and the workload's own last lines.
    assert "no new progress after recovery" in md and "  Killed" in md


@pytest.fixture
def png(tmp_path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = tmp_path / "restore-throughput.png"
    plt.figure(figsize=(2, 2))
    plt.plot([1, 2], [1, 2])
    plt.savefig(path)
    plt.close()
    return path


def test_cold_start_markdown_shows_the_plot_inline(png: Path) -> None:
    import base64

    arm = {"n": 3, "median": 0.3, "min": 0.29, "max": 0.31}
    result = {
        "run_id": "r",
        "threshold": 1.5,
        "speedup": {
            "native": arm,
            "restore": {**arm, "median": 0.12},
            "statistic": "median",
            "speedup": 2.45,
            "ci_low": 2.41,
            "ci_high": 2.67,
            "verdict": "met",
            "verdict_reason": "the CI lies above the threshold",
        },
        "restore_throughput": None,
        "page_cache": ["dropped"],
        "restores": [],
        "checkpoints": {},
        "plot": str(png),
        "failures": [],
    }
    md = cold_start_markdown(ColdStartResult.from_json(result))
    first = next(line for line in md.splitlines() if line.startswith("- "))
    assert first.startswith("- cold-start speed-up (native launch / restore) median 2.45×")
    assert first.endswith("vs ≥ 1.5×: met")  # decided by its CI, which the line gives
    marker = "](data:image/png;base64,"
    assert marker in md
    encoded = md.split(marker, 1)[1].split(")", 1)[0]
    assert base64.b64decode(encoded) == png.read_bytes()
