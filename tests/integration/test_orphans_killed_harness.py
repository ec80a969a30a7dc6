"""A harness killed with SIGKILL leaves nothing running and its record behind.

Each test runs a real harness in a subprocess (a side-by-side run, or a CRIU restore), kills
it with SIGKILL and looks at what is left: no process of the run alive a few seconds later
(launched copies, CRIU-restored copies, CRIU itself, the reaper), a process the run did not
start untouched, the run's events in its journal, and the checkpoint folders the killed run
left removed by the next run of the same root, never while a live run holds it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tasks.engine.checkpointers.criu import COMPLETE, Checkpoint, CriuCheckpointer
from tasks.engine.clock import JOURNAL_FLUSH_S, EventRecorder, read_journal
from tasks.engine.clusters.reaper import (
    pid_alive,
)
from tasks.engine.paths import run_folder
from tasks.engine.probes import HOLD_S
from tasks.engine.side_by_side import run_side_by_side
from tests.support.common import REPO, demo_plan_dict

pytestmark = pytest.mark.criu

GONE_WITHIN_S = 5.0
KILLED_RUN_ID = "killed-run"
SIDE_BY_SIDE_HARNESS = """
import sys
from tasks.engine.side_by_side import run_side_by_side
from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context

plan = load_plan(sys.argv[1])
ctx = make_run_context(plan, sys.argv[1], run_id=sys.argv[2], stage="side_by_side")
run_side_by_side(plan, ctx, timeout_s=600)
"""
# A live checkpointer of a root: says how many stale folders it removed, then holds it.
ROOT_HOLDER = """
import sys, time
from pathlib import Path
from tasks.engine.checkpointers.criu import CriuCheckpointer
from tasks.engine.clock import EventRecorder

ckpt = CriuCheckpointer(Path(sys.argv[1]), 5, EventRecorder(None), "t", binary=sys.argv[2])
print(len(ckpt.removed_stale), flush=True)
time.sleep(600)
"""
# Starts a copy, dumps it, kills it and restores it; prints the restored pid; waits. With
# STALL_BEFORE_ADOPT set it stops where CRIU has restored the copy but the harness has not
# yet adopted it (only the restore's pidfile names it), and prints that pid. With
# STALL_BEFORE_TRACK=start (or restore) it stops just after forking the copy's launcher (or
# CRIU's restore), before telling the reaper its pid, and prints that pid. With
# STALL_BEFORE_EXEC=PATH the copy's launcher, once forked and its descriptors closed, writes
# its pid to PATH and waits STALL_S before its exec: a child that still reads as the harness
# when the harness dies.
RESTORE_HARNESS = """
import os, subprocess, sys, time
from pathlib import Path
from tasks.engine.checkpointers.criu import CriuCheckpointer
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.local.cluster import LocalCluster
from tasks.engine.clusters.reaper import RunReaper

def stall(self, slot, arm, pid, tag=""):
    print(pid, flush=True)
    time.sleep(600)

def stall_track(self, pid):
    print(pid, flush=True)
    time.sleep(600)

if os.environ.get("STALL_BEFORE_ADOPT"):
    LocalCluster.adopt = stall
run_dir = Path(sys.argv[1])
cluster = LocalCluster(["local-a"], run_dir, Path.cwd())
cluster.reaper  # started (and its own pid tracked) before any stall
recorder = EventRecorder(None, jsonl=run_dir / "events.jsonl")
if os.environ.get("STALL_BEFORE_TRACK") == "start":
    RunReaper.track = stall_track
if stall_file := os.environ.get("STALL_BEFORE_EXEC"):
    real_popen = subprocess.Popen

    def stall_before_exec():  # in the forked child: low-level calls only
        # Popen closes the child's copy of the reaper's pipe just before its exec: the window
        # stretched here, where only the harness holds the pipe and the child reads as it.
        os.close(cluster.reaper._fd)
        fd = os.open(stall_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        time.sleep(float(os.environ["STALL_S"]))

    subprocess.Popen = lambda argv, **kw: real_popen(argv, preexec_fn=stall_before_exec, **kw)
proc = cluster.start("local-a", "managed", sys.argv[2:])
while "step=3 " not in proc.log.read_text():
    time.sleep(0.02)
criu = CriuCheckpointer(run_dir / "criu", 1, recorder, "t")
point = criu.dump(proc)
cluster.kill(proc)
assert cluster.wait_gone(proc)
if os.environ.get("STALL_BEFORE_TRACK") == "restore":
    RunReaper.track = stall_track
restored = criu.restore(cluster, "local-a", point)
print(restored.pid, flush=True)
time.sleep(600)
"""


def _train(copy_dir: Path | str, state_mb: int = 0, steps: int = 100_000) -> list[str]:
    """The example training workload; its argv names ``copy_dir`` (so the run's processes
    can be told from every other by their command line)."""
    argv = ["python", "-m", "examples.train_digits", "--steps", str(steps)]
    argv += ["--step-sleep", "0.02", "--checkpoint-every", "50", "--checkpoint-dir", str(copy_dir)]
    return argv + (["--state-mb", str(state_mb)] if state_mb else [])


def processes_mentioning(text: str) -> dict[int, str]:
    """Live (not zombie) processes whose command line mentions ``text``: this run's."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and pid_alive(int(entry)):
            found[int(entry)] = cmdline
    return found


def restored_alive(run_dir: Path) -> list[int]:
    """The live pids CRIU's restores wrote to their pidfiles under the run."""
    pidfiles = (run_dir / "criu").glob("restore-*.pid")
    pids = [int(text) for p in pidfiles if (text := p.read_text().strip())]
    return [pid for pid in pids if pid_alive(pid)]


def end_harness(harness: subprocess.Popen, tmp_path: Path) -> None:
    """A test's cleanup: the harness and anything of its run still alive, killed."""
    harness.kill()
    harness.wait()
    for pid in processes_mentioning(str(tmp_path)):
        os.kill(pid, signal.SIGKILL)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def still_alive_after_kill(mark: str, pids: list[int]) -> tuple[dict[int, str], list[int], float]:
    """Wait up to GONE_WITHIN_S for every process of the run to go; what is left, and when
    the last went (seconds after the kill)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < GONE_WITHIN_S:
        if not processes_mentioning(mark) and not any(pid_alive(p) for p in pids):
            break
        time.sleep(0.05)
    took = time.monotonic() - t0
    return processes_mentioning(mark), [p for p in pids if pid_alive(p)], took


@dataclass
class KilledRun:
    tmp: Path
    run_dir: Path
    journal: Path
    workload_pids: list[int]
    left_alive: dict[int, str]
    pids_left: list[int]
    gone_after_s: float
    decoy_alive: bool
    log_steps_at_kill: dict[str, int]
    pristine_root: Path  # a copy of the killed run's checkpoint root, as the kill left it
    data_dir: Path


def _last_step(log: Path) -> int:
    steps = [
        int(line.split()[0].split("=")[1])
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith("step=")
    ]
    return steps[-1] if steps else -1


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory, criu_binary: str) -> Iterator[KilledRun]:
    """A real side-by-side run, killed with SIGKILL while a CRIU dump is in flight."""
    tmp = tmp_path_factory.mktemp("killed-side-by-side")
    plan = demo_plan_dict()
    plan["data_dir"] = str(tmp / "data")
    plan["workload"]["command"] = _train("{copy_dir}", state_mb=256)
    plan["checkpointer"].update(interval_s=1.0, keep=2)
    plan_path = tmp / "plan.yaml"
    plan_path.write_text(yaml.safe_dump(plan, sort_keys=False))
    decoy = subprocess.Popen(["sleep", "120"])  # not the run's: must survive
    harness = subprocess.Popen(
        [sys.executable, "-c", SIDE_BY_SIDE_HARNESS, str(plan_path), KILLED_RUN_ID],
        cwd=REPO,
        env={**os.environ, "CKPT_POC_CRIU": criu_binary},
    )
    run_dir = tmp / "data" / "demo" / "runs" / KILLED_RUN_ID
    journal = run_dir / "events.jsonl"
    try:

        def dump_in_flight() -> bool:
            assert harness.poll() is None, "the harness ended before it was killed"
            events = read_journal(journal)
            ends = [e for e in events if e.event == "checkpoint_end"]
            starts = [e for e in events if e.event == "checkpoint_start"]
            # Both copies under way (on a loaded machine the unmanaged one can still be
            # starting when the managed one has been dumped twice), and a dump in flight.
            both = {e.arm for e in events if e.event == "progress"} == {"managed", "unmanaged"}
            return both and len(ends) >= 2 and starts[-1].t_mono_ns > ends[-1].t_mono_ns

        wait_until(dump_in_flight, 120, "a second checkpoint to start")
        time.sleep(0.05)  # well inside the dump of a 256 MB workload
        harness.send_signal(signal.SIGKILL)
        log_steps = {p.name: _last_step(p) for p in run_dir.glob("*.log") if "reaper" not in p.name}
        harness.wait()
        events = read_journal(journal)
        pids = [int(e.detail["pid"]) for e in events if e.event == "started"]
        left, pids_left, took = still_alive_after_kill(str(tmp), pids)
        pristine = tmp / "pristine-criu"
        shutil.copytree(run_dir / "criu", pristine)
        yield KilledRun(
            tmp=tmp,
            run_dir=run_dir,
            journal=journal,
            workload_pids=pids,
            left_alive=left,
            pids_left=pids_left,
            gone_after_s=took,
            decoy_alive=pid_alive(decoy.pid),
            log_steps_at_kill=log_steps,
            pristine_root=pristine,
            data_dir=tmp / "data",
        )
    finally:
        harness.kill()
        harness.wait()
        decoy.kill()
        decoy.wait()
        for pid in processes_mentioning(str(tmp)):  # only if the test failed: our own
            os.kill(pid, signal.SIGKILL)


def test_killing_the_harness_ends_both_workload_copies(killed_run: KilledRun) -> None:
    assert len(killed_run.workload_pids) == 2
    assert killed_run.pids_left == [], f"workload copies outlived the harness: {killed_run}"
    assert killed_run.left_alive == {}, "processes of the killed run still alive"
    assert killed_run.gone_after_s < GONE_WITHIN_S
    print(f"every process of the killed run gone {killed_run.gone_after_s:.2f} s after SIGKILL")
    assert killed_run.decoy_alive, "a process the run did not start was signalled"


def test_a_killed_run_leaves_its_events_in_the_journal(killed_run: KilledRun) -> None:
    events = read_journal(killed_run.journal)
    by_arm: dict[str, set[str]] = {}
    for e in events:
        by_arm.setdefault(e.arm, set()).add(e.event)
    assert {"launch", "started", "progress"} <= by_arm["unmanaged"]
    assert {"launch", "started", "progress", "checkpoint_start", "checkpoint_end"} <= by_arm[
        "managed"
    ]
    # Nothing wrote the dataset (the run never reached its end): the journal is the record.
    assert not list(killed_run.data_dir.rglob(f"*{KILLED_RUN_ID}*.parquet"))
    # Written as they happened: the last step journalled is at most JOURNAL_FLUSH_S of steps
    # (20 ms each) behind the log at the kill, plus the probe's latency (while steps keep
    # coming, its hold: HOLD_S, plus a wake-up).
    lag_steps = int((JOURNAL_FLUSH_S + HOLD_S) / 0.02) + 5
    for arm in ("managed", "unmanaged"):
        journalled = max(e.detail["step"] for e in events if e.arm == arm and e.event == "progress")
        at_kill = next(
            s for name, s in killed_run.log_steps_at_kill.items() if name.endswith(f"-{arm}.log")
        )
        assert at_kill - lag_steps <= journalled <= at_kill, (arm, journalled, at_kill)


def _folders(root: Path) -> tuple[list[str], list[str]]:
    """(complete, not complete) checkpoint folder names under ``root``."""
    folders = sorted(p for p in root.glob("ckpt-*") if p.is_dir())
    done = [p.name for p in folders if Checkpoint.load(p) is not None]
    return done, [p.name for p in folders if p.name not in done]


def test_the_next_checkpointer_of_the_root_removes_cut_short_and_surplus_dumps(
    killed_run: KilledRun, tmp_path: Path, criu_binary: str
) -> None:
    root = tmp_path / "criu"
    shutil.copytree(killed_run.pristine_root, root)
    done, cut_short = _folders(root)
    assert cut_short, "the kill did not land during a dump"
    assert len(done) == 2  # keep=2 of the killed run
    # A live owner (a real process holding the root) is dumping: nothing is touched.
    holder = subprocess.Popen(
        [sys.executable, "-c", ROOT_HOLDER, str(root), criu_binary],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == str(len(cut_short))  # it cleaned first
        in_flight = root / "ckpt-00090"  # the live owner's dump, no COMPLETE yet
        shutil.copytree(root / done[-1], in_flight)
        (in_flight / COMPLETE).unlink()
        older = root / "ckpt-00000"  # a complete one beyond keep
        shutil.copytree(root / done[0], older)
        ckpt = CriuCheckpointer(root, 1, EventRecorder(None), "next", binary=criu_binary)
        assert ckpt.removed_stale == []
        ckpt.close()
        assert in_flight.exists() and older.exists()
    finally:
        holder.kill()
        holder.wait()
    # Its owner is dead: the next checkpointer of the root removes the cut-short dump and
    # every complete one beyond its keep.
    ckpt = CriuCheckpointer(root, 1, EventRecorder(None), "next", binary=criu_binary)
    assert sorted(p.name for p in ckpt.removed_stale) == sorted(
        ["ckpt-00000", *done[:-1], "ckpt-00090"]
    )
    assert _folders(root) == ([done[-1]], [])
    assert ckpt.last_complete() is not None and ckpt.last_complete().path.name == done[-1]


def test_the_next_run_removes_what_the_killed_run_left(
    killed_run: KilledRun, write_plan, criu_binary: str, monkeypatch
) -> None:
    monkeypatch.setenv("CKPT_POC_CRIU", criu_binary)
    root = killed_run.run_dir / "criu"
    done, cut_short = _folders(root)
    assert cut_short
    plan_path = write_plan(
        {"data_dir": str(killed_run.data_dir), "workload.command": _train("{copy_dir}", steps=30)}
    )
    plan = load_plan(plan_path)
    ctx = make_run_context(plan, plan_path, stage="side_by_side")
    result = run_side_by_side(plan, ctx, timeout_s=120)
    assert _folders(root) == (done, [])  # the killed run's keep (2) held: only cut-short went
    journal = read_journal(run_folder(ctx) / "events.jsonl")
    swept = [e for e in journal if e.event == "stale_checkpoints_removed"]
    assert swept and {Path(f).name for f in swept[0].detail["folders"]} == set(cut_short)
    assert len(journal) == result.events  # a run that ends journals what it records


@pytest.mark.parametrize("adopted", [True, False], ids=["adopted", "before-adopt"])
def test_killing_the_harness_ends_a_restored_copy(
    tmp_path: Path, criu_binary: str, adopted: bool
) -> None:
    stall = {} if adopted else {"STALL_BEFORE_ADOPT": "1"}
    harness = subprocess.Popen(
        [sys.executable, "-c", RESTORE_HARNESS, str(tmp_path / "run"), *_train(tmp_path)],
        cwd=REPO,
        env={**os.environ, "CKPT_POC_CRIU": criu_binary, **stall},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert harness.stdout is not None
        restored = int(harness.stdout.readline())
        assert pid_alive(restored)
        # The restored copy is re-parented to init: no parent-death signal reaches it.
        with open(f"/proc/{restored}/stat") as fh:
            assert fh.read().rsplit(")", 1)[1].split()[1] != str(harness.pid)
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        left, pids_left, _ = still_alive_after_kill(str(tmp_path), [restored])
        assert pids_left == [] and left == {}
    finally:
        end_harness(harness, tmp_path)


def test_killing_the_harness_while_criu_restores_ends_what_it_restores(
    tmp_path: Path, criu_binary: str
) -> None:
    run_dir = tmp_path / "run"
    harness = subprocess.Popen(
        [sys.executable, "-c", RESTORE_HARNESS, str(run_dir), *_train(tmp_path, state_mb=256)],
        cwd=REPO,
        env={**os.environ, "CKPT_POC_CRIU": criu_binary},
        stdout=subprocess.PIPE,
        text=True,
    )
    journal = run_dir / "events.jsonl"
    try:
        wait_until(
            lambda: any(e.event == "restore_start" for e in read_journal(journal)),
            120,
            "the restore to start",
        )
        time.sleep(0.02)  # CRIU is running: restoring 256 MB takes longer than this
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        left, _, _ = still_alive_after_kill(str(tmp_path), [])
        assert left == {}
        assert not restored_alive(run_dir), "the copy CRIU restored is still alive"
    finally:
        end_harness(harness, tmp_path)


@pytest.mark.parametrize("started_by", ["start", "restore"])
def test_a_harness_killed_between_a_fork_and_its_track_still_ends_the_child(
    tmp_path: Path, criu_binary: str, started_by: str
) -> None:
    """The reaper hears of a process before its fork: a harness killed after forking the
    copy's launcher (or CRIU's restore) but before naming its pid still has it ended."""
    run_dir = tmp_path / "run"
    harness = subprocess.Popen(
        [sys.executable, "-c", RESTORE_HARNESS, str(run_dir), *_train(tmp_path)],
        cwd=REPO,
        env={**os.environ, "CKPT_POC_CRIU": criu_binary, "STALL_BEFORE_TRACK": started_by},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert harness.stdout is not None
        forked = int(harness.stdout.readline())  # the launcher's, or CRIU's, pid: untracked
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        left, pids_left, took = still_alive_after_kill(str(tmp_path), [forked])
        assert pids_left == [] and left == {}, f"left {took:.2f} s after SIGKILL: {left}"
        assert not restored_alive(run_dir), "the copy CRIU restored is still alive"
    finally:
        end_harness(harness, tmp_path)
