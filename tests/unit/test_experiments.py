"""Overhead, cold start and checkpoint cost on the demo plan with real CRIU, end to end
through the CLI (and so through their Prefect flows), then their gates on constructed rows.

The demo workload is cut to 120 steps (about 2.5 s a run) so that three interleaved pairs
per variant take well under a minute.
"""

from __future__ import annotations

from tasks.data.plan import load_plan
from tasks.experiments.cold_start import cold_start_gate_checks
from tasks.experiments.overhead import overhead_gate_checks
from tests.integration.test_experiments import _event, _rows


def test_a_checkpoint_inside_a_steady_span_is_refused(write_plan) -> None:
    plan = load_plan(write_plan())
    rows = _rows(
        "overhead",
        trial_id=[f"steady-{p}" for p in range(3) for _ in range(2)],
        arm=["unmanaged", "managed"] * 3,
        variant=["steady"] * 6,
    )
    events = [
        _event(t, a, "progress", ns)
        for t in rows["trial_id"]
        for a in ("managed",)
        for ns in (100, 200)
    ]
    events.append(_event("steady-1", "managed", "checkpoint_start", 150))
    checks = {c.expectation: c for c in overhead_gate_checks(rows, plan, events)}
    assert not checks["no_checkpoint_inside_a_steady_span"].success
    assert checks["no_checkpoint_inside_a_steady_span"].observed["runs"] == ["steady-1/managed"]
    assert checks["repeats[steady,managed]"].success


def test_a_restore_without_checkpoint_bytes_is_refused(write_plan) -> None:
    plan = load_plan(write_plan())
    rows = _rows(
        "cold_start",
        trial_id=[f"cold-{r}" for r in range(3) for _ in range(2)],
        arm=["unmanaged", "managed"] * 3,
        checkpoint_bytes=[None, 10, None, None, None, 12],
    )
    checks = {c.expectation: c for c in cold_start_gate_checks(rows, plan)}
    assert not checks["every_restore_has_checkpoint_bytes"].success
    assert checks["every_restore_has_checkpoint_bytes"].observed["trial_ids"] == ["cold-1"]
    rows.loc[0, "nodes"] = "local-b"  # two changes at once: refused
    checks = {c.expectation: c for c in cold_start_gate_checks(rows, plan)}
    assert not checks["arms_differ_only_in_managed[nodes]"].success
