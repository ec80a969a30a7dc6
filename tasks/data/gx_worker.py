"""Great Expectations in a worker process, warmed while the caller parses its input.

Importing GX and building its context takes seconds of pure Python. Done in a thread of the
parsing process it holds the GIL against the parse (measured: the parse took 2.7x as long and
the two together longer than one after the other), so a stage that knows it will gate a large
table starts this worker first: it imports GX on another core and then runs the suites on the
samples it is sent (tasks.data.gates). Checks come back exactly as in the calling process;
a worker that fails or dies is dropped and the caller validates in process, so the gate runs
either way.

Messages are pickles over the worker's stdin/stdout, between two processes of the same code.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

log = logging.getLogger(__name__)
_REPO = Path(__file__).resolve().parents[2]  # the directory holding the tasks package
_CLOSE_WAIT_S = 10.0


class GxWorker:
    """One worker process: ``checks`` sends it a sample and returns its CheckResults."""

    def __init__(self) -> None:
        path = os.pathsep.join(p for p in (str(_REPO), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path}
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", "tasks.data.gx_serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._ready = False
        self._lock = threading.Lock()

    def checks(self, gate: str, dataset: str, sample: pa.Table, total: int) -> list[Any] | None:
        """The suite's checks on ``sample`` (``total`` rows in all), or None when the worker
        cannot answer (the caller then validates in process)."""
        with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None or proc.stdout is None:
                return None
            try:
                if not self._ready:  # waits here for GX's import, if it is not done yet
                    self._ready = receive(proc.stdout) == "ready"
                send(proc.stdin, (gate, dataset, sample, total))
                reply = receive(proc.stdout)
            except (OSError, EOFError, pickle.UnpicklingError) as exc:
                log.warning("GX worker lost (%s): validating in process", exc)
                reply = None
        if not isinstance(reply, list):
            if reply is not None:
                log.warning("GX worker failed (%s): validating in process", reply)
            self.close()
            return None
        return reply

    def close(self, wait: bool = True) -> None:
        """End the worker: stdin closed, it exits; killed if it does not within 10 s.
        ``wait=False`` leaves the waiting to a thread (GX's interpreter takes a second to
        shut down, which the caller need not sit through)."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):  # already gone: the wait below reaps it
                proc.stdin.close()
        if wait:
            _reap(proc)
        else:
            threading.Thread(target=_reap, args=(proc,), name="gx-worker-reap").start()


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=_CLOSE_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


def send(stream: IO[bytes], obj: Any) -> None:
    pickle.dump(obj, stream, protocol=pickle.HIGHEST_PROTOCOL)
    stream.flush()


def receive(stream: IO[bytes]) -> Any:
    return pickle.load(stream)


_WORKERS: list[GxWorker] = []
atexit.register(lambda: [w.close() for w in list(_WORKERS)])


def start() -> GxWorker:
    worker = GxWorker()
    _WORKERS.append(worker)
    return worker


def stop(worker: GxWorker) -> None:
    """End the worker without waiting for it to exit (a non-daemon thread reaps it, so the
    process waits for that at exit and leaves no orphan)."""
    worker.close(wait=False)
    if worker in _WORKERS:
        _WORKERS.remove(worker)
