"""Interruptions with a notice on a real single-node Slurm with real CRIU: `preempt` (a real
higher-priority job of the PoC's own in scripts/slurm-up's `poc-urgent` partition; `poc`'s
GraceTime between notice and kill), a warned `time-limit` (`--signal=B:USR1@warn_s`) and
`drain` (the node drained, the job told, requeued `grace_s` later, the node resumed).

The job is requeued under its own id; its next attempt (SLURM_RESTART_COUNT > 0) restores the
managed copy from its notice checkpoint — it comes back exactly at the step that checkpoint
held — and resumes the unmanaged one from its application checkpoint. A notice too short for
the dump is a missed deadline: the managed copy comes back from its last periodic checkpoint,
the steps since counted as lost.

A warned time limit waits for Slurm's once-a-minute limit check: one trial, the managed arm.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tasks.data.errors import PlanError
from tasks.data.plan import load_plan
from tests.integration.test_notice_slurm import PREEMPTOR
from tests.support.common import demo_plan_dict


def test_plan_check_wants_a_preemptor_and_a_warning_only_where_they_belong(
    tmp_path: Path,
) -> None:
    plan = demo_plan_dict()
    plan["cluster"] = {"kind": "slurm", "nodes": ["ckpt-node1"], "queue": "poc"}
    plan["faults"] = [
        {"kind": "preempt", "grace_s": 5},
        {"kind": "drain"},
        {"kind": "scancel", "warn_s": 60, "preemptor_partition": PREEMPTOR},
        {"kind": "time-limit", "warn_s": 60},
    ]
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    with pytest.raises(PlanError) as bad:
        load_plan(path, check_cluster=False)
    text = str(bad.value)
    assert "faults.0.preemptor_partition: a preempt fault needs its preemptor (the higher" in text
    assert "faults.1.grace_s: a drain fault needs its grace period" in text
    assert "faults.2.warn_s: a scancel fault has no warn_s (only time-limit has one)" in text
    assert "faults.2.preemptor_partition: a scancel fault has no preemptor_partition" in text
    assert "faults.3" not in text
