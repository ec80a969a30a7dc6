"""tasks.exit.writers.lineage against the real kernel's process-events connector: a writer
that has exited is still told (its executable, parent, ancestry), live processes are read
from /proc, stop is prompt, exited entries are forgotten after keep_exited_s."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from tasks.exit.writers.lineage import Lineage, ProcInfo, read_proc

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], timeout_s: float = 5.0) -> T:
    """Poll ``probe`` until it gives something truthy; events arrive asynchronously."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"nothing within {timeout_s} s")
        time.sleep(0.01)


def exited(lin: Lineage, pid: int) -> Callable[[], ProcInfo | None]:
    def probe() -> ProcInfo | None:
        info = lin.who(pid)
        return info if info is not None and info.exited else None

    return probe


def start(keep_exited_s: float = 600.0) -> Lineage:
    # The suite runs as root in the initial namespaces: an unavailable connector fails here.
    return Lineage(keep_exited_s=keep_exited_s).start()


@pytest.fixture
def lineage() -> Iterator[Lineage]:
    lin = start()
    yield lin
    lin.stop()


def test_exited_grandchild_is_still_told(lineage: Lineage) -> None:
    # sh (the child) forks a grandchild that execs sleep; sh waits for it, then both are gone.
    # The sleep is short, but longer than the reader's reaction to the exec (well under 1 ms
    # measured): a process that exits before its exec is read is reported with exe None.
    out = subprocess.run(
        ["/bin/sh", "-c", "/bin/sleep 0.05 & echo $!; wait"],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    )
    grandchild = int(out.stdout)
    assert not os.path.exists(f"/proc/{grandchild}")  # gone: /proc cannot tell any more

    info = wait_for(exited(lineage, grandchild))
    assert info.exe is not None and info.exe.endswith("sleep")
    assert info.comm == "sleep"
    assert info.cgroup is not None
    child = wait_for(exited(lineage, info.ppid or 0))
    assert child.exe is not None and "sleep" not in child.exe  # sh's own image
    assert child.ppid == os.getpid()

    chain = lineage.ancestry(grandchild)
    pids = [p.pid for p in chain]
    assert pids[:3] == [grandchild, child.pid, os.getpid()]
    assert len(pids) == len(set(pids))  # no loops
    top = chain[-1]
    assert top.pid == 1 or not top.ppid or lineage.who(top.ppid) is None
    assert lineage.seen > 0
    assert lineage.lost == 0


def test_who_reads_proc_for_a_live_process_not_seen_forking() -> None:
    lin = Lineage()  # not started: nothing seen, every answer comes from /proc
    me = lin.who(os.getpid())
    assert me is not None and not me.exited
    assert me.ppid == os.getppid()
    assert me.exe == os.readlink("/proc/self/exe").removesuffix(" (deleted)")
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        unified = [line[3:].strip() for line in fh if line.startswith("0::")]
    assert me.cgroup == (unified[0] if unified else None)
    with open("/proc/self/comm", encoding="utf-8") as fh:
        assert me.comm == fh.read().strip()
    assert lin.who(os.getpid()) is me  # remembered

    init = lin.who(1)
    assert init is not None and init.pid == 1
    assert lin.ancestry(1) == [init]

    with open("/proc/sys/kernel/pid_max", encoding="ascii") as fh:
        beyond = int(fh.read()) + 1
    assert lin.who(beyond) is None
    assert lin.ancestry(beyond) == []


def test_started_table_is_seeded_from_proc(lineage: Lineage) -> None:
    # A process that was there before start(): its entry matches /proc.
    assert lineage.who(os.getpid()) == read_proc(os.getpid())


def test_stop_is_prompt_and_idempotent() -> None:
    Lineage().stop()  # never started: nothing to do
    lin = start()
    began = time.monotonic()
    lin.stop()
    lin.stop()
    assert time.monotonic() - began < 2.0
    assert not any(t.name == "lineage-reader" for t in threading.enumerate())
    assert lin.who(os.getpid()) is not None  # lookups still answer, from the table


def test_exited_entries_are_pruned_after_keep_exited_s() -> None:
    lin = start(keep_exited_s=0.2)
    try:
        child = subprocess.Popen(["/bin/true"])
        child.wait(timeout=10)
        info = wait_for(exited(lin, child.pid))
        assert info.ppid == os.getpid()
        # The reader prunes on its own, at least once per keep_exited_s (or second).
        wait_for(lambda: lin.who(child.pid) is None)
        assert lin.who(os.getpid()) is not None  # the living stay
    finally:
        lin.stop()


def test_prune_forgets_only_old_exits(lineage: Lineage) -> None:
    child = subprocess.Popen(["/bin/true"])
    child.wait(timeout=10)
    wait_for(exited(lineage, child.pid))
    assert lineage.prune() == 0  # exited, but less than 600 s ago
    assert lineage.who(child.pid) is not None
    lineage.keep_exited_s = 0.0
    lineage.prune()
    assert lineage.who(child.pid) is None
    assert lineage.who(os.getpid()) is not None  # the living stay
