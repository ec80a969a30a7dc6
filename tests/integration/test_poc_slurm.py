"""A PoC on real Slurm from plan to decision, through the Prefect deployment path.

`prefect deployment run 'poc/demo'` with plans/slurm-local.yaml, as a user starts it from
the UI (the run's environment given as its `env` job variable: the session's SLURM_CONF, its
CRIU, and a temp folder standing in for the node's /opt): the baseline, the snapshots of the
node, the install through Slurm with its drop-in in the cluster's plugstack.conf.d, the
compatibility sweep, recovery, overhead and cold start, every workload copy, reference run,
restore and fault a job on ckpt-node1; the short window sampled on the node; the weekly
report; the uninstall, the exit diff and the decision record.

Cut to what shows the path (each stage's measuring is tested on its own, locally): the plan's
one faster fault (scancel), the demo workload cut to 100 steps with its own checkpoints every
20, one sweep cycle over that workload alone, the snapshots watching what the install
touches. What overhead and cold start are on Slurm is checked here on the rows the PoC wrote:
every run its own job with the node to itself, the fingerprint read on the node, a native
and a restore job per cold start. About three minutes on two cores.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tasks.data.datasets import EXIT_VERDICTS, TRIALS
from tasks.data.fingerprint import FINGERPRINT_COLUMNS
from tasks.data.store import read_dataset
from tasks.experiments.overhead import pair_order
from tests.support import slurm_cluster
from tests.support.prefect_server import REPO, PrefectStack

# alone: its PoC's exit diff snapshots the whole node
pytestmark = [pytest.mark.alone, pytest.mark.prefect_server, pytest.mark.slurm, pytest.mark.criu]


STEPS, EVERY = 100, 20  # the workload's steps and its own checkpoints (the fault: step 52)


@pytest.fixture
def slurm_plan(tmp_path: Path, slurm_env: dict[str, str]) -> Path:
    plan = yaml.safe_load((REPO / "plans" / "slurm-local.yaml").read_text())
    plan["data_dir"] = str(tmp_path / "data")
    plan["baseline"]["source"]["path"] = str(REPO / plan["baseline"]["source"]["path"])
    plan["faults"] = [{"kind": "scancel"}]
    workload = plan["workload"]
    command = workload["command"]
    command[command.index("--steps") + 1] = str(STEPS)
    command[command.index("--checkpoint-every") + 1] = str(EVERY)
    workload["app_checkpoint"]["every_steps"] = EVERY
    workload["fidelity"]["files"][0]["numbers"]["regex"] = (
        rf"^step={STEPS} loss=(?P<final_loss>\S+)$"
    )
    plan["workloads"] = [workload]
    plan["compatibility"]["cycles"] = 1
    # The snapshots watch what the install touches (the prefix, the cluster's configuration
    # with its plugstack.conf.d) and the scheduler's view: the way out is then provably clean.
    etc = Path(slurm_env["SLURM_CONF"]).parent
    plan["exit"]["watch"] = {
        "kinds": ["files", "scheduler"],
        "paths": [str(tmp_path / "opt"), str(etc)],
        "names_only": [],
    }
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return path


def _slurm(argv: list[str], env: dict[str, str]) -> str:
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout


def _accounted(job_ids: list[str], env: dict[str, str]) -> list[dict[str, str]]:
    """Each job's allocation row in accounting (scontrol forgets an ended job)."""
    fields = ("JobID", "NodeList", "AllocCPUS")
    argv = ["sacct", "-X", "-n", "-P", "-o", ",".join(fields), "-j", ",".join(job_ids)]
    lines = _slurm(argv, env).strip().splitlines()
    return [dict(zip(fields, line.split("|"), strict=True)) for line in lines]


def test_a_slurm_poc_runs_from_plan_to_decision_through_the_deployment(
    prefect_stack: PrefectStack,
    slurm_env: dict[str, str],
    criu_binary: str,
    slurm_plan: Path,
    tmp_path: Path,
) -> None:
    dropins = Path(slurm_env["SLURM_CONF"]).parent / "plugstack.conf.d"
    (tmp_path / "opt" / "ckpt-poc").mkdir(parents=True)  # the node's /opt/ckpt-poc, there before
    before = sorted(dropins.iterdir())
    env = {
        "SLURM_CONF": slurm_env["SLURM_CONF"],
        "CKPT_POC_CRIU": criu_binary,
        "CKPT_POC_PREFIX_ROOT": str(tmp_path / "opt" / "ckpt-poc"),
    }
    run_id, proc = prefect_stack.run_deployment(
        "poc/demo", {"plan_path": str(slurm_plan), "short_window": True}, timeout=900, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + prefect_stack.log_tail()
    assert run_id and prefect_stack.flow_run(run_id)["state"]["type"] == "COMPLETED"
    base = tmp_path / "data" / "slurm-local"
    record = base / "record"
    assert (record / "decision-record.html").stat().st_size > 0
    for dataset in ("jobs", "snapshots", "compatibility", "trials", "samples", "reports"):
        assert list(base.glob(f"{dataset}/week=*/*.parquet")), f"no {dataset} parquet"

    # Every measure ran as Slurm jobs on the plan's node, none as a process of the harness.
    trials = read_dataset(TRIALS, data_dir=str(tmp_path / "data"), poc="slurm-local")
    measured = trials[trials["measure"] != "checkpoint"]
    assert set(measured["measure"]) == {"recovery", "overhead", "cold_start"}
    assert (measured["status"] == "ok").all(), measured[["trial_id", "arm", "reason"]]
    assert measured["job_id"].notna().all()
    jobs = pd.concat([measured["job_id"], measured["recovery_job_id"].dropna()])
    assert {row["NodeList"] for row in _accounted(sorted(set(jobs)), slurm_env)} == {"ckpt-node1"}
    # Overhead: A B, B A per variant, each run its own job with the node to itself.
    runs = measured[measured["measure"] == "overhead"]
    assert len(runs) == 2 * 3 * 2 and (runs["steps"] >= STEPS - 10).all()
    for variant, part in runs.groupby("variant"):
        order = part.sort_values("started_at")
        assert [tuple(o) for o in order[["pair", "arm"]].itertuples(index=False)] == [
            (pair, arm) for pair in range(3) for arm in pair_order(pair)
        ], variant
    cpus = _slurm(["sinfo", "-h", "-n", "ckpt-node1", "-o", "%c"], slurm_env).split()[0]
    assert {r["AllocCPUS"] for r in _accounted(sorted(set(runs["job_id"])), slurm_env)} == {cpus}
    # The rows carry the fingerprint each job read on the node.
    assert measured[list(FINGERPRINT_COLUMNS)].notna().all().all()
    # Cold start: a native job and a restore job per repeat; the page cache said; every
    # restore with its bytes; the clocks' events said.
    starts = measured[measured["measure"] == "cold_start"]
    assert starts["job_id"].nunique() == len(starts) == 2 * 3
    assert set(starts["page_cache"]) <= {"dropped", "warm"}
    restores = starts[starts["arm"] == "managed"]
    assert (restores["checkpoint_bytes"] > 0).all() and (restores["restore_s"] > 0).all()
    assert starts["includes"].str.contains("job").all()
    assert set(starts["clock"]) == {"launch→ready", "restore_start→ready"}
    sweep_specs = list(base.glob("runs/*/jobs/*-compat-*-sweep.json"))
    assert len(sweep_specs) == 1, sweep_specs

    # The way out: the drop-in is gone from the cluster's plugstack.conf.d, the prefix too,
    # and the exit verdict over what the snapshots watched is clean.
    assert sorted(dropins.iterdir()) == before
    assert not (tmp_path / "opt" / "ckpt-poc" / "slurm-local").exists()
    verdicts = read_dataset(EXIT_VERDICTS, data_dir=str(tmp_path / "data"), poc="slurm-local")
    assert set(verdicts["verdict"]) == {"clean"}, verdicts.to_string()
    progress = prefect_stack.artifacts(run_id, key="poc-progress")
    assert len(progress) == 1 and "stopped complete" in progress[0]["data"]
    result = json.loads((record / "decision.json").read_text())
    assert result["decision"] in ("adopt", "reject", "undecided")
    assert slurm_cluster.jobs_in_queue(slurm_env) == []
