"""Recovery on the local engine with real faults and real CRIU (groundwork of issue 4).

Both arms of the demo workload, the unmanaged copy first, get SIGKILL and SIGKILL of the
process group at the same step; the managed copy comes back from its last CRIU
checkpoint, the unmanaged from its own. With a CRIU interval shorter than the
application's own checkpoint interval, the managed copy loses fewer steps: measured.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.clock import EventRecorder
from tasks.clusters.local import LocalCluster, WorkloadProcess
from tasks.errors import BlastRadiusError
from tasks.faults import inject_local_fault
from tasks.plan import load_plan
from tasks.recovery import recovery_gate_checks, run_recovery, summarise_recovery
from tasks.runctx import make_run_context
from tests.conftest import REPO

pytestmark = pytest.mark.criu


def test_both_arms_recover_from_each_local_fault(
    tmp_path: Path, criu_binary: str, monkeypatch
) -> None:
    monkeypatch.setenv("CKPT_POC_CRIU", criu_binary)
    plan = load_plan(REPO / "plans" / "demo.yaml")
    plan = plan.model_copy(
        update={
            "data_dir": str(tmp_path / "data"),
            "checkpointer": plan.checkpointer.model_copy(update={"interval_s": 0.3}),
        }
    )
    trials = run_recovery(plan, make_run_context(plan, REPO / "plans" / "demo.yaml"))
    assert len(trials) == len(plan.faults) * plan.repeats * 2
    assert (trials["status"] == "ok").all(), trials[["trial_id", "arm", "reason"]]
    managed = trials[trials["arm"] == "managed"]
    unmanaged = trials[trials["arm"] == "unmanaged"]
    assert set(managed["recoverable_point"]) == {"checkpoint"}
    assert set(unmanaged["recoverable_point"]) == {"app_checkpoint"}
    assert managed["steps_lost"].median() < unmanaged["steps_lost"].median()
    assert (trials["detect_latency_ms"] < 50).all() and (trials["serving_latency_ms"] < 50).all()
    parts = trials[["detection_s", "scheduling_s", "restore_s", "warmup_s"]].sum(axis=1)
    assert (abs(parts - trials["recovery_s"]) < 1e-6).all()
    assert all(c["success"] for c in recovery_gate_checks(trials, plan))
    summary = summarise_recovery(trials, plan)
    assert {(s["fault"], s["arm"]) for s in summary} == {
        (f.kind, arm) for f in plan.faults for arm in ("managed", "unmanaged")
    }


def test_faults_refuse_what_the_run_does_not_own(tmp_path: Path) -> None:
    plan = load_plan(REPO / "plans" / "demo.yaml").model_copy(update={"data_dir": str(tmp_path)})
    recorder = EventRecorder(make_run_context(plan, REPO / "plans" / "demo.yaml"))
    cluster = LocalCluster(list(plan.cluster.nodes), tmp_path / "run", REPO)
    stranger = WorkloadProcess("local-a", "managed", 1, tmp_path / "x.log")
    with pytest.raises(BlastRadiusError):
        inject_local_fault(cluster, stranger, "sigkill", recorder, "t")
    assert recorder.events(event="fault_injected") == []
