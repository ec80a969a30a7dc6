"""Smoke test of bench/compatibility.py on the shipped NumPy training example (~15 s):
one repeat of CRIU's cycle and of its own checkpoint, measured and written to the record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_digits_train_both_arms_measured(tmp_path: Path, criu_binary: str) -> None:
    env = {**os.environ, "CKPT_POC_CRIU": criu_binary}
    args = ["--apps", "digits-train", "--repeats", "1", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "bench/compatibility.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (record,) = tmp_path.glob("compatibility-*.json")
    result = json.loads(record.read_text())
    assert result["stop_all_left"] == []
    (row,) = result["rows"]
    assert row["app"] == "digits-train"
    (criu,), (own,) = row["criu"], row["own"]
    assert "error" not in criu, criu
    assert "error" not in own, own
    # CRIU dumped the whole process; the app wrote its weights only.
    assert criu["image_bytes"] > own["bytes"] > 0
    assert 0 < criu["freeze_s"] <= criu["dump_s"]
    assert criu["resumed_step"] > criu["frozen_step"]
    # Relaunched with --resume it went on from its checkpoint, not from step 1.
    assert own["first_step"] >= own["held_step"] and own["resumed_step"] > own["held_step"]
    assert 0 < own["write_s"] < own["resume_s"]
    assert row["ratio_bytes"] == criu["image_bytes"] / own["bytes"]
    assert result["bench_peak_rss_mib"] > 0
    assert "digits-train median" in done.stdout
