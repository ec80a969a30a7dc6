"""A workload that cannot start stops the run in seconds and says why.

The plan's `python` is the project's interpreter whoever starts the run (here: with a
`python` on PATH that is not it); the preflight sees the workload work before any trial,
or fails with the workload's own last log lines; and a recovery run whose first trials all
fail the same way before any fault stops instead of running every trial to its timeout.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tasks.engine.clusters.local.cluster import LocalCluster
from tasks.engine.clusters.local.preflight import preflight_local
from tasks.engine.interpreter import resolve_workload_argv, workload_env
from tasks.engine.preflight import WorkloadDoesNotStart, log_tail
from tasks.experiments.recovery import stop_reason
from tests.support.common import REPO

DEMO = REPO / "plans" / "demo.yaml"


def _impostor_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `python` first on PATH that is not the project's (as a worker's shell may have)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):
        fake = bin_dir / name
        fake.write_text("#!/bin/sh\necho 'impostor python' >&2\nexit 97\n")
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_plan_python_is_the_project_interpreter_not_the_one_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _impostor_on_path(tmp_path, monkeypatch)
    assert resolve_workload_argv(["python", "-m", "x"]) == [sys.executable, "-m", "x"]
    assert resolve_workload_argv(["python3", "-V"])[0] == sys.executable
    assert resolve_workload_argv(["/usr/bin/python3", "-V"]) == ["/usr/bin/python3", "-V"]
    assert resolve_workload_argv(["sh", "-c", "true"]) == ["sh", "-c", "true"]
    # The environment's bin folder comes first, once, so its console scripts are found too.
    path = workload_env()["PATH"].split(os.pathsep)
    assert path[0] == str(Path(sys.executable).parent) and path.count(path[0]) == 1

    # A real launch through the local cluster: the copy imports what only the project has.
    cluster = LocalCluster(["local-a"], tmp_path / "run", REPO)
    code = "import sys, sklearn; print(sys.executable, flush=True)"
    proc = cluster.start("local-a", "unmanaged", ["python", "-c", code])
    assert cluster.wait_gone(proc, timeout=60)
    assert proc.log.read_text().strip() == sys.executable, proc.log.read_text()


def _plan_with_command(tmp_path: Path, command: list[str]):
    plan = load_plan(DEMO)
    workload = plan.workload.model_copy(update={"command": command})
    return plan.model_copy(update={"data_dir": str(tmp_path / "data"), "workload": workload})


def test_preflight_fails_in_seconds_with_the_workloads_own_last_lines(tmp_path: Path) -> None:
    code = (
        "import sys; print('loading data', flush=True); "
        "sys.exit('examples need scikit-learn: No module named sklearn')"
    )
    plan = _plan_with_command(tmp_path, ["python", "-c", code])
    cluster = LocalCluster(list(plan.cluster.nodes), tmp_path / "run", REPO)
    t0 = time.monotonic()
    with pytest.raises(WorkloadDoesNotStart) as caught:
        preflight_local(plan, make_run_context(plan, DEMO), cluster, timeout_s=60)
    assert time.monotonic() - t0 < 10
    message = str(caught.value)
    assert "exited after" in message and "before its first progress line" in message
    assert "loading data" in message and "No module named sklearn" in message
    assert sys.executable in message  # which interpreter ran it
    assert cluster.tracked == {}


def test_log_tail_keeps_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert log_tail(log, 3) == "line 97\nline 98\nline 99"
    assert log_tail(tmp_path / "missing.log") == ""


def _row(fault: str, arm: str, status: str, reason: str = "", delivered: bool = False) -> dict:
    return {
        "fault": fault,
        "arm": arm,
        "status": status,
        "reason": reason,
        "fault_delivered": delivered,
        "log_tail": "Traceback …\nModuleNotFoundError: No module named 'sklearn'",
    }


def test_stop_reason_only_for_alike_failures_before_any_fault() -> None:
    same = [_row("sigkill", a, "failed", "the copy exited at step 59") for a in ("u", "m")]
    reason = stop_reason(same, "sigkill")
    assert reason and "the copy exited at step 59" in reason and "sklearn" in reason
    assert stop_reason(same[:1], "sigkill") is None  # one arm is not yet a pattern
    different = [same[0], _row("sigkill", "m", "failed", "no new progress after recovery")]
    assert stop_reason(different, "sigkill") is None
    after_fault = [_row("sigkill", a, "failed", "x", delivered=True) for a in ("u", "m")]
    assert stop_reason(after_fault, "sigkill") is None  # the fault itself is what failed
    one_ok = [same[0], _row("sigkill", "m", "ok")]
    assert stop_reason(one_ok, "sigkill") is None


def test_the_comparisons_prepare_once_into_prepared_and_a_failure_names_its_item(
    tmp_path: Path,
) -> None:
    from tasks.engine.prepared import (
        PrepareFailed,
        prepare_workload,
        workload_argv,
        workload_prepared,
    )

    demo = load_plan(DEMO)
    weights = ["python", "-m", "examples.weights", "{prepared}/w.safetensors", "--mb", "2"]
    workload = demo.workload.model_copy(update={"prepare": [weights]})
    plan = demo.model_copy(update={"data_dir": str(tmp_path / "data"), "workload": workload})

    first = prepare_workload(plan, 60, REPO)
    folder = workload_prepared(plan)
    assert first.folder == folder == (tmp_path / "data" / plan.poc / "prepared" / workload.name)
    written = (folder / "w.safetensors").stat()
    assert written.st_size > 2 << 20
    prepare_workload(plan, 60, REPO)  # up to date: kept, not written again
    assert (folder / "w.safetensors").stat().st_mtime_ns == written.st_mtime_ns
    argv = workload_argv(plan.model_copy(update={"workload": workload.model_copy(
        update={"command": ["python", "x.py", "{prepared}/w.safetensors", "{copy_dir}/c"]})}),
        tmp_path / "copy")  # fmt: skip
    assert argv == ["python", "x.py", f"{folder}/w.safetensors", f"{tmp_path}/copy/c"]

    failing = ["python", "-c", "import sys; sys.exit('no space left for the weights')"]
    broken = demo.model_copy(update={
        "data_dir": str(tmp_path / "data"),
        "workload": workload.model_copy(update={"prepare": [weights, failing]}),
    })  # fmt: skip
    with pytest.raises(PrepareFailed) as caught:
        prepare_workload(broken, 60, REPO)
    assert str(caught.value) == ("workloads.0.prepare.1: exited 1: no space left for the weights")
