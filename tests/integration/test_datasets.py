"""Dataset declarations: one schema drives writer, readers and GX suite; writes are atomic."""

from __future__ import annotations

import json

from tasks.data.datasets import GATES
from tasks.data.fingerprint import collect_fingerprint
from tests.unit.test_datasets import _gate_rows


def test_fingerprint_names_the_criu_the_checkpointer_runs(criu_binary: str) -> None:
    # The project's build is not on PATH: the version is still the one the dumps used.
    version = json.loads(collect_fingerprint()["fp_versions"])["criu"]
    assert version.startswith("Version: 4."), version


def test_the_gx_worker_gives_the_checks_validating_in_process_gives() -> None:
    from tasks.data import gates, gx_worker

    df = _gate_rows()
    df.loc[1, "gate"] = None
    sample, total = gates._sample(df, gates.GX_MAX_ROWS)
    worker = gx_worker.start()
    try:
        remote = gates._worker_checks(worker, "t", GATES, sample, total)
    finally:
        gx_worker.stop(worker)
    local = gates._gx_checks("t", GATES, sample.to_pandas(), total)
    assert remote is not None
    assert [(c.expectation, c.column, c.success) for c in remote] == [
        (c.expectation, c.column, c.success) for c in local
    ]
    # As the gates dataset stores them (NaN, GX's "unexpected null", is not equal to itself).
    stored = [json.dumps(c.observed, default=str) for c in remote]
    assert stored == [json.dumps(c.observed, default=str) for c in local]
