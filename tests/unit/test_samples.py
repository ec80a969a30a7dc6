"""The committed real accounting sample (from the real single-node Slurm) in its three forms."""

from __future__ import annotations

import pytest

from tasks.baseline.run import run_baseline
from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tests.support.common import REPO

SAMPLES = REPO / "data" / "samples"


def _summary(path, tmp_path):
    plan = load_plan(REPO / "plans" / "demo.yaml").model_copy(update={"data_dir": str(tmp_path)})
    return run_baseline(
        plan, make_run_context(plan, REPO / "plans" / "demo.yaml"), sacct_file=str(path)
    ).summary.to_json()


def test_header_noheader_and_json_dumps_agree(tmp_path) -> None:
    psv = _summary(SAMPLES / "sacct-sample.psv", tmp_path)
    bare = _summary(SAMPLES / "sacct-sample-noheader.psv", tmp_path)
    js = _summary(SAMPLES / "sacct-sample.json", tmp_path)
    assert psv == bare
    assert psv["rows_quarantined"] == 0 and js["rows_quarantined"] == 0
    for key in ("allocations_by_state", "chains", "rows_read"):
        assert psv[key] == js[key], key
    for key in ("gpu_hours_by_state", "node_hours_by_state"):
        assert psv[key] == pytest.approx(js[key]), key
    # The sample holds every state the baseline distinguishes and one resubmission chain.
    assert {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "REQUEUED"} <= set(
        psv["allocations_by_state"]
    )
    assert len(psv["chains"]) == 1
