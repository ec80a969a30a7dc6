"""Recovery on the local engine with real faults and real CRIU.

End to end through `ckpt-poc recovery --json` with the demo plan: both arms of the demo
workload, the unmanaged copy first, get SIGKILL and SIGKILL of the process group at the
same step; the managed copy comes back from its last CRIU checkpoint, the unmanaged from
its own. The demo's CRIU interval (0.5 s) is shorter than the application's own (50
steps, about 1 s), so the managed copy loses fewer steps: measured, not assumed.

Then the ways a trial fails, each a recorded row with its reason, within a timeout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.data.errors import BlastRadiusError
from tasks.data.plan import load_plan, parse_fault
from tasks.data.runctx import make_run_context
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.local.cluster import LocalCluster
from tasks.engine.clusters.process import WorkloadProcess
from tasks.engine.faults import inject_fault
from tests.support.common import REPO

pytestmark = pytest.mark.criu


def test_faults_refuse_what_the_run_does_not_own(tmp_path: Path) -> None:
    plan = load_plan(REPO / "plans" / "demo.yaml").model_copy(update={"data_dir": str(tmp_path)})
    recorder = EventRecorder(make_run_context(plan, REPO / "plans" / "demo.yaml"))
    cluster = LocalCluster(list(plan.cluster.nodes), tmp_path / "run", REPO)
    stranger = WorkloadProcess("local-a", "managed", 1, tmp_path / "x.log")
    with pytest.raises(BlastRadiusError):
        inject_fault(cluster, stranger, parse_fault(kind="sigkill"), recorder, "t")
    with pytest.raises(BlastRadiusError):
        inject_fault(cluster, stranger, parse_fault(kind="scancel"), recorder, "t")
    assert recorder.events(event="fault_injected") == []
