"""The embedded default engine with real CRIU: real workloads dumped, killed and restored.

Every test runs the example workloads as real processes in their own PID namespaces on the
local cluster's slots, checkpoints them with the CRIU that scripts/install-criu provides,
and ends with nothing left running.
"""

from __future__ import annotations

import json
import math
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tasks.data.errors import BlastRadiusError
from tasks.data.plan import ReadyProbe, load_plan
from tasks.data.runctx import make_run_context
from tasks.engine.checkpointers.criu import CriuCheckpointer, CriuError
from tasks.engine.checkpointers.none import NoCheckpointer
from tasks.engine.checkpointers.periodic import PeriodicCheckpoints
from tasks.engine.clock import EventRecorder, read_journal
from tasks.engine.clusters.local.cluster import LocalCluster
from tasks.engine.clusters.process import WorkloadProcess
from tasks.engine.paths import run_folder
from tasks.engine.probes import LogProgressProbe, last_step_before
from tasks.engine.ready import wait_ready
from tasks.engine.side_by_side import run_side_by_side
from tests.support.common import REPO

pytestmark = pytest.mark.criu

STEP = re.compile(r"^step=(\d+) loss=(\S+)$", re.M)
TRAIN = [sys.executable, "-m", "examples.train_digits", "--seed", "3"]


@pytest.fixture
def engine(tmp_path: Path, criu_binary: str):
    plan = load_plan(REPO / "plans" / "demo.yaml").model_copy(
        update={"data_dir": str(tmp_path / "data")}
    )
    ctx = make_run_context(plan, REPO / "plans" / "demo.yaml")
    recorder = EventRecorder(ctx)
    cluster = LocalCluster(nodes=list(plan.cluster.nodes), run_dir=tmp_path / "run", workdir=REPO)
    yield cluster, recorder, criu_binary, tmp_path
    left = cluster.stop_all()
    assert left == [], f"processes left running: {left}"
    cluster.close()  # its reaper, whose command line names the run folder, ends too
    assert str(tmp_path) not in _ps("pid,args"), "a process of this test outlived it"


def _ps(columns: str) -> str:
    """Every process, command lines in full (-ww: without a terminal ps cuts at 80)."""
    return subprocess.run(
        ["ps", "-e", "-ww", "-o", columns], capture_output=True, text=True, check=True
    ).stdout


def _losses(text: str) -> dict[int, str]:
    return {int(s): loss for s, loss in STEP.findall(text)}


def test_training_restored_resumes_at_the_checkpoint_step_with_identical_losses(engine) -> None:
    cluster, recorder, criu, tmp = engine
    args = ["--steps", "250", "--step-sleep", "0.02"]
    reference = subprocess.run(
        [*TRAIN, *args], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    want = _losses(reference)
    assert len(want) == 250

    proc = cluster.start("local-a", "managed", [*TRAIN, *args])
    probe = LogProgressProbe(proc.log, r"^step=(\d+) ", recorder, "t1", "managed").start()
    ckpt = CriuCheckpointer(tmp / "ckpt", keep=2, recorder=recorder, trial_id="t1", binary=criu)
    periodic = PeriodicCheckpoints(ckpt, proc, interval_s=1.0).start()
    try:
        assert probe.wait_for(lambda s: s.step >= 5, timeout=30)
        deadline = time.monotonic() + 30
        while len(ckpt.complete()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        periodic.stop()
    assert len(ckpt.complete()) == 2, periodic.errors  # keep=2 pruned the older ones
    last = ckpt.last_complete()
    held = last_step_before(proc.log, last.held_log_bytes, r"^step=(\d+) ")
    assert held is not None and 0 < held < 250

    recorder.record("t1", "managed", "fault_injected", signal="SIGKILL")
    cluster.kill(proc)
    assert cluster.wait_gone(proc)
    killed_at = proc.log.stat().st_size
    restored = ckpt.restore(cluster, "local-a")
    deadline = time.monotonic() + 60
    while "done step=250" not in proc.log.read_text()[killed_at:]:
        assert time.monotonic() < deadline, proc.log.read_text()[-2000:]
        time.sleep(0.05)
    probe.stop()
    after = _losses(proc.log.read_text()[killed_at:])
    # It resumed at exactly the step the checkpoint held, and computes what an
    # uninterrupted run computes, bit for bit.
    assert min(after) == held + 1
    assert after == {s: want[s] for s in range(held + 1, 251)}
    assert cluster.wait_gone(restored, timeout=30)
    end = recorder.events(event="checkpoint_end")[-1].detail
    assert end["image_bytes"] > 1_000_000 and end["frozen_us"] > 0 and end["dump_s"] > 0
    files = recorder.flush()
    assert files and all(f.exists() for f in files)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def test_restored_server_is_ready_and_answers_the_same(engine) -> None:
    cluster, recorder, criu, tmp = engine
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = cluster.start(
        "local-b",
        "managed",
        [sys.executable, "-m", "examples.serve_digits", "--port", str(port), "--init-steps", "100"],
    )
    ready_url = ReadyProbe(url=f"{base}/ready")
    assert wait_ready(ready_url, recorder, "t2", "managed", timeout=60, alive=proc.alive).ready
    before = [_get(f"{base}/predict?i={i}") for i in (0, 7, 42)]
    ckpt = CriuCheckpointer(tmp / "ckpt", keep=1, recorder=recorder, trial_id="t2", binary=criu)
    ckpt.dump(proc)
    cluster.kill(proc)
    assert cluster.wait_gone(proc)
    restored = ckpt.restore(cluster, "local-b")
    assert wait_ready(ready_url, recorder, "t2", "managed", timeout=30, alive=restored.alive).ready
    assert [_get(f"{base}/predict?i={i}") for i in (0, 7, 42)] == before
    ready = recorder.events(event="ready")
    restored_ev = recorder.events(event="restored")[0]
    assert ready[-1].t_mono_ns > restored_ev.t_mono_ns


def test_missing_partial_and_corrupt_checkpoints(engine) -> None:
    cluster, recorder, criu, tmp = engine
    ckpt = CriuCheckpointer(tmp / "ckpt", keep=3, recorder=recorder, trial_id="t3", binary=criu)
    with pytest.raises(CriuError, match="no complete checkpoint"):
        ckpt.restore(cluster, "local-a")
    proc = cluster.start("local-a", "managed", [*TRAIN, "--steps", "100000"])
    LogProgressProbe(proc.log, r"^step=(\d+) ", recorder, "t3", "managed").start().wait_for(
        lambda s: s.step >= 3, timeout=30
    )
    good = ckpt.dump(proc)
    # A dump cut short (no COMPLETE record) is never chosen.
    partial = tmp / "ckpt" / "ckpt-99999"
    partial.mkdir()
    for img in list(good.path.glob("*.img"))[:3]:
        (partial / img.name).write_bytes(img.read_bytes()[:10])
    assert ckpt.last_complete() == good
    # A complete but corrupt one fails with CRIU's own words, and nothing is left running.
    cluster.kill(proc)
    assert cluster.wait_gone(proc)
    for core in good.path.glob("core-*.img"):
        core.write_bytes(b"\x00" * 7)
    with pytest.raises(CriuError, match="criu restore of checkpoint") as info:
        ckpt.restore(cluster, "local-a")
    assert "Error" in str(info.value)
    assert recorder.events(event="restore_failed")


def test_a_restore_that_hangs_is_killed_with_its_children(engine) -> None:
    cluster, recorder, criu, tmp = engine
    ckpt = CriuCheckpointer(
        tmp / "ckpt", keep=1, recorder=recorder, trial_id="t6", binary=criu, timeout_s=8
    )
    proc = cluster.start("local-a", "managed", [*TRAIN, "--steps", "100000"])
    LogProgressProbe(proc.log, r"^step=(\d+) ", recorder, "t6", "managed").start().wait_for(
        lambda s: s.step >= 3, timeout=30
    )
    good = ckpt.dump(proc)
    cluster.kill(proc)
    assert cluster.wait_gone(proc)
    # Truncated page images make CRIU 4.2's restorer spin instead of failing.
    for img in good.path.glob("pages-*.img"):
        img.write_bytes(img.read_bytes()[: img.stat().st_size // 3])
    with pytest.raises(CriuError, match="did not finish within 8 s"):
        ckpt.restore(cluster, "local-a")

    def restorers() -> list[str]:
        ps = _ps("stat,args").splitlines()
        return [line for line in ps if str(good.path) in line and "Z" not in line[:2]]

    deadline = time.monotonic() + 10  # the killed restorer takes a moment to be gone
    while (running := restorers()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running == []


def test_interval_shorter_than_a_dump_records_skips_instead_of_piling_up(engine) -> None:
    cluster, recorder, criu, tmp = engine
    proc = cluster.start("local-a", "managed", [*TRAIN, "--steps", "100000", "--state-mb", "256"])
    LogProgressProbe(proc.log, r"^step=(\d+) ", recorder, "t4", "managed").start().wait_for(
        lambda s: s.step >= 2, timeout=60
    )
    ckpt = CriuCheckpointer(tmp / "ckpt", keep=1, recorder=recorder, trial_id="t4", binary=criu)
    periodic = PeriodicCheckpoints(ckpt, proc, interval_s=0.05).start()
    # Until two dumps ended and a tick was skipped meanwhile (observed, not a fixed 3 s).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
        len(recorder.events(event="checkpoint_end")) >= 2
        and recorder.events(event="checkpoint_skipped")
    ):
        time.sleep(0.05)
    periodic.stop()
    starts = recorder.events(event="checkpoint_start")
    ends = recorder.events(event="checkpoint_end")
    assert len(ends) >= 2 and len(starts) == len(ends) + len(periodic.errors)
    for prev_end, nxt in zip(ends, starts[1:], strict=False):
        assert nxt.t_mono_ns >= prev_end.t_mono_ns, "a dump started before the last ended"
    skipped = recorder.events(event="checkpoint_skipped")
    assert skipped and sum(e.detail["ticks"] for e in skipped) > 0


def test_unmanaged_restarts_from_the_app_checkpoint(engine) -> None:
    cluster, recorder, _, tmp = engine
    app_dir = tmp / "app-ckpt"
    argv = [
        *TRAIN,
        "--steps",
        "120",
        "--step-sleep",
        "0.01",
        "--checkpoint-every",
        "20",
        "--checkpoint-dir",
        str(app_dir),
    ]
    arm = NoCheckpointer(recorder, "t5", app_dir / "ckpt.npz", ["--resume"])
    assert arm.recoverable_point().kind == "start"
    proc = cluster.start("local-a", "unmanaged", argv)
    probe = LogProgressProbe(proc.log, r"^step=(\d+) ", recorder, "t5", "unmanaged").start()
    assert probe.wait_for(lambda s: s.step >= 50, timeout=30)
    cluster.kill(proc, signal.SIGKILL)
    assert cluster.wait_gone(proc)
    assert arm.recoverable_point().kind == "app_checkpoint"
    killed_at = proc.log.stat().st_size
    again = arm.restart(cluster, "local-a", argv)
    assert cluster.wait_gone(again, timeout=60)
    probe.stop()
    text = proc.log.read_text()[killed_at:]
    resumed = int(re.search(r"resumed step=(\d+)", text).group(1))
    assert resumed % 20 == 0 and min(_losses(text)) == resumed + 1


def test_engine_refuses_slots_and_pids_it_does_not_own(engine) -> None:
    cluster, *_ = engine
    with pytest.raises(BlastRadiusError):
        cluster.start("prod-node-7", "managed", ["true"])

    with pytest.raises(BlastRadiusError):
        cluster.kill(WorkloadProcess("local-a", "managed", 1, Path("/dev/null")))


def test_a_checkpoint_thread_that_raises_is_raised_by_stop(engine) -> None:
    cluster, recorder, criu, tmp = engine
    proc = cluster.start("local-a", "managed", [*TRAIN, "--steps", "100000"])
    ckpt = CriuCheckpointer(tmp / "ckpt", keep=1, recorder=recorder, trial_id="t7", binary=criu)
    # An infinite interval makes the schedule's wait raise OverflowError in the thread.
    periodic = PeriodicCheckpoints(ckpt, proc, interval_s=math.inf).start()
    deadline = time.monotonic() + 10
    while periodic.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(OverflowError):
        periodic.stop()
    periodic.stop()  # raised once: a caller's cleanup that stops it again still runs
    failed = recorder.events(event="thread_failed")
    assert failed and "OverflowError" in failed[0].detail["error"]


def _failing_side_by_side(
    write_plan, overrides: dict, criu_binary: str, monkeypatch, interval_s: float | None = None
) -> tuple:
    """Run the engine on the demo plan with ``overrides`` (and, past the plan's validation,
    ``interval_s``); (exception, seconds, run folder)."""
    monkeypatch.setenv("CKPT_POC_CRIU", criu_binary)
    path = write_plan(overrides)
    plan = load_plan(path)
    if interval_s is not None:  # a value the plan now refuses: the thread must still fail
        checkpointer = plan.checkpointer.model_copy(update={"interval_s": interval_s})
        plan = plan.model_copy(update={"checkpointer": checkpointer})
    ctx = make_run_context(plan, path, stage="side_by_side")
    t0 = time.monotonic()
    with pytest.raises(Exception) as info:
        run_side_by_side(plan, ctx, timeout_s=120)
    took = time.monotonic() - t0
    ps = _ps("stat,args").splitlines()
    left = [ln for ln in ps if str(run_folder(ctx)) in ln and not ln.startswith("Z")]
    assert left == [], "the failed run left processes running"
    return info.value, took, run_folder(ctx)


def test_a_checkpoint_thread_that_raises_fails_the_side_by_side_run(
    write_plan, criu_binary, monkeypatch
) -> None:
    exc, took, folder = _failing_side_by_side(
        write_plan, {}, criu_binary, monkeypatch, interval_s=math.inf
    )
    assert isinstance(exc, OverflowError)
    assert took < 6, "the run went on after its checkpoint thread died"  # the workload: ~8 s
    assert [e.event for e in read_journal(folder / "events.jsonl")].count("thread_failed") == 1


def test_a_probe_thread_that_raises_fails_the_side_by_side_run(
    write_plan, criu_binary, monkeypatch
) -> None:
    # One capture group, as the plan requires, but it holds no number: int() raises.
    exc, took, folder = _failing_side_by_side(
        write_plan, {"workload.progress_probe.log_regex": "^(s)tep="}, criu_binary, monkeypatch
    )
    assert isinstance(exc, ValueError) and "invalid literal for int()" in str(exc)
    assert took < 6
    assert "thread_failed" in {e.event for e in read_journal(folder / "events.jsonl")}
