"""Ready probes: when a server is ready to serve, asked as Kubernetes asks it (an HTTP URL
answering 200, a TCP port accepting a connection, a command exiting 0) or read from a line
of its log. The comparisons, the preflight, side by side and the compatibility stage all
wait through ``poll_ready``; cold start's clocks end on its answer (tasks/experiments/
timed_runs.py), and a Slurm job's wrapper asks it on the node (tasks/engine/clusters/slurm/
job.py)."""

from __future__ import annotations

import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tasks.data.events import Ev
from tasks.data.plan_workload import ReadyProbe
from tasks.engine.clock import EventRecorder
from tasks.engine.interpreter import resolve_workload_argv, workload_env
from tasks.engine.probes import POLL_S, compile_progress

# One ask of a ready probe gets at most this long (an HTTP request, a connect, an exec).
ASK_TIMEOUT_S = 5.0
EXEC_SAID = 200  # characters of an exec probe's output in its answer


@dataclass(frozen=True)
class ReadyAnswer:
    """How a wait for a ready probe ended: ``ready`` at ``t_mono_ns`` (when the probe first
    answered), or not, with the probe's ``last`` answer (said in the failure)."""

    ready: bool
    t_mono_ns: int
    last: str


def ready_line_regex(regex: str) -> str:
    """A log ready probe's regex as a progress probe follows it: its matching line counts as
    step 0 (an empty first group: the line has no step)."""
    return f"(?P<ready_line>)(?:{regex})"


def _ask_url(url: str) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=ASK_TIMEOUT_S) as resp:
            return resp.status == 200, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        return False, str(getattr(exc, "reason", exc))


def _ask_tcp(where: str) -> tuple[bool, str]:
    host, _, port = where.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        with socket.create_connection((host, int(port)), timeout=ASK_TIMEOUT_S):
            return True, f"connected to {host}:{port}"
    except OSError as exc:
        return False, f"{host}:{port}: {exc.strerror or exc}"


def _ask_exec(argv: list[str]) -> tuple[bool, str]:
    try:
        done = subprocess.run(
            resolve_workload_argv(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=ASK_TIMEOUT_S,
            env=workload_env(),
        )
    except subprocess.TimeoutExpired:
        return False, f"no exit within {ASK_TIMEOUT_S:g} s"
    except OSError as exc:
        return False, f"cannot run {argv[0]}: {exc.strerror or exc}"
    said = (done.stdout + done.stderr).decode("utf-8", "replace").strip()[-EXEC_SAID:]
    return done.returncode == 0, f"exit {done.returncode}" + (f": {said}" if said else "")


def _ask_log(pattern: re.Pattern[str], log: Path | None, after_offset: int) -> tuple[bool, str]:
    if log is None:
        return False, "no log to read"
    try:
        with open(log, "rb") as fh:
            fh.seek(max(after_offset, 0))
            data = fh.read()
    except OSError as exc:
        return False, f"{log}: {exc.strerror or exc}"
    complete = data[: max(data.rfind(b"\n"), data.rfind(b"\r")) + 1].decode("utf-8", "replace")
    if pattern.search(complete):
        return True, "the line is in the log"
    return False, f"no line matching {pattern.pattern!r} in {len(data)} new bytes of the log"


def ask_ready(
    probe: ReadyProbe, log: Path | None = None, after_offset: int = 0
) -> tuple[bool, str]:
    """One ask of a (filled) ready probe: whether it says ready, and its answer in words."""
    if probe.url is not None:
        return _ask_url(probe.url)
    if probe.tcp is not None:
        return _ask_tcp(probe.tcp)
    if probe.exec is not None:
        return _ask_exec(probe.exec)
    return _ask_log(compile_progress(probe.log or ""), log, after_offset)


def poll_ready(
    probe: ReadyProbe,
    *,
    timeout: float,
    poll_s: float = POLL_S,
    alive: Callable[[], bool] = lambda: True,
    log: Path | None = None,
    after_offset: int = 0,
) -> ReadyAnswer:
    """Ask ``probe`` (its placeholders filled) until it says ready, the copy dies or
    ``timeout`` passes. A ready answer is timed when it came back (a url or an exec probe's
    time includes its own request, which is small against a start)."""
    deadline = time.monotonic() + timeout
    last = "never asked: the copy was not alive"
    while time.monotonic() < deadline and alive():
        ok, last = ask_ready(probe, log, after_offset)
        if ok:
            return ReadyAnswer(True, time.monotonic_ns(), last)
        time.sleep(poll_s)
    if not alive():
        last += " (the copy had exited)"
    return ReadyAnswer(False, time.monotonic_ns(), last)


def wait_ready(
    probe: ReadyProbe,
    recorder: EventRecorder,
    trial_id: str,
    arm: str,
    *,
    timeout: float,
    poll_s: float = POLL_S,
    alive: Callable[[], bool] = lambda: True,
    log: Path | None = None,
    after_offset: int = 0,
) -> ReadyAnswer:
    """poll_ready, recording `ready` (at the answer's time) when the probe says so."""
    answer = poll_ready(
        probe, timeout=timeout, poll_s=poll_s, alive=alive, log=log, after_offset=after_offset
    )
    if answer.ready:
        recorder.record_at(
            trial_id, arm, Ev.READY, answer.t_mono_ns, probe=probe.describe(), answer=answer.last
        )
    return answer
