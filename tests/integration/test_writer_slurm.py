"""The writer recorder on a real Slurm install node: started through the install's path (a
job step pinned to the node) right after the before_install snapshot, it leaves that step
(it runs on with no job holding the node), tells a foreign writer from a PoC job, and is
stopped, and checked gone, after the recheck. Real fanotify, the real process-events
connector and the session's real single-node Slurm."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tasks.data.plan import load_plan
from tasks.data.runctx import open_run
from tasks.exit.exit_diff import exit_diff
from tasks.exit.snapshots import take_snapshots
from tasks.exit.writers.service import recorder_folder

# alone: fanotify sees every writer on the machine
pytestmark = pytest.mark.alone

NODE = "ckpt-node1"


def _wait(predicate: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _jobs(env: dict[str, str]) -> str:
    return subprocess.run(
        ["squeue", "-h", "-o", "%i %j %T"], env=env, capture_output=True, text=True
    ).stdout


@pytest.mark.slurm
def test_a_slurm_node_records_its_writers_outside_the_job_queue(
    slurm_harness, slurm_env: dict[str, str], write_plan, tmp_path: Path
) -> None:
    path = write_plan(
        {
            "cluster": {"kind": "slurm", "nodes": [NODE], "queue": "poc"},
            "faults": [{"kind": "scancel"}],
            "exit.watch": {"kinds": ["files"], "paths": ["/var/tmp"]},
            "exit.recheck_after_s": 1,
        }
    )
    plan = load_plan(path)
    tag = f"ckpt-writers-slurm-{os.getpid()}"
    go = tmp_path / "go"
    foreign, by_job = f"/var/tmp/{tag}-foreign", f"/var/tmp/{tag}-job"
    script = f"while [ ! -e {go} ]; do sleep 0.05; done; echo a > {foreign}"
    subprocess.run(["setsid", "-f", "sh", "-c", script], check=True, env={"PATH": "/usr/bin:/bin"})
    try:
        with open_run(plan, path, "snapshot") as ctx:
            take_snapshots(plan, ctx, "before_install", [NODE])
        folder = recorder_folder(plan, NODE)
        pid = int((folder / "recorder.pid").read_text())
        assert (folder / "recorder.how").read_text() == "its own session"
        assert (folder / "writers.json").exists()  # its marks placed before the step ended
        time.sleep(1)
        # The step that started it has ended; it runs on, and no job holds the node.
        assert Path(f"/proc/{pid}").exists(), (folder / "recorder.log").read_text()
        assert "ckpt-poc" not in _jobs(slurm_env), _jobs(slurm_env)
        go.touch()
        assert _wait(lambda: Path(foreign).exists())
        # A job of the PoC's (its name says so) writes on the node.
        job = [
            "srun", f"--nodelist={NODE}", "--partition=poc", f"--job-name=ckpt-poc-{plan.poc}-x",
            "sh", "-c", f"echo b > {by_job}",
        ]  # fmt: skip
        subprocess.run(job, env=slurm_env, check=True, timeout=120, capture_output=True)
        with open_run(plan, path, "snapshot") as ctx:
            take_snapshots(plan, ctx, "after_uninstall", [NODE])  # and the recheck: stopped
        assert _wait(lambda: not Path(f"/proc/{pid}").exists(), 10)
        assert not (folder / "recorder.pid").exists()
        with open_run(plan, path, "exit_diff") as ctx:
            diff = exit_diff(plan, ctx, "before_install", "after_uninstall")
    finally:
        go.touch()
        for p in (foreign, by_job):
            Path(p).unlink(missing_ok=True)
    items = {x["key"]: x for x in [*diff.leftovers, *diff.node_own]}
    assert items[foreign]["class"] == "node_own", items[foreign]["reason"]
    assert items[foreign]["reason"].startswith("written by /usr/bin/dash, pid ")
    assert items[by_job]["class"] == "poc", items[by_job]["reason"]
    assert "slurm-job:ckpt-poc" in items[by_job]["reason"]
