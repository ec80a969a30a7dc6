"""Recovery on a real single-node Slurm with real CRIU: all four Slurm faults.

Each copy is a batch job pinned to the plan's node. The managed copy runs under the CRIU
wrapper (tasks/engine/clusters/slurm/job.py) that dumps it every interval into a folder
every attempt can
reach; after the fault a restore job — a new job id, linked to the interrupted one —
brings it back. The unmanaged copy is resubmitted, resuming its own checkpoint.

The cluster is the session's (tests/conftest.py: slurm_env), handed over with no job left.
About five minutes on two cores (a time limit takes 90 s a trial; the faults that leave the
node up run side by side).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.data.errors import BlastRadiusError
from tasks.engine.clusters.slurm.cluster import SlurmCluster, SlurmJob
from tests.support.common import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.criu]


def test_slurm_faults_refuse_what_the_run_does_not_own(tmp_path: Path) -> None:
    cluster = SlurmCluster(["ckpt-node1"], "poc", tmp_path, REPO)
    stranger = SlurmJob("1", "ckpt-node1", "managed", tmp_path / "x.log", tmp_path / "x.json")
    with pytest.raises(BlastRadiusError):
        cluster.cancel(stranger)
    with pytest.raises(BlastRadiusError):
        cluster.node_down("login-node", reason="no")
    with pytest.raises(BlastRadiusError):
        cluster.submit("other-node", "managed", {}, name="t", log=tmp_path / "x.log")
