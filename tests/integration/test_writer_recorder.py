"""The writer recorder on real fanotify and the real process-events connector: a foreign
writer's files are the node's own with the writer named, a PoC process's are the PoC's, a
writer that could not be resolved or a span the recorder missed leaves a change unexplained,
and a recorder killed outright leaves a gap."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tasks.data.plan import load_plan
from tasks.data.runctx import open_run
from tasks.exit.exit_diff import Attribution, classify
from tasks.exit.install import on_node
from tasks.exit.writers.recorder import WriterRecorder
from tasks.exit.writers.service import (
    WriterLog,
    read_writer_log,
    recorder_folder,
    start_recorders,
    stop_recorders,
)
from tests.support.common import REPO

# alone: fanotify sees every writer on the machine
pytestmark = pytest.mark.alone


def _wait(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _foreign_daemon(script: str, pid_file: Path) -> int:
    """A shell whose parent is gone before the recorder starts: reparented to pid 1, it has
    no PoC ancestry (as a cron job or a monitoring agent)."""
    subprocess.run(
        [
            "sh",
            "-c",
            f"(sh -c 'echo $$ > {pid_file}; sleep 1; {script}' &) </dev/null >/dev/null 2>&1",
        ],
        check=True,
        env={"PATH": os.environ["PATH"]},
    )
    assert _wait(lambda: pid_file.exists() and pid_file.read_text().strip())
    return int(pid_file.read_text())


def test_each_write_is_tied_to_its_writer(tmp_path: Path) -> None:
    tag = f"ckpt-writer-test-{os.getpid()}"
    foreign = f"/tmp/{tag}-foreign"
    script = f"echo one > {foreign}; echo two >> {foreign}; chmod 600 {foreign}; mkdir -p /dev/shm/{tag}; echo x > /dev/shm/{tag}/f; rm -r /dev/shm/{tag}"  # noqa: E501
    daemon = _foreign_daemon(script, tmp_path / "daemon.pid")
    spec = {
        "node": "local",
        "out": str(tmp_path / "log"),
        "paths": ["/tmp", "/dev/shm", "/var/tmp"],
        "skip": [str(tmp_path)],
        "poc_folders": [str(tmp_path / "poc")],  # this test's venv is not the PoC here
        "poc_pids": [],
        "flush_s": 0.5,
    }
    recorder = WriterRecorder(spec)
    stop = threading.Event()
    thread = threading.Thread(target=recorder.run, args=(stop,), daemon=True)
    thread.start()
    assert _wait(lambda: (tmp_path / "log" / "writers.json").exists())
    # The PoC's side: a copy the harness marks (CKPT_POC_JOB), and one of its children.
    poc = f"/var/tmp/{tag}-poc"
    env = {"PATH": os.environ["PATH"], "CKPT_POC_JOB": "test"}
    subprocess.run(["sh", "-c", f"echo 1 > {poc}; sh -c 'echo 2 >> {poc}'"], env=env, check=True)
    assert _wait(lambda: not Path(f"/proc/{daemon}").exists())  # the daemon is done
    try:
        assert _wait(lambda: any(p == foreign for p, _ in recorder.rows))
    finally:
        stop.set()
        thread.join(10)
    log = WriterLog.read(tmp_path / "log", "local")
    assert log is not None and log.gaps == [] and "/" in log.marked
    rows: dict[str, list[dict[str, Any]]] = {}
    for row in log.rows:
        rows.setdefault(row["path"], []).append(row)
    mine = {r["writer_exe"]: r for r in rows[foreign]}  # the shell, then chmod
    assert {r["side"] for r in mine.values()} == {"node"}, mine
    dash, chmod = mine["/usr/bin/dash"], mine["/usr/bin/chmod"]
    assert {"create", "modify"} <= set(dash["what"].split("+"))
    assert "no PoC ancestry" in dash["why"] and "attrib" in chmod["what"].split("+")
    # A folder created and removed: its file's events still resolve under its path.
    assert f"/dev/shm/{tag}/f" in rows and f"/dev/shm/{tag}" in rows
    assert {r["side"] for r in rows[poc]} == {"poc"}, rows[poc]
    assert any("PoC marker env:CKPT_POC_JOB" in r["why"] for r in rows[poc])
    Path(foreign).unlink(missing_ok=True)
    Path(poc).unlink(missing_ok=True)


def _item(path: str) -> dict[str, Any]:
    return {"node": "local-a", "kind": "files", "key": path, "change": "added",
            "before": None, "after": "{}"}  # fmt: skip


def _row(path: str, side: str, exe: str = "/usr/bin/logrotate") -> dict[str, Any]:
    return {"path": path, "side": side, "writer_exe": exe, "writer_cgroup": "/system.slice/x",
            "pid": 42, "why": "w", "count": 2, "what": "create+modify"}  # fmt: skip


def test_the_exit_diff_attributes_a_file_change_by_its_writers() -> None:
    path = "/var/tmp/report.txt"
    node = Attribution("local-a", writes={path: [_row(path, "node")]})
    assert classify(_item(path), node) == (
        "node_own",
        "written by /usr/bin/logrotate, pid 42, cgroup /system.slice/x (2 create+modify): "
        "not the PoC's",
    )
    both = Attribution("local-a", writes={path: [_row(path, "node"), _row(path, "poc", "/x")]})
    assert classify(_item(path), both)[0] == "poc"
    unresolved = Attribution("local-a", writes={path: [_row(path, "unresolved")]})
    assert classify(_item(path), unresolved)[0] == "unexplained"
    gap = Attribution("local-a", writes={path: [_row(path, "node")]}, writer_gaps=("overflow",))
    assert classify(_item(path), gap)[0] == "unexplained"  # a gap: never the node's own
    unwritten = Attribution("local-a", writes={})
    assert classify(_item(path), unwritten)[0] == "unexplained"


def test_a_recorder_killed_outright_leaves_a_gap(write_plan) -> None:
    path = write_plan()
    plan = load_plan(path, check_cluster=False)
    with open_run(plan, path, "snapshot"):
        started = start_recorders(plan, [plan.data_dir], [], [])
    folder = recorder_folder(plan)
    pid = started["local"].pid
    assert started["local"].how == "its own session" and started["local"].started
    os.kill(pid, signal.SIGKILL)
    assert _wait(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid))
    log = stop_recorders(plan)["local"]
    assert log is not None
    assert log.gaps[-1]["reason"].startswith("the recorder was not running")
    assert not (folder / "recorder.pid").exists()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_recorder_runs_without_the_harness_and_stops_on_sigterm(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(
        '{"node": "n", "out": "%s", "paths": ["/tmp"], "flush_s": 0.2}' % (tmp_path / "out")
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "tasks.exit.writers.recorder", str(spec)], cwd=REPO
    )
    assert _wait(lambda: (tmp_path / "out" / "writers.json").exists())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    log = WriterLog.read(tmp_path / "out", "n")
    assert log is not None and log.gaps == []


def _snapshots(plan: Any, path: Path, phase: str) -> None:
    from tasks.exit.snapshots import take_snapshots

    with open_run(plan, path, "snapshot") as ctx:
        take_snapshots(plan, ctx, phase, list(plan.cluster.nodes))


def test_the_exit_verdict_names_each_changes_writer(write_plan, tmp_path: Path) -> None:
    """The way out on this machine, the recorder running from the before_install snapshot
    to the recheck: a foreign daemon's files (created, and one deleted, under /tmp, /var/tmp
    and /dev/shm) are the node's own with their writer named; a file a PoC-marked process
    wrote and left, and one an install step wrote that the uninstall forgets, are the
    PoC's."""
    from tasks.exit.exit_diff import exit_diff

    watch = {"kinds": ["files"], "paths": ["/tmp", "/var/tmp", "/dev/shm", "/etc"]}
    path = write_plan(
        {"cluster.nodes": ["local-a"], "exit.recheck_after_s": 1, "exit.watch": watch}
    )
    plan = load_plan(path, check_cluster=False)
    tag = f"ckpt-writers-{os.getpid()}"
    go = tmp_path / "go"  # three levels under /tmp: below what the snapshots list
    made = [f"/tmp/{tag}-new", f"/var/tmp/{tag}-new", f"/dev/shm/{tag}-d"]
    gone = f"/var/tmp/{tag}-old"
    script = (
        f"echo old > {gone}; while [ ! -e {go} ]; do sleep 0.05; done; "
        f"echo a > {made[0]}; echo b > {made[1]}; mkdir {made[2]}; echo c > {made[2]}/f; "
        f"rm {gone}; touch {tmp_path}/done"
    )
    subprocess.run(["setsid", "-f", "sh", "-c", script], check=True, env={"PATH": "/usr/bin:/bin"})
    assert _wait(lambda: Path(gone).exists())
    poc, forgotten = f"/var/tmp/{tag}-poc", f"/etc/{tag}.conf"
    try:
        _snapshots(plan, path, "before_install")
        go.touch()
        assert _wait(lambda: (tmp_path / "done").exists())
        marked = {"PATH": "/usr/bin:/bin", "CKPT_POC_JOB": "test"}
        subprocess.run(["sh", "-c", f"echo left > {poc}"], env=marked, check=True)
        # An install step (the install's own path to the node) writes a file its uninstall
        # will not remove.
        (tmp_path / "conf").write_text("x\n")
        step = ["install", "-m", "0644", str(tmp_path / "conf"), forgotten]
        assert on_node(plan, "local-a", step).returncode == 0
        _snapshots(plan, path, "after_uninstall")  # and its recheck; the recorder stops
        with open_run(plan, path, "exit_diff") as ctx:
            diff = exit_diff(plan, ctx, "before_install", "after_uninstall")
    finally:
        for p in [*made[:2], poc, gone, forgotten]:
            Path(p).unlink(missing_ok=True)
        shutil.rmtree(made[2], ignore_errors=True)
    items = {x["key"]: x for x in [*diff.leftovers, *diff.node_own]}
    assert items[forgotten]["class"] == "poc", items[forgotten]["reason"]
    assert items[forgotten]["reason"].startswith("written by the PoC's /usr/bin/install (pid ")
    for key in [*made, f"{made[2]}/f", gone]:
        item = items[key]
        assert item["class"] == "node_own", (key, item["reason"])
        assert (
            item["reason"].startswith("written by /usr/bin/") and "not the PoC's" in item["reason"]
        )
    assert items[gone]["change"] == "removed" and "/usr/bin/rm" in items[gone]["reason"]
    assert items[poc]["class"] == "poc"
    from tasks.data.datasets import WRITES
    from tasks.data.store import read_dataset

    writes = read_dataset(WRITES, data_dir=plan.data_dir, poc=plan.poc)
    assert set(writes[writes["path"] == made[0]]["side"]) == {"node"}
    # By its own marker or by its parent, this test's process (the harness, here).
    assert items[poc]["reason"].startswith("written by the PoC's /usr/bin/dash (pid ")
    assert not (recorder_folder(plan) / "recorder.pid").exists()  # stopped at the recheck
    assert read_writer_log(plan, "local") is not None


@pytest.mark.criu
def test_a_file_a_restored_copy_writes_outside_its_folder_is_the_pocs(
    tmp_path: Path, criu_binary: str
) -> None:
    """A workload copy dumped and restored by real CRIU (forked by CRIU, in its own PID
    namespace) writes a file under /var/tmp after the restore: the PoC's, by its marker and
    its restorer's ancestry."""
    from tasks.data.runctx import make_run_context
    from tasks.engine.checkpointers.criu import CriuCheckpointer
    from tasks.engine.clock import EventRecorder
    from tasks.engine.clusters.local.cluster import LocalCluster

    plan = load_plan(REPO / "plans" / "demo.yaml").model_copy(
        update={"data_dir": str(tmp_path / "data")}
    )
    recorder = EventRecorder(make_run_context(plan, REPO / "plans" / "demo.yaml"))
    cluster = LocalCluster(nodes=["local-a"], run_dir=tmp_path / "run", workdir=REPO)
    trigger, out = tmp_path / "write-now", f"/var/tmp/ckpt-restored-{os.getpid()}"
    code = (
        "import pathlib, time\n"
        f"while not pathlib.Path({str(trigger)!r}).exists(): time.sleep(0.05)\n"
        f"pathlib.Path({out!r}).write_text('after the restore')\n"
        "time.sleep(120)\n"
    )
    spec = {"node": "local", "out": str(tmp_path / "log"), "paths": ["/var/tmp"],
            "skip": [str(tmp_path)], "poc_folders": [], "poc_pids": [], "flush_s": 0.5}  # fmt: skip
    writers = WriterRecorder(spec)
    stop = threading.Event()
    thread = threading.Thread(target=writers.run, args=(stop,), daemon=True)
    try:
        proc = cluster.start("local-a", "managed", [sys.executable, "-c", code])
        ckpt = CriuCheckpointer(tmp_path / "ckpt", keep=1, recorder=recorder, trial_id="w",
                                binary=criu_binary)  # fmt: skip
        ckpt.dump(proc)
        cluster.kill(proc)
        assert cluster.wait_gone(proc)
        thread.start()  # its lineage starts after the copy's launch: only the restore is seen
        assert _wait(lambda: (tmp_path / "log" / "writers.json").exists())
        ckpt.restore(cluster, "local-a")
        trigger.touch()
        assert _wait(lambda: any(p == out for p, _ in writers.rows), 20)
    finally:
        stop.set()
        thread.join(10)
        assert cluster.stop_all() == []
        cluster.close()
        Path(out).unlink(missing_ok=True)
    rows = [r for r in WriterLog.read(tmp_path / "log", "local").rows if r["path"] == out]
    assert {r["side"] for r in rows} == {"poc"}, rows
    assert any("PoC marker env:CKPT_POC_JOB" in r["why"] for r in rows), rows
    assert all("python" in str(r["writer_exe"]) for r in rows), rows  # the restored image
