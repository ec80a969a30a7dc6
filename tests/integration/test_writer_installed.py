"""Writes by what the install put on a node are the PoC's, though no PoC process made them
(a daemon the install enabled, started by the node's service manager); and a recorder that
cannot use fanotify says so, records its whole span as a gap and never fails the way out.
Real fanotify and the real process-events connector."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tasks.data.plan import load_plan
from tasks.data.runctx import open_run
from tasks.exit.install import layout
from tasks.exit.writers.installed import InstalledSet, unit_of
from tasks.exit.writers.lineage import ProcInfo
from tasks.exit.writers.recorder import writer_of
from tests.support.common import REPO

# alone: fanotify sees every writer on the machine
pytestmark = pytest.mark.alone


def _wait(predicate: Any, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _proc(pid: int, exe: str, ppid: int, cgroup: str = "/", run_from: tuple[str, ...] = ()):
    return ProcInfo(pid, ppid, exe, cgroup, None, run_from=run_from)


def test_a_unit_or_an_executable_the_install_made_is_the_pocs(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    installed = InstalledSet(("*slurmd.service.d/*",), (str(manifest),))
    daemon = _proc(40, "/usr/local/bin/ckptd", 1, "/system.slice/ckptd.service")
    child = _proc(41, "/usr/bin/dash", 40, "/system.slice/ckptd.service")
    chain = [child, daemon, _proc(1, "/usr/lib/systemd/systemd", 0)]
    assert writer_of(chain, frozenset(), (), installed).side == "node"  # no manifest yet
    manifest.write_text(json.dumps({"files": [{"path": "/usr/local/bin/ckptd"}], "hooks": []}))
    installed.refresh()
    mine = writer_of(chain, frozenset(), (), installed)
    assert mine.side == "poc", mine
    assert "its ancestor /usr/local/bin/ckptd (pid 40): runs /usr/local/bin/ckptd, in the " in (
        mine.why
    )
    manifest.unlink()  # the uninstall removed it: what was read is remembered
    installed.refresh()
    assert writer_of(chain, frozenset(), (), installed).side == "poc"
    # A unit the install changed (a drop-in): its processes' writes are the PoC's.
    slurmd = [_proc(7, "/usr/sbin/slurmd", 1, "/system.slice/slurmd.service"), chain[-1]]
    said = writer_of(slurmd, frozenset(), (), installed)
    assert said.side == "poc" and "unit slurmd.service was created or changed" in said.why
    cron = [_proc(9, "/usr/sbin/cron", 1, "/system.slice/cron.service"), chain[-1]]
    assert writer_of(cron, frozenset(), (), installed).side == "node"
    assert unit_of("/etc/systemd/system/cedana.service") == "cedana.service"
    assert unit_of("/user.slice/user-0.slice/session-3.scope") == "session-3.scope"
    assert unit_of("/") is None


def _snapshots(plan: Any, path: Path, phase: str) -> None:
    from tasks.exit.snapshots import take_snapshots

    with open_run(plan, path, "snapshot") as ctx:
        take_snapshots(plan, ctx, phase, list(plan.cluster.nodes))


def test_a_daemon_the_install_left_writes_the_pocs_residue(write_plan, tmp_path: Path) -> None:
    """The install puts a daemon and its unit on the node and lists them in its manifest;
    the node's service manager (a process with no PoC ancestry, running before the PoC)
    starts the daemon, which writes a file; the uninstall forgets both. The daemon's file is
    the PoC's, by what the install put there, though no PoC process wrote it."""
    from tasks.exit.exit_diff import exit_diff

    watch = {"kinds": ["files", "units"], "paths": ["/usr/local/sbin", "/etc/systemd", "/var/tmp"]}
    path = write_plan(
        {"cluster.nodes": ["local-a"], "exit.recheck_after_s": 1, "exit.watch": watch}
    )
    plan = load_plan(path, check_cluster=False)
    tag = f"ckpt-forgotten-{os.getpid()}"
    daemon = Path(f"/usr/local/sbin/{tag}d")
    unit = Path(f"/etc/systemd/system/{tag}.service")
    state = Path(f"/var/tmp/{tag}.state")
    start = tmp_path / "start-unit"
    manager = f"while [ ! -e {start} ]; do sleep 0.05; done; exec {daemon}"
    subprocess.run(["setsid", "-f", "sh", "-c", manager], check=True, env={"PATH": "/usr/bin:/bin"})
    manifest = layout(plan, "local-a").manifest
    try:
        _snapshots(plan, path, "before_install")
        # The install, as tasks/exit/install.py does it: the manifest first, then the files.
        manifest.parent.mkdir(parents=True, exist_ok=True)
        files = [{"path": str(daemon)}, {"path": str(unit)}]
        manifest.write_text(json.dumps({"poc": plan.poc, "files": files, "hooks": []}))
        daemon.write_text(f"#!/bin/sh\necho up > {state}\nsh -c 'echo more >> {state}'\n")
        daemon.chmod(0o755)
        unit.write_text(f"[Service]\nExecStart={daemon}\n")
        start.touch()  # the service manager starts the unit
        assert _wait(lambda: state.exists() and "more" in state.read_text())
        manifest.unlink()  # the uninstall removes its manifest and forgets the rest
        _snapshots(plan, path, "after_uninstall")
        with open_run(plan, path, "exit_diff") as ctx:
            diff = exit_diff(plan, ctx, "before_install", "after_uninstall")
    finally:
        start.touch()
        for p in (daemon, unit, state):
            p.unlink(missing_ok=True)
    items = {x["key"]: x for x in [*diff.leftovers, *diff.node_own]}
    said = items[str(state)]
    assert said["class"] == "poc", said["reason"]
    assert f"runs {daemon}, in the install's manifest" in said["reason"]
    for made in (daemon, unit):
        assert items[str(made)]["class"] == "poc", (made, items[str(made)]["reason"])
    assert diff.verdict == "leftovers"


def test_without_fanotify_the_span_is_a_gap_and_the_way_out_still_ends(
    write_plan, tmp_path: Path
) -> None:
    """A harness without CAP_SYS_ADMIN (a container's): fanotify_init is refused. The
    recorder says so once, its whole span is a gap, and the exit diff attributes as it does
    without a recorder: a foreign file is unexplained, never the node's own by its writer."""
    watch = {"kinds": ["files"], "paths": ["/var/tmp"]}
    path = write_plan(
        {"cluster.nodes": ["local-a"], "exit.recheck_after_s": 0, "exit.watch": watch}
    )
    script = f"""
import json, logging, sys
from pathlib import Path
from tasks.data.plan import load_plan
from tasks.data.runctx import open_run
from tasks.exit.snapshots import take_snapshots
from tasks.exit.exit_diff import exit_diff
logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
plan = load_plan(Path({str(path)!r}), check_cluster=False)
for phase in ("before_install", "after_uninstall"):
    with open_run(plan, Path({str(path)!r}), "snapshot") as ctx:
        take_snapshots(plan, ctx, phase, ["local-a"])
    if phase == "before_install":
        Path({str(f"/var/tmp/ckpt-nofan-{os.getpid()}")!r}).write_text("x")
with open_run(plan, Path({str(path)!r}), "exit_diff") as ctx:
    diff = exit_diff(plan, ctx, "before_install", "after_uninstall")
print(json.dumps([[x["key"], x["class"], x["reason"]] for x in diff.leftovers]))
"""
    argv = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]
    try:
        done = subprocess.run(
            [*argv, sys.executable, "-c", script],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    finally:
        Path(f"/var/tmp/ckpt-nofan-{os.getpid()}").unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr[-2000:]
    warned = [line for line in done.stderr.splitlines() if "fanotify unavailable" in line]
    assert len(warned) == 1, done.stderr[-2000:]
    assert "fanotify_init: Operation not permitted (EPERM)" in warned[0]
    left = {key: (cls, why) for key, cls, why in json.loads(done.stdout.splitlines()[-1])}
    assert left[f"/var/tmp/ckpt-nofan-{os.getpid()}"][0] == "unexplained"
    from tasks.data.datasets import WRITE_GAPS
    from tasks.data.store import read_dataset

    plan = load_plan(path, check_cluster=False)
    gaps = read_dataset(WRITE_GAPS, data_dir=plan.data_dir, poc=plan.poc)
    assert gaps["reason"].str.startswith("fanotify unavailable").any()
