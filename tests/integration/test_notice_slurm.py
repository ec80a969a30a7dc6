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

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tasks.data.datasets import TRIALS
from tasks.data.errors import BlastRadiusError, PlanError
from tasks.data.plan import Fault, Plan, load_plan, parse_fault
from tasks.data.runctx import make_run_context, open_run
from tasks.data.store import read_dataset
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.slurm.cluster import SlurmCluster
from tasks.engine.faults import inject_fault
from tasks.engine.prepared import prepare_workload
from tasks.experiments.recovery import make_cluster, run_recovery, write_and_gate
from tasks.experiments.recovery_trial import TrialSetup, run_trial
from tests.support import slurm_cluster
from tests.support.common import REPO, demo_plan_dict
from tests.support.logged_steps import assert_steps_lost_as_logged

PREEMPTOR = "poc-urgent"  # scripts/slurm-up: PriorityTier 10 over poc's 1, poc's GraceTime 5


@pytest.fixture
def slurm_env(slurm_jobs_env: dict[str, str]) -> dict[str, str]:
    return slurm_jobs_env


def notice_plan(tmp_path: Path, faults: list[Fault]) -> Plan:
    plan = load_plan(REPO / "plans" / "demo.yaml")
    command = list(plan.workload.command or [])
    command[command.index("--steps") + 1] = "6000"  # outlives every grace and requeue
    return plan.model_copy(
        update={
            "poc": "slurm-notice",
            "data_dir": str(tmp_path / "data"),
            "cluster": plan.cluster.model_copy(
                update={"kind": "slurm", "nodes": ["ckpt-node1"], "queue": "poc"}
            ),
            "workload": plan.workload.model_copy(update={"gpus": 1, "command": command}),
            "faults": faults,
            "repeats": 1,
        }
    )


def one_managed_trial(tmp_path: Path, fault: Fault, arm: str = "managed") -> pd.Series:
    """One trial of one arm, the managed one unless told (run_recovery runs both arms)."""
    plan = notice_plan(tmp_path, [fault])
    ctx = make_run_context(plan, REPO / "plans" / "demo.yaml")
    prepare_workload(plan, 60)  # as run_recovery's preflight does: the weights it reads
    setup = TrialSetup(plan, ctx, make_cluster(plan, ctx), EventRecorder(ctx), 60, 60)
    try:
        return pd.Series(run_trial(setup, fault, arm, 0))
    finally:
        setup.cluster.stop_all()
        setup.recorder.flush()


def copy_log(data: Path, row: pd.Series, arm: str) -> Path:
    return next(data.rglob(f"{row['trial_id']}-{arm}/workload.log"))


def _node_state(env: dict[str, str]) -> str:
    out = subprocess.run(
        ["sinfo", "-h", "-n", "ckpt-node1", "-o", "%T"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()[0]


@pytest.mark.slurm
@pytest.mark.criu
def test_preempt_and_drain_resume_the_managed_copy_from_its_notice_checkpoint(
    slurm_env, tmp_path: Path
) -> None:
    faults = [
        parse_fault(kind="preempt", preemptor_partition=PREEMPTOR, grace_s=5),
        parse_fault(kind="drain", grace_s=3),
    ]
    plan = notice_plan(tmp_path, faults)
    with open_run(plan, REPO / "plans" / "demo.yaml", "recovery") as ctx:
        run = run_recovery(plan, ctx, timeout_s=60, fault_step=60)
        trials = run.trials.set_index(["fault", "arm"])
        assert (trials["status"] == "ok").all(), trials["reason"].to_string()
        write_and_gate(run, plan, ctx)  # the notice columns fit the schema; every gate passes
    written = read_dataset(TRIALS, data_dir=plan.data_dir, poc=plan.poc)
    written = written[written["measure"] == "recovery"]
    assert set(written["notice_checkpoint"]) == {"finished", "none"}
    for kind, grace in (("preempt", 5), ("drain", 3)):
        managed, unmanaged = trials.loc[(kind, "managed")], trials.loc[(kind, "unmanaged")]
        # Dumped on the notice, inside the grace; back at exactly the step it held.
        assert managed["notice_checkpoint"] == "finished"
        assert 0 < managed["notice_checkpoint_s"] < grace
        assert managed["recoverable_point"] == "checkpoint"
        assert managed["steps_lost"] == 0 and managed["work_lost_s"] < 0.2
        # The unmanaged copy ran on to the kill; back from its own last checkpoint (every 50
        # steps), each step since lost: none where the kill fell just after one.
        assert unmanaged["notice_checkpoint"] == "none"
        assert unmanaged["recoverable_point"] == "app_checkpoint"
        assert_steps_lost_as_logged(
            copy_log(tmp_path, unmanaged, "unmanaged"),
            unmanaged["steps_lost"],
            from_app_checkpoint=True,
        )
        assert unmanaged["work_lost_s"] > 0
        for row in (managed, unmanaged):
            # Requeued: the same job id came back, after a measured wait in the queue.
            assert row["recovery_job_id"] == row["job_id"]
            assert row["queued_s"] > 0 and row["queued_s"] <= row["scheduling_s"] + 1e-6
    # The managed copy requeued itself once dumped: seen leaving well inside the grace.
    assert (trials.xs("managed", level="arm")["detection_s"] < 2).all()
    assert set(trials.loc["preempt"]["fault_outcome"]) <= {"PREEMPTED", "REQUEUED"}
    assert set(trials.loc["drain"]["fault_outcome"]) == {"REQUEUED"}
    parts = run.trials[["detection_s", "scheduling_s", "restore_s", "warmup_s"]].sum(axis=1)
    assert (abs(parts - run.trials["recovery_s"]) < 1e-6).all()
    # `fault_injected` is the notice as the job got it, on both arms.
    names = {(e.arm, e.event) for e in run.events}
    assert {("managed", "notice"), ("unmanaged", "notice")} <= names
    assert ("managed", "preemptor_cancelled") in names
    # The preemptor is gone and the node back in service.
    assert slurm_cluster.jobs_in_queue(slurm_env) == []
    assert _node_state(slurm_env) in {"idle", "mixed"}


@pytest.mark.slurm
@pytest.mark.criu
def test_a_notice_too_short_for_the_dump_is_a_missed_deadline(slurm_env, tmp_path: Path) -> None:
    # 1 ms between the drain's notice and its requeue: no CRIU dump finishes in that.
    row = one_managed_trial(tmp_path, parse_fault(kind="drain", grace_s=0.001))
    assert row["status"] == "ok", row.get("reason")
    assert row["notice_checkpoint"] == "missed"
    # Back from the last periodic checkpoint, the steps since lost, and counted.
    assert row["recoverable_point"] == "checkpoint"
    assert_steps_lost_as_logged(copy_log(tmp_path, row, "managed"), row["steps_lost"])
    assert row["work_lost_s"] > 0


@pytest.mark.slurm
@pytest.mark.criu
def test_a_warned_time_limit_on_both_arms(slurm_env, tmp_path: Path) -> None:
    # The limit cut to one minute (the copy has run ~3 s); the warning 50 s ahead of it is
    # due at ~10 s and lands at Slurm's next limit check. The two arms run side by side, each
    # its own job and run, because a limit takes 60-90 s to lapse (notes/slurm.md).
    fault = parse_fault(kind="time-limit", warn_s=50)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(one_managed_trial, tmp_path / "managed", fault)
        unmanaged = one_managed_trial(tmp_path / "unmanaged", fault, "unmanaged")
        managed = pending.result()
    for row in (managed, unmanaged):
        assert row["status"] == "ok", row.get("reason")
        assert row["recovery_job_id"] == row["job_id"] and row["queued_s"] > 0
    # Managed: dumped on the warning, requeued by the copy itself before the limit (never a
    # TIMEOUT), back at exactly the step its notice checkpoint held.
    assert managed["notice_checkpoint"] == "finished"
    assert managed["recoverable_point"] == "checkpoint" and managed["steps_lost"] == 0
    assert managed["fault_outcome"] == "REQUEUED"
    # Unmanaged: it heard the warning and ran on to the limit; Slurm ended it TIMEOUT, the
    # harness requeued it, and it came back from its own checkpoint with the steps since lost.
    assert unmanaged["notice_checkpoint"] == "none"
    assert unmanaged["fault_outcome"] == "TIMEOUT"
    assert unmanaged["recoverable_point"] == "app_checkpoint"
    assert_steps_lost_as_logged(
        copy_log(tmp_path, unmanaged, "unmanaged"),
        unmanaged["steps_lost"],
        from_app_checkpoint=True,
    )
    assert unmanaged["work_lost_s"] > managed["work_lost_s"]


@pytest.mark.slurm
def test_plan_check_refuses_a_preemptor_that_is_missing_or_would_hit_others(
    slurm_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm_env["SLURM_CONF"])
    plan = demo_plan_dict()
    plan["cluster"] = {"kind": "slurm", "nodes": ["ckpt-node1"], "queue": "poc"}
    plan["faults"] = [
        {"kind": "preempt", "preemptor_partition": "no-such-q", "grace_s": 5},
        {"kind": "preempt", "preemptor_partition": PREEMPTOR, "grace_s": 30},
    ]
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    # Someone else's job on the node, in the partition a preemptor would preempt.
    other = slurm_cluster.submit(
        "#!/bin/sh\nsleep 120\n", "--job-name=someone-else", "--partition=poc", env=slurm_env
    )
    try:
        slurm_cluster.wait_state(other, {"RUNNING"}, 30, env=slurm_env)
        with pytest.raises(PlanError) as bad:
            load_plan(path)
        _refused_at_the_fault(tmp_path, other)
    finally:
        subprocess.run(["scancel", other], env=slurm_env, check=False)
    text = str(bad.value)
    assert "faults.0.preemptor_partition: partition 'no-such-q' does not exist" in text
    assert "faults.1.grace_s: 30 s is longer than partition 'poc' gives" in text
    assert (
        f"faults.1.preemptor_partition: a preemptor in '{PREEMPTOR}' would preempt jobs that "
        f"are not the PoC's: {other} (someone-else, root, poc)"
    ) in text


def _refused_at_the_fault(tmp_path: Path, other: str) -> None:
    """At the fault itself: no preemptor is submitted while another job runs on the node."""
    cluster = SlurmCluster(["ckpt-node1"], "poc", tmp_path / "run", REPO)
    job = cluster.submit(
        "ckpt-node1",
        "managed",
        {
            "trial_id": "t",
            "arm": "managed",
            "node": "ckpt-node1",
            "mode": "run",
            "argv": ["sleep", "60"],
            "events": str(tmp_path / "ev.jsonl"),
            "log": "x",
        },
        name="refused",
        log=tmp_path / "refused.log",
        notice_signal="B:USR1@60",
    )
    try:
        cluster.wait_until(job, lambda s: s == "RUNNING", 30)
        recorder = EventRecorder(None, jsonl=tmp_path / "events.jsonl")
        fault = parse_fault(kind="preempt", preemptor_partition=PREEMPTOR, grace_s=5)
        with pytest.raises(BlastRadiusError, match=rf"would also preempt {other} \(someone-else"):
            inject_fault(cluster, job, fault, recorder, "t")
        assert [j.arm for j in cluster.tracked.values()] == ["managed"]  # no preemptor sent
    finally:
        cluster.stop_all()
