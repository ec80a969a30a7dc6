"""The CLI runs the Prefect flows (test harness server): exit codes, JSON contract, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.common import HEADER

JSON_KEYS = {
    "rows_read",
    "rows_quarantined",
    "allocations_by_state",
    "node_hours_by_state",
    "gpu_hours_by_state",
    "exposed_gpu_hours",
    "timeout_gpu_hours",
    "chains",
    "not_computed",
    "time_formats",
    "rows_short_of_fields",
}

DUMP = (
    "\n".join(
        [
            HEADER,
            "7|7|c1|poc|alice|proj|train|FAILED|3:0|2026-11-01T10:00:00|2026-11-01T10:00:00|"
            "2026-11-01T11:00:00|01:00:00|3600|02:00:00|1|2|cpu=2,gres/gpu=2,node=1|n1",
            "8|8|c1|poc|alice|proj|train|COMPLETED|0:0|2026-11-01T12:00:00|2026-11-01T12:00:00|"
            "2026-11-01T12:30:00|00:30:00|1800|02:00:00|1|2|cpu=2,gres/gpu=2,node=1|n1",
            "this line is not a job",
        ]
    )
    + "\n"
)


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    path = tmp_path / "dump.psv"
    path.write_text(DUMP)
    return path


def _parquet(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*.parquet"))}


def test_plan_check_ok_and_broken(cli, write_plan) -> None:
    ok = cli("plan", "check", str(write_plan()))
    assert ok.returncode == 0, ok.stderr
    bad = cli("plan", "check", str(write_plan({"repeats": 1, "poc": "a b"})))
    assert bad.returncode == 1
    assert "repeats" in bad.stderr and "poc" in bad.stderr and "plan.yaml:" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_baseline_json_contract_and_datasets(cli, write_plan, dump, tmp_path) -> None:
    result = cli("baseline", str(write_plan()), "--sacct-file", str(dump), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)  # stdout holds the JSON alone
    assert set(summary) == JSON_KEYS
    assert summary["rows_read"] == 3 and summary["rows_quarantined"] == 1
    assert summary["allocations_by_state"] == {"COMPLETED": 1, "FAILED": 1}
    assert summary["exposed_gpu_hours"] == pytest.approx(2.0)
    assert summary["chains"] == [["7", "8"]]
    data = tmp_path / "data" / "demo"
    for dataset in ("jobs", "exposure", "quarantine", "gates"):
        assert list((data / dataset).rglob("*.parquet")), dataset
    assert "alice" not in b"".join(_parquet(data).values()).decode("latin-1")


def test_bad_input_errors_clearly_and_keeps_existing_data(cli, write_plan, dump, tmp_path) -> None:
    plan = write_plan()
    assert cli("baseline", str(plan), "--sacct-file", str(dump)).returncode == 0
    before = _parquet(tmp_path / "data")
    # A truncated dump: cut mid-header.
    truncated = tmp_path / "truncated.psv"
    truncated.write_text(HEADER[:40])
    r = cli("baseline", str(plan), "--sacct-file", str(truncated))
    assert r.returncode == 1 and "truncated.psv:1" in r.stderr
    # A missing file, and a broken plan.
    r = cli("baseline", str(plan), "--sacct-file", str(tmp_path / "none.psv"))
    assert r.returncode == 1 and "cannot open accounting file" in r.stderr
    r = cli("baseline", str(write_plan({"faults": []}, "bad.yaml")), "--sacct-file", str(dump))
    assert r.returncode == 1 and "faults" in r.stderr
    assert _parquet(tmp_path / "data") == before


def test_missing_key_is_a_clear_error(cli, write_plan, dump) -> None:
    r = cli(
        "baseline",
        str(write_plan()),
        "--sacct-file",
        str(dump),
        env={"CKPT_POC_PSEUDONYM_KEY": None},
    )
    assert r.returncode == 1 and "CKPT_POC_PSEUDONYM_KEY" in r.stderr
    assert "Traceback" not in r.stderr
