"""A harness killed with SIGKILL leaves nothing running and its record behind.

Each test runs a real harness in a subprocess (a side-by-side run, or a CRIU restore), kills
it with SIGKILL and looks at what is left: no process of the run alive a few seconds later
(launched copies, CRIU-restored copies, CRIU itself, the reaper), a process the run did not
start untouched, the run's events in its journal, and the checkpoint folders the killed run
left removed by the next run of the same root, never while a live run holds it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.engine.clusters.reaper import (
    SPAWN_ENV,
    RunReaper,
    _candidates,
    _carries_token,
    _stat_fields,
    _with_descendants,
    boot_ticks,
    descendants,
    kill_tree,
    pid_alive,
    start_ticks,
)
from tests.integration.test_orphans_killed_harness import (
    RESTORE_HARNESS,
    _train,
    end_harness,
    still_alive_after_kill,
    wait_until,
)
from tests.support.common import REPO

pytestmark = pytest.mark.criu


def test_a_harness_killed_before_its_child_execs_still_ends_the_child(tmp_path: Path) -> None:
    """A child forked but not yet exec'd reads as the harness: the reaper keeps looking
    while it lives, and ends it by its expected command line once it has exec'd."""
    run_dir = tmp_path / "run"
    stall_file = tmp_path / "forked.pid"
    stall_s = 1.5  # well inside the reaper's grace (REAPER_GRACE_S)
    harness = subprocess.Popen(
        [sys.executable, "-c", RESTORE_HARNESS, str(run_dir), *_train(tmp_path)],
        cwd=REPO,
        env={**os.environ, "STALL_BEFORE_EXEC": str(stall_file), "STALL_S": str(stall_s)},
    )
    try:
        wait_until(lambda: stall_file.exists() and stall_file.read_text() != "", 60, "the fork")
        forked = int(stall_file.read_text())
        assert pid_alive(forked)
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        time.sleep(stall_s)  # the child execs the launcher meanwhile, then is found
        left, pids_left, took = still_alive_after_kill(str(tmp_path), [forked])
        assert pids_left == [] and left == {}, f"left {took:.2f} s after the exec: {left}"
    finally:
        end_harness(harness, tmp_path)


def test_the_reaper_takes_only_its_own_spawn_of_a_command_line() -> None:
    """The same command line in another session, of another user, or started by another
    harness in this session (another spawn token) is never taken: only this spawn's."""
    not_before = boot_ticks()
    argv = ["sleep", "60", "0.25"]  # one command line, three times
    cmdline = b"sleep\x0060\x000.25\x00"
    token = f"\0{SPAWN_ENV}=12345.0\0".encode()
    ours = subprocess.Popen(argv, env={**os.environ, SPAWN_ENV: "12345.0"})
    same_session = subprocess.Popen(argv, env={**os.environ, SPAWN_ENV: "12345.01"})
    theirs = subprocess.Popen(argv, start_new_session=True)
    started = (ours, same_session, theirs)
    try:
        wait_until(
            lambda: all(Path(f"/proc/{p.pid}/cmdline").read_bytes() == cmdline for p in started),
            10,
            "all to exec",
        )
        found = _candidates(not_before, os.getsid(0), os.getuid())
        assert ours.pid in found and same_session.pid in found and theirs.pid not in found
        assert found[ours.pid].cmdline == cmdline
        assert ours.pid not in _candidates(not_before, os.getsid(0), os.getuid() + 1)
        assert _carries_token(ours.pid, token) and not _carries_token(same_session.pid, token)
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def test_spawn_refuses_to_leave_the_harness_session(tmp_path: Path) -> None:
    """A child in a session of its own could not be found by the reaper before its track."""
    reaper = RunReaper(tmp_path / "reaper.log")
    try:
        with pytest.raises(ValueError, match="session"):
            reaper.spawn(["true"], start_new_session=True)
        assert reaper.spawn(["true"]).wait() == 0
    finally:
        reaper.close()


def test_a_tree_is_stopped_before_it_is_walked() -> None:
    """The reaper stops each process before walking below it, so none forks a child between
    the walk and the kill (the launcher's child would leave the session and escape)."""
    root = subprocess.Popen(["sh", "-c", "sleep 60 & sh -c 'sleep 60 & wait' & wait"])
    try:
        wait_until(lambda: len(descendants(root.pid)) >= 3, 10, "the tree to start")
        victims: dict[int, int] = {}
        ticks = start_ticks(root.pid)
        assert ticks is not None
        _with_descendants(victims, root.pid, ticks)
        tree = {root.pid, *descendants(root.pid)}
        assert set(victims) == tree

        def states() -> set[str]:
            return {(_stat_fields(pid) or ["gone"])[0] for pid in tree}

        # SIGSTOP takes effect as each leaves the kernel: stopped within moments, all of them
        wait_until(lambda: states() == {"T"}, 10, "every process stopped")
        assert victims[root.pid] == ticks
        gone: dict[int, int] = {}
        _with_descendants(gone, root.pid, ticks + 1)  # another process's start time: untouched
        assert gone == {}
    finally:
        kill_tree(root.pid)
        root.wait()
