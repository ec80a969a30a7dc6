"""A PoC on real Slurm from plan to decision, through the Prefect deployment path.

`prefect deployment run 'poc/demo'` with plans/slurm-local.yaml, as a user starts it from
the UI (the run's environment given as its `env` job variable: the session's SLURM_CONF, its
CRIU, and a temp folder standing in for the node's /opt): the baseline, the snapshots of the
node, the install through Slurm with its drop-in in the cluster's plugstack.conf.d, the
compatibility sweep, recovery, overhead and cold start, every workload copy, reference run,
restore and fault a job on ckpt-node1; the short window sampled on the node; the weekly
report; the uninstall, the exit diff and the decision record.

Cut to what shows the path (each stage's measuring is tested on its own): the plan's one
faster fault (scancel), the demo workload cut to 200 steps, its sweep over that workload
alone. About four minutes on two cores.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from prefect_server import REPO, PrefectStack

from tasks.data.datasets import TRIALS
from tasks.data.store import read_dataset
from tests import slurm_cluster

pytestmark = [pytest.mark.prefect_server, pytest.mark.slurm, pytest.mark.criu]


@pytest.fixture
def slurm_plan(tmp_path: Path) -> Path:
    plan = yaml.safe_load((REPO / "plans" / "slurm-local.yaml").read_text())
    plan["data_dir"] = str(tmp_path / "data")
    plan["baseline"]["source"]["path"] = str(REPO / plan["baseline"]["source"]["path"])
    plan["faults"] = [{"kind": "scancel"}]
    command = plan["workload"]["command"]
    command[command.index("--steps") + 1] = "200"
    plan["workload"]["fidelity"]["files"][0]["numbers"]["regex"] = (
        r"^step=200 loss=(?P<final_loss>\S+)$"
    )
    plan["workloads"] = [plan["workload"]]
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return path


def _accounted_nodes(job_ids: list[str], env: dict[str, str]) -> set[str]:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "NodeList", "-j", ",".join(job_ids)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line.strip() for line in out.splitlines() if line.strip()}


def test_a_slurm_poc_runs_from_plan_to_decision_through_the_deployment(
    prefect_stack: PrefectStack,
    slurm_env: dict[str, str],
    criu_binary: str,
    slurm_plan: Path,
    tmp_path: Path,
) -> None:
    dropins = Path(slurm_env["SLURM_CONF"]).parent / "plugstack.conf.d"
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
    assert _accounted_nodes(sorted(set(jobs)), slurm_env) == {"ckpt-node1"}
    sweep_specs = list(base.glob("runs/*/jobs/*-compat-*-sweep.json"))
    assert len(sweep_specs) == 1, sweep_specs

    # The way out: the drop-in is gone from the cluster's plugstack.conf.d, the prefix too;
    # the decision record has the exit verdict and a decision.
    assert sorted(dropins.iterdir()) == before
    assert not (tmp_path / "opt" / "ckpt-poc" / "slurm-local").exists()
    progress = prefect_stack.artifacts(run_id, key="poc-progress")
    assert len(progress) == 1 and "stopped complete" in progress[0]["data"]
    result = json.loads((record / "decision.json").read_text())
    assert result["decision"] in ("adopt", "reject", "undecided")
    assert slurm_cluster.jobs_in_queue(slurm_env) == []
