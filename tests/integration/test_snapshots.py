"""Node snapshots and the exit diff, on this machine (root) and on the test's real Slurm.

This VM is shared with a CI run and other sessions: their processes, listening sockets and
temporary files come and go while a test runs. The test plan declares that churn as allowed
changes (each with its why), exactly as a site would declare its own; everything else is
compared, and the planted residue must be reported item by item, and nothing beside it.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tasks.exit.exit_diff import exit_diff
from tasks.exit.snapshots import take_snapshot
from tests.unit.test_snapshots import (
    ROOT_ONLY,
    SHARED_VM_CHURN,
    USER_DATABASES,
    diff,
    local_plan,
    planted_residue,
    snapshot,
)

# alone: its snapshots read the whole node
pytestmark = pytest.mark.alone


def test_two_snapshots_of_an_unchanged_machine_diff_clean(write_plan) -> None:
    plan, path = local_plan(write_plan)
    first = snapshot(plan, path, "before_install")
    time.sleep(1)
    snapshot(plan, path, "after_uninstall")
    result = diff(plan, path, "before_install", "after_uninstall")
    # Every kind was observed; a whole machine is thousands of items (bench/snapshot.py
    # measures how long that takes).
    kinds = set(first["kind"])
    assert {"packages", "units", "files", "sysctls", "processes", "mounts", "users"} <= kinds
    assert {"cron", "ldconfig", "sockets", "excluded"} <= kinds
    assert not first["partial"].any(), first[first["kind"] == "error"]
    assert len(first) > 1000
    assert result.leftovers == [], json.dumps(result.leftovers[:20], indent=1)
    assert result.verdict == "clean"
    assert set(result.nodes) == {"local-a"}


@ROOT_ONLY
def test_planted_residue_is_reported_item_by_item_and_nothing_else(write_plan) -> None:
    plan, path = local_plan(write_plan)
    mark = uuid.uuid4().hex[:10]
    snapshot(plan, path, "before_install")
    with planted_residue(mark) as expected:
        snapshot(plan, path, "after_uninstall")
        # Diff while the residue is still there; a second diff after clean-up below.
        result = diff(plan, path, "before_install", "after_uninstall")
    found = {(x["kind"], x["key"]): x for x in result.leftovers}
    missed = sorted(k for k in expected if k not in found)
    assert not missed, f"planted but not reported: {missed}"
    for key, change in expected.items():
        assert found[key]["change"] == change, found[key]
        assert found[key]["class"] in ("poc", "unexplained"), found[key]
    # The daemon started from the PoC's tree, and its socket, are the PoC's.
    assert {found[k]["class"] for k in expected if k[0] in ("processes", "sockets")} == {"poc"}
    others = {
        k: v
        for k, v in found.items()
        if k not in expected and not (k[0] == "files" and k[1] in USER_DATABASES)
    }
    assert not others, f"reported but not planted: {json.dumps(list(others.values()), indent=1)}"
    assert result.verdict == "leftovers"
    # The details a reader needs: the dangling link, the capability, the sysctl values.
    link = next(v for (k, key), v in found.items() if k == "units")
    assert json.loads(link["after"])["dangling"] is True
    binary = found[("files", f"/usr/local/bin/ckpt-poc-test-{mark}")]
    assert "caps" in json.loads(binary["after"])
    assert found[("sysctls", "fs.pipe-user-pages-soft")]["before"] is not None


@ROOT_ONLY
@pytest.mark.slurm
def test_a_slurm_node_is_snapshotted_by_a_pinned_job(slurm_env, write_plan) -> None:
    mark = uuid.uuid4().hex[:10]
    path = write_plan(
        {
            "cluster": {"kind": "slurm", "nodes": ["ckpt-node1"], "queue": "poc"},
            "faults": [{"kind": "scancel"}],
            "exit.watch": {"kinds": ["scheduler", "files", "processes"], "paths": ["/etc/slurm"]},
            "exit.allowed_changes": [
                {"kind": "scheduler", "key": "node:alloc", "why": "follows the jobs running"},
                *SHARED_VM_CHURN,
            ],
        }
    )
    plan = load_plan(path)
    node = "ckpt-node1"

    def snap(phase: str) -> pd.DataFrame:
        ctx = make_run_context(plan, path, stage="snapshot")
        df = take_snapshot(plan, ctx, phase, node, env=slurm_env)
        ctx.commit()
        return df

    before = snap("before_install")
    keys = set(before.loc[before["kind"] == "scheduler", "key"])
    assert {"node:AvailableFeatures", "node:Gres", "node:State", "config:PlugStackConfig"} <= keys
    assert before.loc[before["key"] == "node:Gres", "value"].iloc[0] == "gpu:2"
    # The job ran the collector: its own srun/slurmstepd family is not in the snapshot.
    procs = " ".join(before.loc[before["kind"] == "processes", "key"])
    assert "tasks.exit.snapshots collect" not in procs
    dropin = Path(f"/etc/slurm/plugstack.conf.d/ckpt-poc-test-{mark}.conf")
    scontrol = ["scontrol", "update", f"NodeName={node}"]
    try:
        dropin.write_text("optional /nonexistent/spank_ckpt_poc_test.so\n")
        subprocess.run(
            [*scontrol, f"AvailableFeatures=ckpt-poc-test-{mark}"],
            env=slurm_env,
            check=True,
            capture_output=True,
        )
        after = snap("after_uninstall")
        ctx = make_run_context(plan, path, stage="exit_diff")
        result = exit_diff(plan, ctx, "before_install", "after_uninstall")
        ctx.commit()
    finally:
        dropin.unlink(missing_ok=True)
    assert not after["partial"].any()
    found = {(x["kind"], x["key"]): x for x in result.leftovers}
    assert found[("scheduler", f"file:{dropin}")]["change"] == "added"
    assert found[("files", str(dropin))]["change"] == "added"
    for features in ("node:AvailableFeatures", "node:ActiveFeatures"):  # Slurm sets both
        assert f"ckpt-poc-test-{mark}" in found[("scheduler", features)]["after"]
    # Nothing else: the job's own processes (srun, slurmstepd, the collector) are not there.
    assert len(found) == 4, json.dumps(result.leftovers, indent=1)
