"""The deployment path end to end: a real Prefect server, the `ckpt-poc` process work pool,
`prefect deploy --all` of prefect.yaml and a worker (all through scripts/prefect-up on a
free port with a private PREFECT_HOME), then `prefect deployment run ... --watch`.

About a minute on two cores: server start ~10-15 s, deploy ~5 s, each flow run ~5-15 s.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from tasks.data.plan import load_plan
from tests.support.prefect_server import REPO, VENV_BIN, PrefectStack, alive

pytestmark = pytest.mark.prefect_server


SACCT_HEADER = (
    "JobID|JobIDRaw|Cluster|Partition|User|Account|JobName|State|ExitCode|Submit|Start|End|"
    "Elapsed|ElapsedRaw|Timelimit|NNodes|NCPUS|AllocTRES|NodeList"
)
TRES = "cpu=8,gres/gpu=4,mem=64G,node=1"
SACCT_ROWS = [
    f"100|100|c1|gpu|alice|proj|train|FAILED|1:0|2026-11-01T10:00:00|2026-11-01T10:00:05|"
    f"2026-11-01T11:00:05|01:00:00|3600|1-00:00:00|1|8|{TRES}|n1",
    "101|101|c1|gpu|bob|proj|eval|COMPLETED|0:0|2026-11-01T12:00:00|2026-11-01T12:00:10|"
    "2026-11-01T12:30:10|00:30:00|1800|1-00:00:00|1|4|cpu=4,gres/gpu=1,mem=16G,node=1|n2",
    f"102|102|c1|gpu|alice|proj|train|TIMEOUT|0:0|2026-11-02T10:00:00|2026-11-02T10:00:05|"
    f"2026-11-03T10:00:05|1-00:00:00|86400|1-00:00:00|1|8|{TRES}|n1",
    # Not a timestamp: quarantined, so the quarantine dataset gets a file too.
    f"103|103|c1|gpu|carol|proj|broken|COMPLETED|0:0|not-a-date|2026-11-01T10:00:05|"
    f"2026-11-01T11:00:05|01:00:00|3600|1-00:00:00|1|8|{TRES}|n1",
]


@pytest.fixture
def stack(prefect_stack: PrefectStack) -> PrefectStack:
    return prefect_stack


@pytest.fixture
def tmp_plan(tmp_path: Path) -> Path:
    """plans/demo.yaml pointed at a small sacct -P dump and a tmp data_dir."""
    sacct = tmp_path / "sacct.psv"
    sacct.write_text("\n".join([SACCT_HEADER, *SACCT_ROWS]) + "\n")
    plan = yaml.safe_load((REPO / "plans" / "demo.yaml").read_text())
    plan["baseline"]["source"] = {"kind": "sacct-file", "path": str(sacct)}
    plan["data_dir"] = str(tmp_path / "data")
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return path


def _yaml_descriptions() -> dict[str, str]:
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    return {d["name"]: d["description"] for d in spec["deployments"]}


def test_deployments_match_prefect_yaml(stack: PrefectStack) -> None:
    descriptions = _yaml_descriptions()
    for flow, entrypoint in [
        ("plan_check", "flows/plan_check.py:plan_check"),
        ("baseline", "flows/baseline.py:baseline"),
        ("side_by_side", "flows/side_by_side.py:side_by_side"),
        ("recovery", "flows/recovery.py:recovery"),
        ("overhead", "flows/overhead.py:overhead"),
        ("cold_start", "flows/cold_start.py:cold_start"),
    ]:
        dep = stack.deployment(flow, flow)
        assert dep["entrypoint"] == entrypoint
        assert dep["work_pool_name"] == "ckpt-poc"
        assert dep["parameters"] == {"plan_path": "plans/demo.yaml"}
        assert dep["schedules"] == []
        # The deployments list shows what each stage does.
        assert dep["description"] == descriptions[flow] and len(dep["description"]) > 40
        # Flow runs start with the project's interpreter, whatever Python the worker has.
        venv_python = str(Path(VENV_BIN) / "python")
        assert dep["job_variables"]["command"] == f"{venv_python} -m prefect.engine"
        # The {{ $CKPT_POC_REPO }} placeholder was filled at deploy time with this clone.
        assert dep["pull_steps"] == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
        ]


def test_the_worker_has_a_plain_shells_environment(stack: PrefectStack) -> None:
    # What this test module proves holds only if the worker is started like a user's:
    # from a shell without the project's virtual environment on PATH.
    pid = stack.pid_files()["worker"]
    environ = dict(
        line.split("=", 1)
        for line in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        if "=" in line
    )
    assert VENV_BIN not in environ["PATH"].split(":")
    assert "VIRTUAL_ENV" not in environ


def _flow_run_name(stack: PrefectStack, run_id: str) -> str:
    return stack.flow_run(run_id)["name"]


def test_plan_check_runs_in_the_repo_checkout(stack: PrefectStack) -> None:
    # The default plan_path is relative: it resolves only if the run's cwd is the repo.
    run_id, proc = stack.run_deployment("plan_check/plan_check")
    assert proc.returncode == 0, proc.stdout + proc.stderr + stack.log_tail()
    assert run_id and stack.flow_run(run_id)["state"]["type"] == "COMPLETED"


def test_baseline_deployment_writes_datasets_and_summary(
    stack: PrefectStack, tmp_plan: Path
) -> None:
    run_id, proc = stack.run_deployment("baseline/baseline", {"plan_path": str(tmp_plan)})
    assert proc.returncode == 0, proc.stdout + proc.stderr + stack.log_tail()
    assert "Completed" in proc.stdout
    assert run_id is not None

    run = stack.flow_run(run_id)
    assert run["state"]["type"] == "COMPLETED"
    assert run["parameters"] == {"plan_path": str(tmp_plan)}

    # Datasets: <data_dir>/<poc>/<dataset>/week=YYYY-Www/<run_id>.parquet (run id = flow run).
    base = tmp_plan.parent / "data" / "demo"
    rows = {}
    for dataset in ("jobs", "exposure", "quarantine"):
        files = sorted(base.glob(f"{dataset}/week=*/{run_id}*.parquet"))
        assert files, f"no {dataset} parquet of run {run_id} under {base}"
        rows[dataset] = sum(pq.read_metadata(f).num_rows for f in files)
    assert rows["jobs"] == 3
    assert rows["quarantine"] == 1
    assert rows["exposure"] >= 1

    summary = stack.artifacts(run_id, key="baseline-summary")
    assert len(summary) == 1
    assert summary[0]["type"] == "markdown"
    assert summary[0]["data"].strip()
    exposure = stack.artifacts(run_id, key="baseline-exposure")
    assert len(exposure) == 1 and exposure[0]["type"] == "table"
    # They hang off the flow run itself (its Artifacts tab), not off a task run.
    assert summary[0]["task_run_id"] is None and exposure[0]["task_run_id"] is None
    assert _flow_run_name(stack, run_id).startswith("baseline · demo · plan.yaml · ")


@pytest.mark.criu
def test_recovery_deployment_writes_trials_and_its_report(
    stack: PrefectStack, tmp_plan: Path, criu_binary: str
) -> None:
    plan = yaml.safe_load(tmp_plan.read_text())
    plan["faults"] = [{"kind": "sigkill"}]  # one fault, the plan's 3 repeats on each arm
    tmp_plan.write_text(yaml.safe_dump(plan, sort_keys=False))
    run_id, proc = stack.run_deployment("recovery/recovery", {"plan_path": str(tmp_plan)})
    assert proc.returncode == 0, proc.stdout + proc.stderr + stack.log_tail()
    assert run_id and stack.flow_run(run_id)["state"]["type"] == "COMPLETED"
    files = sorted((tmp_plan.parent / "data" / "demo").glob(f"trials/week=*/{run_id}*.parquet"))
    trials = pd.concat([pq.read_table(f).to_pandas() for f in files])
    assert (trials["measure"] == "recovery").sum() == 6  # 3 repeats x 2 arms
    assert (trials["measure"] == "checkpoint").sum() > 0  # and every dump the managed copies took
    report = stack.artifacts(run_id, key="recovery-report")
    assert len(report) == 1 and "| sigkill | managed | 3 / 0 |" in report[0]["data"]
    # The report leads with the verdicts, each criterion with its threshold and unit.
    first = next(line for line in report[0]["data"].splitlines() if line.startswith("- "))
    assert first.startswith("- sigkill: recovery time median ") and " 30 s: " in first
    summary = stack.artifacts(run_id, key="recovery-summary")
    assert len(summary) == 1 and summary[0]["type"] == "table"
    assert _flow_run_name(stack, run_id).startswith("recovery · demo · plan.yaml · ")


@pytest.mark.criu
def test_cold_start_deployment_completes_with_its_plot_in_the_report(
    stack: PrefectStack, tmp_plan: Path, criu_binary: str
) -> None:
    run_id, proc = stack.run_deployment("cold_start/cold_start", {"plan_path": str(tmp_plan)})
    assert proc.returncode == 0, proc.stdout + proc.stderr + stack.log_tail()
    assert run_id and stack.flow_run(run_id)["state"]["type"] == "COMPLETED"
    report = stack.artifacts(run_id, key="cold-start-report")
    assert len(report) == 1
    text = report[0]["data"]
    assert "- cold-start speed-up (native launch / restore) median " in text
    assert "](data:image/png;base64,iVBOR" in text  # the plot itself, not a worker's path


@pytest.mark.criu
@pytest.mark.alone  # its PoC's exit diff snapshots the whole node
def test_poc_demo_runs_the_whole_poc_to_its_decision_record(
    stack: PrefectStack, tmp_plan: Path, criu_binary: str
) -> None:
    """`prefect deployment run 'poc/demo' --watch`: every stage as a subflow, the short
    window, the way out and the decision record, from a worker with a plain shell's
    environment. A few minutes: the demo's own stages, cut to what shows the deployment path
    (what each stage measures is tested on its own): one node to snapshot, one fault, the
    range over the demo workload alone, and that workload cut to 200 steps (the overhead
    stage's twelve runs were most of the time; recovery's fault comes at step 130)."""
    plan = yaml.safe_load(tmp_plan.read_text())
    plan["cluster"]["nodes"] = plan["cluster"]["nodes"][:1]
    plan["faults"] = [{"kind": "sigkill"}]
    command = plan["workload"]["command"]
    command[command.index("--steps") + 1] = "200"
    plan["workload"]["fidelity"]["files"][0]["numbers"]["regex"] = (
        r"^step=200 loss=(?P<final_loss>\S+)$"
    )
    plan["workloads"] = [plan["workload"]]
    tmp_plan.write_text(yaml.safe_dump(plan, sort_keys=False))
    run_id, proc = stack.run_deployment(
        "poc/demo", {"plan_path": str(tmp_plan), "short_window": True}, timeout=540
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + stack.log_tail()
    assert run_id and stack.flow_run(run_id)["state"]["type"] == "COMPLETED"
    assert stack.deployment("poc", "demo")["parameters"] == {
        "plan_path": "plans/demo.yaml",
        "short_window": True,
    }
    base = tmp_plan.parent / "data" / "demo"
    record = base / "record"
    assert (record / "decision-record.html").stat().st_size > 0
    assert (record / "decision-record.pdf").read_bytes()[:5] == b"%PDF-"
    for dataset in (
        "jobs",
        "exposure",
        "snapshots",
        "trials",
        "samples",
        "utilization",
        "reports",
        "exit_verdicts",  # every node's verdict; exit_diff has rows only for leftovers
    ):
        assert list(base.glob(f"{dataset}/week=*/*.parquet")), f"no {dataset} parquet"
    # Every stage ran as a subflow of this run, in order, and each left its artifacts.
    children = stack.api(
        "POST",
        "flow_runs/filter",
        {"flow_runs": {"parent_flow_run_id": {"any_": [run_id]}}, "sort": "START_TIME_ASC"},
    )
    names = [c["name"].split(" · ")[0] for c in children]
    for stage in (
        "baseline",
        "snapshot",
        "install",
        "recovery",
        "overhead",
        "cold start",
        "weekly report",
        "uninstall",
        "decision record",
    ):
        assert any(n.startswith(stage) for n in names), (stage, names)
    assert all(c["state"]["type"] == "COMPLETED" for c in children)
    by_name = {c["name"].split(" · ")[0]: c["id"] for c in children}
    record_run = next(i for n, i in by_name.items() if n.startswith("decision record"))
    artifact = stack.artifacts(record_run, key="decision-record")
    assert len(artifact) == 1 and artifact[0]["data"].strip()
    progress = stack.artifacts(run_id, key="poc-progress")
    assert len(progress) == 1 and "stopped complete" in progress[0]["data"]
    assert "short window" in progress[0]["data"]


def test_a_workload_that_cannot_start_fails_the_run_in_seconds_saying_why(
    stack: PrefectStack, tmp_plan: Path
) -> None:
    plan = yaml.safe_load(tmp_plan.read_text())
    plan["workload"]["command"] = [
        "python",
        "-c",
        "import sys; print('loading digits', flush=True); "
        "sys.exit('examples need scikit-learn (simulated)')",
    ]
    tmp_plan.write_text(yaml.safe_dump(plan, sort_keys=False))
    t0 = time.monotonic()
    run_id, proc = stack.run_deployment("recovery/recovery", {"plan_path": str(tmp_plan)})
    assert proc.returncode != 0 and run_id
    run = stack.wait_flow_run(run_id)
    assert time.monotonic() - t0 < 90
    assert run["state"]["type"] == "FAILED"
    message = run["state"]["message"]
    # Text, with the workload's own last lines, not an exception's repr.
    assert "preflight: the workload" in message and "examples need scikit-learn" in message
    assert "\nloading digits\n" in message and "\\n" not in message
    assert "WorkloadDoesNotStart(" not in message
    # The flow run's log says it the same way: lines, not a repr.
    logs = stack.api("POST", "logs/filter", {"logs": {"flow_run_id": {"any_": [run_id]}}})
    failed = [log["message"] for log in logs if "WorkloadDoesNotStart" in log["message"]]
    assert failed and all("WorkloadDoesNotStart(" not in m for m in failed), failed
    assert any("\nloading digits\n" in m for m in failed), failed
    report = stack.artifacts(run_id, key="recovery-report")
    assert len(report) == 1 and "examples need scikit-learn" in report[0]["data"]
    assert stack.artifacts(run_id, key="recovery-summary") == []


def test_window_deployments_carry_the_plans_schedules(stack: PrefectStack) -> None:
    """sample_window, utilization and weekly_report are scheduled from the plan's
    window.schedules (prefect-up's CKPT_POC_PLAN, here the demo plan: inactive, UTC)."""
    window = yaml.safe_load((REPO / "plans" / "demo.yaml").read_text())["window"]["schedules"]
    for flow in ("sample_window", "utilization", "weekly_report"):
        dep = stack.deployment(flow, flow)
        assert dep["entrypoint"] == f"flows/{flow}.py:{flow}"
        assert dep["parameters"] == {"plan_path": "plans/demo.yaml"}
        (schedule,) = dep["schedules"]
        assert schedule["schedule"]["cron"] == window[flow]
        assert schedule["schedule"]["timezone"] == window["timezone"]
        assert schedule["active"] is window["active"] is False
    # One sampler run at a time: the next span waits for the one running.
    sampler = stack.deployment("sample_window", "sample_window")
    limit = sampler.get("global_concurrency_limit") or {}
    assert sampler.get("concurrency_limit") == 1 or limit.get("limit") == 1, sampler
    assert (sampler.get("concurrency_options") or {}).get("collision_strategy") == "ENQUEUE"
    # The way out is tried during the PoC: uninstall is scheduled once, on exit.test_by.
    # The demo plan's test_by is relative (+21d): the date it resolves to, as deploy did.
    test_by = load_plan(REPO / "plans" / "demo.yaml", check_cluster=False).exit.test_by
    (uninstall,) = stack.deployment("uninstall", "uninstall")["schedules"]
    assert f"DTSTART:{test_by:%Y%m%d}T090000" in uninstall["schedule"]["rrule"]
    assert f"UNTIL={test_by:%Y%m%d}T235959" in uninstall["schedule"]["rrule"]
    for flow, entrypoint in [
        ("snapshot", "flows/snapshot.py:snapshot"),
        ("install", "flows/install.py:install"),
        ("opt_in", "flows/install.py:opt_in"),
        ("exit_diff", "flows/exit_diff.py:exit_diff"),
        ("record", "flows/record.py:record"),
        ("poc", "flows/poc.py:poc"),
    ]:
        assert stack.deployment(flow, flow)["entrypoint"] == entrypoint
    demo = stack.deployment("poc", "demo")
    assert (demo["entrypoint"], demo["parameters"]) == (
        "flows/poc.py:poc",
        {"plan_path": "plans/demo.yaml", "short_window": True},
    )
    # A flow run that stops sending heartbeats is crashed by an automation.
    automations = stack.api("POST", "automations/filter", {})
    (watch,) = [a for a in automations if a["name"].startswith("ckpt-poc: crash flow runs")]
    assert watch["trigger"]["posture"] == "Proactive"
    assert watch["actions"][0]["type"] == "change-flow-run-state"


def test_a_scheduled_sampler_run_completes_and_writes_samples(
    stack: PrefectStack, tmp_plan: Path
) -> None:
    """A schedule on the sampler's deployment (Prefect's scheduler makes the run, the worker
    runs it): the span is sampled, written and committed under the run's id."""
    plan = yaml.safe_load(tmp_plan.read_text())
    plan["window"].update({"span_s": 3, "interval_s": 1})
    tmp_plan.write_text(yaml.safe_dump(plan, sort_keys=False))
    dep = stack.deployment("sample_window", "sample_window")
    # Far enough ahead that the scheduler (every 5 s here) makes the run before it is due.
    due = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=20)
    created = stack.api(
        "POST",
        f"deployments/{dep['id']}/schedules",
        [
            {
                "schedule": {"interval": 3600, "anchor_date": due.isoformat(), "timezone": "UTC"},
                "active": True,
                "parameters": {"plan_path": str(tmp_plan)},
            }
        ],
    )
    try:
        deadline = time.monotonic() + 150
        run = None
        while time.monotonic() < deadline and run is None:
            runs = stack.api(
                "POST",
                "flow_runs/filter",
                {
                    "flow_runs": {
                        "deployment_id": {"any_": [dep["id"]]},
                        "state": {"type": {"any_": ["COMPLETED", "FAILED", "CRASHED"]}},
                    }
                },
            )
            run = next((r for r in runs if r["auto_scheduled"]), None)
            time.sleep(1)
        assert run is not None, "no scheduled run finished\n" + stack.log_tail()
        assert run["state"]["type"] == "COMPLETED", stack.log_tail()
        assert run["parameters"]["plan_path"] == str(tmp_plan)
    finally:
        for schedule in created:
            stack.api("DELETE", f"deployments/{dep['id']}/schedules/{schedule['id']}")
    files = sorted((tmp_plan.parent / "data" / "demo" / "samples").glob(f"week=*/{run['id']}*"))
    samples = pd.concat([pq.read_table(f).to_pandas() for f in files])
    assert len(samples) >= 2 * 2 * 2  # 2 nodes x host cpu and memory x at least 2 reads
    assert set(samples["device"]) == {"cpu"}
    commits = tmp_plan.parent / "data" / "demo" / "_commits" / f"{run['id']}.json"
    assert commits.exists()


def test_prefect_up_again_keeps_processes_and_redeploys_cleanly(stack: PrefectStack) -> None:
    before = stack.pid_files()
    stack.up()
    assert stack.pid_files() == before
    assert all(alive(pid) for pid in before.values())
    deploy_log = (stack.dir / "log" / "deploy.log").read_text()
    # This call's deploy updated both deployments, without (schedule) warnings.
    for name in ("plan_check/plan_check", "baseline/baseline"):
        assert f"Deployment '{name}' successfully" in deploy_log
    assert "Warning" not in deploy_log
