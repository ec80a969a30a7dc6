"""Probes see a change within 50 ms of it happening (median; a loaded machine may be late
once), and record it on the event clock."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import IO

import pytest

import tasks.engine.probes as probes
from tasks.data.plan import ReadyProbe, load_plan
from tasks.data.runctx import make_run_context
from tasks.engine.clock import EventRecorder
from tasks.engine.probes import LogProgressProbe, last_step_before
from tasks.engine.ready import wait_ready
from tests.support.common import REPO


def _recorder(tmp_path: Path) -> EventRecorder:
    plan = load_plan(REPO / "plans" / "demo.yaml").model_copy(update={"data_dir": str(tmp_path)})
    return EventRecorder(make_run_context(plan, REPO / "plans" / "demo.yaml"))


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux")
STEP_RE = r"^step=(\d+) "


def _inotify_fds() -> int:
    """This process's open inotify instances."""
    fds = Path("/proc/self/fd")
    n = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # the fd iterdir itself used, gone by now
            n += os.readlink(fd) == "anon_inode:inotify"
    return n


def _fds_on(path: Path) -> int:
    """This process's fds open on ``path``."""
    n = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            n += os.readlink(fd) == str(path)
    return n


def _latency_ms(probe: LogProgressProbe, step: int, written_ns: int) -> float:
    seen = probe.wait_for(lambda s: s.step == step, timeout=2)
    assert seen is not None, step
    return (seen.t_mono_ns - written_ns) / 1e6


@pytest.mark.parametrize("watch", [True, False], ids=["watch", "poll"])
def test_progress_probe_latency_and_partial_lines(tmp_path: Path, watch: bool) -> None:
    recorder = _recorder(tmp_path)
    log = tmp_path / "w.log"
    log.write_text("")
    probe = LogProgressProbe(log, STEP_RE, recorder, "t", "managed", watch=watch).start()
    latencies = []
    try:
        with open(log, "a") as fh:
            for step in range(1, 21):
                fh.write(f"noise step={step + 100} \nstep={step} loss=0.5")  # no newline yet
                fh.flush()
                time.sleep(0.02)
                written = time.monotonic_ns()
                fh.write("\n")
                fh.flush()
                seen = probe.wait_for(lambda s, n=step: s.step == n, timeout=2)
                assert seen is not None, step
                latencies.append((seen.t_mono_ns - written) / 1e6)
    finally:
        probe.stop()
    # Typically a few ms; one late wake-up of a loaded 2-core machine is not a regression
    # (a probe that missed the line would wait for its 250 ms safety poll or time out).
    assert statistics.median(latencies) < 50 and max(latencies) < 200, latencies
    # Only whole lines count, and only lines the regex anchors on.
    assert [e.detail["step"] for e in recorder.events(event="progress")] == list(range(1, 21))
    assert last_step_before(log, len("noise step=101 \nstep=1 loss=0.5\n"), r"^step=(\d+) ") == 1


@linux_only
def test_probe_watches_local_log_with_inotify(tmp_path: Path) -> None:
    probe = LogProgressProbe(tmp_path / "w.log", STEP_RE, _recorder(tmp_path), "t", "managed")
    assert probe.mode == "inotify", probe.mode_reason
    forced = LogProgressProbe(
        tmp_path / "w.log", STEP_RE, _recorder(tmp_path), "t", "m", watch=False
    )
    assert (forced.mode, forced.mode_reason) == ("poll", "watch=False")


@linux_only
def test_inotify_probe_sleeps_while_log_is_idle(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("step=1 \n")
    probe = LogProgressProbe(log, STEP_RE, _recorder(tmp_path), "t", "managed", safety_s=0.25)
    probe.start()
    try:
        assert probe.wait_for(lambda s: s.step == 1, timeout=2)
        time.sleep(1.0)
        polls = probe.reads  # one per wake-up
        with open(log, "a") as fh:
            fh.write("step=2 \n")
        written = time.monotonic_ns()
        assert _latency_ms(probe, 2, written) < 50
    finally:
        probe.stop()
    assert probe.mode == "inotify"
    assert 2 <= polls <= 6, polls  # the first read and a 250 ms safety poll, not 100 10-ms polls


def _append_step(fh: IO[str], step: int) -> tuple[int, int]:
    """Write one step line; the monotonic ns just before and just after the write."""
    before = time.monotonic_ns()
    fh.write(f"step={step} \n")
    fh.flush()
    return before, time.monotonic_ns()


MTIME_EARLY_NS = 20_000_000  # a coarse mtime lags the write by up to a jiffy (<= 10 ms)


@linux_only
def test_watched_probe_holds_reads_and_times_steps_by_their_write(tmp_path: Path) -> None:
    """A step read less than ``hold_s`` after the last one waits for the hold; its time is
    still its write's (the log's mtime), a fresh read (``latest``) or ``stop`` gets it at once."""
    recorder = _recorder(tmp_path)
    log = tmp_path / "w.log"
    log.write_text("")
    probe = LogProgressProbe(log, STEP_RE, recorder, "t", "managed", hold_s=30).start()
    try:
        with open(log, "a") as fh:
            _append_step(fh, 1)
            assert probe.wait_for(lambda s: s.step == 1, timeout=5)  # after quiet: at once
            w2 = _append_step(fh, 2)
            # Held: a probe reading each line as it comes would see it within ms.
            assert probe.wait_for(lambda s: s.step >= 2, timeout=0.5) is None
            fresh = probe.latest()  # what a fault or a dump reads: the log up to now
            assert fresh is not None and fresh.step == 2
            w3 = _append_step(fh, 3)
        assert probe.wait_for(lambda s: s.step >= 3, timeout=0.3) is None
        t0 = time.monotonic()
        probe.stop()  # cuts the 30 s hold short and reads what it left unread
        assert time.monotonic() - t0 < 2
    finally:
        probe.stop()
    assert probe.mode == "inotify"
    seen = {s.step: s.t_mono_ns for s in probe.seen}
    assert list(seen) == [1, 2, 3]
    # Timed by the write, not by the read 0.5 s (step 2) or 0.3 s (step 3) later.
    for step, (before, after) in ((2, w2), (3, w3)):
        assert before - MTIME_EARLY_NS <= seen[step] <= after, (step, seen[step] - before)
    events = recorder.events(event="progress")
    assert [e.detail["step"] for e in events] == [1, 2, 3]
    assert [e.t_mono_ns for e in events] == list(seen.values())
    assert events[0].detail == {"step": 1, "timing": "mtime", "hold_ms": 30_000}
    # The wall time moves back with the monotonic one (recorded at the read, dated earlier).
    gap = events[2].t_wall - events[1].t_wall
    assert abs(gap.total_seconds() - (seen[3] - seen[2]) / 1e9) < 0.001


@linux_only
def test_watched_probe_reads_a_fast_log_once_per_hold(tmp_path: Path) -> None:
    """100 lines at ~100/s: a read (and at most two wake-ups) per ``hold_s`` of them, not
    one per line, each read's step timed between its write and the next line's."""
    hold_s, n = 0.1, 100
    recorder = _recorder(tmp_path)
    log = tmp_path / "w.log"
    log.write_text("")
    probe = LogProgressProbe(log, STEP_RE, recorder, "t", "managed", hold_s=hold_s).start()
    written: dict[int, tuple[int, int]] = {}
    try:
        with open(log, "a") as fh:
            for step in range(1, n + 1):
                written[step] = _append_step(fh, step)
                time.sleep(0.01)
        last = probe.wait_for(lambda s: s.step == n, timeout=10)
    finally:
        probe.stop()
    assert last is not None
    elapsed_s = (written[n][1] - written[1][0]) / 1e9
    seen = probe.seen
    # Reads that found a step are hold_s apart but for the first (after quiet) and the one
    # that ends the last hold; a probe reading line by line makes ~n of them.
    assert len(seen) <= elapsed_s / hold_s + 3, (len(seen), elapsed_s)
    assert probe.wakeups <= 2 * len(seen) + 4, (probe.wakeups, len(seen))
    steps = [s.step for s in seen]
    assert steps == sorted(steps) and steps[-1] == n
    for s in seen:
        before = written[s.step][0]
        # Its write's time, not the read's (up to hold_s later): before the next line.
        until = written[s.step + 1][0] if s.step < n else written[n][1]
        assert before - MTIME_EARLY_NS <= s.t_mono_ns <= until, (s.step, s.t_mono_ns - before)


def test_polled_probe_times_steps_by_its_read(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path)
    log = tmp_path / "w.log"
    log.write_text("step=1 \n")
    probe = LogProgressProbe(log, STEP_RE, recorder, "t", "managed", watch=False).start()
    try:
        assert probe.wait_for(lambda s: s.step == 1, timeout=5)
    finally:
        probe.stop()
    assert recorder.events(event="progress")[0].detail == {
        "step": 1,
        "timing": "read",
        "hold_ms": 0.0,
    }


@pytest.mark.parametrize("watch", [True, False], ids=["watch", "poll"])
def test_probe_sees_log_created_after_start(tmp_path: Path, watch: bool) -> None:
    recorder = _recorder(tmp_path)
    log = tmp_path / "later" / "w.log"  # neither the log nor its directory exist yet
    probe = LogProgressProbe(log, STEP_RE, recorder, "t", "managed", watch=watch).start()
    try:
        time.sleep(0.1)
        log.parent.mkdir()
        time.sleep(0.1)  # the probe now watches the directory, not yet the log
        written = time.monotonic_ns()
        log.write_text("step=1 \n")
        first = _latency_ms(probe, 1, written)
        with open(log, "a") as fh:
            fh.write("step=2 \n")
        written = time.monotonic_ns()
        second = _latency_ms(probe, 2, written)
    finally:
        probe.stop()
    assert probe.mode == ("inotify" if watch and sys.platform.startswith("linux") else "poll")
    # Seen on its own, without waiting for a later write; well under the 2 s timeout even
    # on a loaded machine (usually a few ms).
    assert first < 200 and second < 200, (first, second)
    assert [e.detail["step"] for e in recorder.events(event="progress")] == [1, 2]


@linux_only
def test_inotify_probe_follows_a_replaced_log(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("step=1 \n")
    probe = LogProgressProbe(log, STEP_RE, _recorder(tmp_path), "t", "managed").start()
    try:
        assert probe.wait_for(lambda s: s.step == 1, timeout=2)
        new = tmp_path / "w.log.new"
        new.write_text("step=1 \nstep=2 \n")
        written = time.monotonic_ns()
        os.replace(new, log)  # a new file under the log's name: the old watch is stale
        replaced = _latency_ms(probe, 2, written)
        with open(log, "a") as fh:
            fh.write("step=3 \n")
        written = time.monotonic_ns()
        appended = _latency_ms(probe, 3, written)
    finally:
        probe.stop()
    assert probe.mode == "inotify"
    assert replaced < 50 and appended < 50, (replaced, appended)


@pytest.mark.parametrize("watch", [True, False], ids=["watch", "poll"])
def test_stop_returns_promptly_and_closes_inotify(tmp_path: Path, watch: bool) -> None:
    log = tmp_path / "w.log"
    log.write_text("")
    before = _inotify_fds()
    # A safety poll far longer than the bound: only the wake-up can make stop() prompt.
    probe = LogProgressProbe(
        log, STEP_RE, _recorder(tmp_path), "t", "managed", watch=watch, safety_s=30
    ).start()
    time.sleep(0.1)  # the thread is asleep
    during, log_fds = _inotify_fds(), _fds_on(log)
    t0 = time.monotonic()
    probe.stop()
    took = time.monotonic() - t0
    assert took < 0.5, took
    assert probe._thread is not None and not probe._thread.is_alive()
    assert during == before + (probe.mode == "inotify")
    assert log_fds == (probe.mode == "inotify")  # watched, it keeps the log open between reads
    assert _inotify_fds() == before
    assert _fds_on(log) == 0  # the log is not held open either


def test_network_filesystem_falls_back_to_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "50 27 0:50 / /shared\\040data rw,relatime shared:7 - nfs4 srv:/export rw,vers=4.2\n"
        "51 50 0:51 / /shared\\040data/scratch rw - lustre 10.0.0.1@tcp:/fs rw\n"
        "52 27 0:52 / /home/u/remote rw - fuse.sshfs u@host: rw\n"
    )
    fstype = probes.mount_fstype
    assert fstype(Path("/shared data/run/w.log"), str(mountinfo)) == "nfs4"
    assert fstype(Path("/shared data/scratch/x/w.log"), str(mountinfo)) == "lustre"
    assert fstype(Path("/shared database/w.log"), str(mountinfo)) == "ext4"
    assert fstype(Path("/home/u/remote/w.log"), str(mountinfo)) == "fuse.sshfs"
    assert probes.is_network_fs("fuse.sshfs") and probes.is_network_fs("nfs")
    assert not probes.is_network_fs("ext4") and not probes.is_network_fs("tmpfs")

    monkeypatch.setattr(probes, "mount_fstype", lambda path: "nfs4")
    recorder = _recorder(tmp_path)
    log = tmp_path / "w.log"
    probe = LogProgressProbe(log, STEP_RE, recorder, "t", "managed").start()
    try:
        assert probe.mode == "poll" and "nfs4" in probe.mode_reason
        written = time.monotonic_ns()
        log.write_text("step=1 \n")
        assert _latency_ms(probe, 1, written) < 50
    finally:
        probe.stop()


@linux_only
def test_probe_polls_when_inotify_cannot_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse() -> None:
        raise OSError(24, "Too many open files")  # EMFILE: inotify instances used up

    monkeypatch.setattr(probes, "_Inotify", refuse)
    log = tmp_path / "w.log"
    probe = LogProgressProbe(log, STEP_RE, _recorder(tmp_path), "t", "managed")
    assert probe.mode == "inotify"
    probe.start()
    try:
        assert probe.mode == "poll" and "Too many open files" in probe.mode_reason
        written = time.monotonic_ns()
        log.write_text("step=1 \n")
        assert _latency_ms(probe, 1, written) < 50
    finally:
        probe.stop()


def test_ready_probe_latency(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path)
    ready_at: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = bool(ready_at)
            self.send_response(200 if ok else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        threading.Timer(0.3, lambda: ready_at.append(time.monotonic_ns())).start()
        url = f"http://127.0.0.1:{server.server_port}/ready"
        assert wait_ready(ReadyProbe(url=url), recorder, "t", "unmanaged", timeout=5).ready
    finally:
        server.shutdown()
        server.server_close()
    (event,) = recorder.events(event="ready")
    assert 0 <= (event.t_mono_ns - ready_at[0]) / 1e6 < 50
