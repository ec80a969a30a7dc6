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

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

from tasks.data.datasets import TRIALS
from tasks.data.plan import Fault, Plan, load_plan, parse_fault
from tasks.data.runctx import make_run_context, open_run
from tasks.data.store import read_dataset
from tasks.engine.clock import Event, EventRecorder
from tasks.engine.prepared import prepare_workload
from tasks.experiments.checkpoints import checkpoint_rows
from tasks.experiments.recovery import RecoveryRun, make_cluster, run_recovery, write_and_gate
from tasks.experiments.recovery_trial import TrialSetup, run_trial
from tests.support import slurm_cluster
from tests.support.common import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.criu]


@pytest.fixture
def slurm_env(slurm_jobs_env: dict[str, str]) -> dict[str, str]:
    return slurm_jobs_env


def slurm_plan(tmp_path: Path, faults: list[Fault], repeats: int) -> Plan:
    plan = load_plan(REPO / "plans" / "demo.yaml")
    return plan.model_copy(
        update={
            "poc": "slurm-recovery",
            "data_dir": str(tmp_path / "data"),
            "cluster": plan.cluster.model_copy(
                update={"kind": "slurm", "nodes": ["ckpt-node1"], "queue": "poc"}
            ),
            "workload": plan.workload.model_copy(update={"gpus": 1}),
            "faults": faults,
            "repeats": repeats,
        }
    )


def _recover(plan: Plan, fault: Fault) -> tuple[RecoveryRun, pd.DataFrame]:
    """The plan's trials of one fault as one recovery run in a data folder of its own,
    written and gated; the run and the trials it wrote."""
    plan = plan.model_copy(
        update={"faults": [fault], "data_dir": str(Path(plan.data_dir) / fault.kind)}
    )
    with open_run(plan, REPO / "plans" / "demo.yaml", "recovery") as ctx:
        run = run_recovery(plan, ctx, timeout_s=60)
        trials = run.trials
        assert (trials["status"] == "ok").all(), trials[["trial_id", "arm", "reason"]].to_string()
        write_and_gate(run, plan, ctx)  # every comparability gate passes
    return run, read_dataset(TRIALS, data_dir=plan.data_dir, poc=plan.poc)


def test_slurm_faults_recover_through_new_linked_jobs(slurm_env, tmp_path: Path) -> None:
    """scancel and kill-step run side by side, each its own run (a copy holds one of the
    node's two GPUs, its recovery job starts once it is gone); node-down after them, alone
    (downing the node ends every job on it)."""
    plan = slurm_plan(
        tmp_path,
        [parse_fault(kind="scancel"), parse_fault(kind="node-down"), parse_fault(kind="kill-step")],
        3,
    )
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_recover, plan, plan.faults[0])
        done = [_recover(plan, plan.faults[2]), pending.result()]
    done.append(_recover(plan, plan.faults[1]))
    trials = pd.concat([run.trials for run, _ in done], ignore_index=True)
    events = [e for run, _ in done for e in run.events]
    written = pd.concat([w for _, w in done], ignore_index=True)
    assert (written["measure"] == "recovery").sum() == 3 * 3 * 2
    # The dumps the in-job wrapper took are checkpoint rows too.
    assert (written["measure"] == "checkpoint").sum() > 0

    # Each recovery is a new job, linked to the interrupted one; Slurm says how each ended.
    assert (trials["recovery_job_id"].astype(int) > trials["job_id"].astype(int)).all()
    outcome = trials.groupby("fault")["fault_outcome"].agg(set).to_dict()
    assert outcome["scancel"] == {"CANCELLED"}
    assert outcome["node-down"] == {"NODE_FAIL"}
    assert outcome["kill-step"] <= {"FAILED", "CANCELLED"}
    # The managed copy came back from its CRIU checkpoint, the unmanaged from its own.
    managed = trials[trials["arm"] == "managed"]
    assert set(managed["recoverable_point"]) == {"checkpoint"}
    assert set(trials[trials["arm"] == "unmanaged"]["recoverable_point"]) == {"app_checkpoint"}
    # GPUs from the allocation (the cluster's fake gres), not the plan.
    assert set(trials["gpus_from"]) == {"allocation"} and set(trials["gpus"]) == {1}
    # Every trial's events are complete, the restore's from inside the job included.
    names = {(e.trial_id, e.arm, e.event) for e in events}
    for t, a in zip(trials["trial_id"], trials["arm"], strict=True):
        for event in ("fault_injected", "detected", "started", "restored", "serving_again"):
            assert (t, a, event) in names, (t, a, event)
        assert (t, a, "recovery_submitted") in names and (t, a, "job_started") in names
    parts = trials[["detection_s", "scheduling_s", "restore_s", "warmup_s"]].sum(axis=1)
    assert (abs(parts - trials["recovery_s"]) < 1e-6).all()
    # Accounting links each recovery job to the job it recovers.
    for row in trials.itertuples():
        comment = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", row.recovery_job_id, "-o", "Comment"],
            env=slurm_env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert comment == f"ckpt-poc {row.arm} recovers {row.job_id}"


def _time_limit_trial(plan: Plan, arm: str, folder: Path) -> tuple[dict, list[Event]]:
    """One arm's time-limit trial as a run of its own (run_recovery runs the arms in turn):
    its row and its events."""
    plan = plan.model_copy(update={"data_dir": str(folder / "data")})
    ctx = make_run_context(plan, REPO / "plans" / "demo.yaml")
    prepare_workload(plan, 60)  # as run_recovery's preflight does: the weights it reads
    setup = TrialSetup(plan, ctx, make_cluster(plan, ctx), EventRecorder(ctx), 50, 60)
    try:
        row = run_trial(setup, plan.faults[0], arm, 0)
    finally:
        setup.cluster.stop_all()
        setup.recorder.flush()
    return row, setup.recorder.events(arm=arm)


def test_a_time_limit_reached_recovers(slurm_env, tmp_path: Path) -> None:
    """Slurm itself delivers this fault, at its next limit check after the (cut) limit
    lapses: about 90 s per trial, so one repeat, the two arms side by side (each copy holds
    one of the node's two GPUs)."""
    plan = slurm_plan(tmp_path, [parse_fault(kind="time-limit")], 1)
    command = list(plan.workload.command or [])
    command[command.index("--steps") + 1] = "6000"  # outlives the one-minute limit
    plan = plan.model_copy(
        update={"workload": plan.workload.model_copy(update={"command": command})}
    )
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_time_limit_trial, plan, "managed", tmp_path / "managed")
        unmanaged = _time_limit_trial(plan, "unmanaged", tmp_path / "unmanaged")
        managed = pending.result()
    trials = {"unmanaged": unmanaged[0], "managed": managed[0]}
    events = {"unmanaged": unmanaged[1], "managed": managed[1]}
    for arm, row in trials.items():
        assert row["status"] == "ok", (arm, row.get("reason"))
        assert row["fault_outcome"] == "TIMEOUT", (arm, row["fault_outcome"])
        assert row["work_lost_s"] >= 0
        # `fault_injected` is when Slurm's SIGTERM landed, after the limit lapsed.
        lapsed = next(e for e in events[arm] if e.event == "time_limit_lapsed")
        fault = next(e for e in events[arm] if e.event == "fault_injected")
        assert fault.detail["as_observed_by"] == "signalled"
        assert fault.t_mono_ns >= lapsed.t_mono_ns
    # Slurm picks the moment, not the test: each arm loses at most what its own recoverable
    # point's period allows (which of the two loses less that one time is chance).
    assert plan.workload.app_checkpoint is not None
    assert trials["unmanaged"]["steps_lost"] <= plan.workload.app_checkpoint.every_steps
    dumps = checkpoint_rows(events["managed"], plan, plan.cluster.nodes[0])
    dumps = dumps[dumps["status"] == "ok"]
    assert len(dumps) > 0
    period_s = plan.checkpointer.interval_s + 2 * float(dumps["dump_s"].max())
    assert trials["managed"]["work_lost_s"] <= period_s + 0.5, (
        trials["managed"]["work_lost_s"],
        period_s,
    )


def test_a_node_that_never_comes_back_is_a_failed_trial(slurm_env, tmp_path: Path) -> None:
    plan = slurm_plan(tmp_path, [parse_fault(kind="node-down", down_s=None)], 1)
    trials = run_recovery(
        plan, make_run_context(plan, REPO / "plans" / "demo.yaml"), timeout_s=12
    ).trials
    assert list(trials["status"]) == ["failed", "failed"]
    assert trials["reason"].str.contains("the node never came back").all(), trials["reason"]
    assert set(trials["fault_outcome"]) == {"NODE_FAIL"}
    # The run returned the node it took down to service, and left no job behind.
    slurm_cluster.wait_node_idle(slurm_env, timeout=30)
    queue = subprocess.run(
        ["squeue", "-h"], env=slurm_env, capture_output=True, text=True, check=True
    ).stdout
    assert queue.strip() == ""
