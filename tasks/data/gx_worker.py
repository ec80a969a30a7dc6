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
            [sys.executable, "-m", "tasks.data.gx_worker"],
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
                    self._ready = _receive(proc.stdout) == "ready"
                _send(proc.stdin, (gate, dataset, sample, total))
                reply = _receive(proc.stdout)
            except (OSError, EOFError, pickle.UnpicklingError) as exc:
                log.warning("GX worker lost (%s): validating in process", exc)
                reply = None
        if not isinstance(reply, list):
            if reply is not None:
                log.warning("GX worker failed (%s): validating in process", reply)
            self.close()
            return None
        return reply

    def close(self) -> None:
        """End the worker: stdin closed, it exits; killed if it does not within 10 s."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=_CLOSE_WAIT_S)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()


def _send(stream: IO[bytes], obj: Any) -> None:
    pickle.dump(obj, stream, protocol=pickle.HIGHEST_PROTOCOL)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    return pickle.load(stream)


_WORKERS: list[GxWorker] = []
atexit.register(lambda: [w.close() for w in list(_WORKERS)])


def start() -> GxWorker:
    worker = GxWorker()
    _WORKERS.append(worker)
    return worker


def stop(worker: GxWorker) -> None:
    worker.close()
    if worker in _WORKERS:
        _WORKERS.remove(worker)


def main() -> None:
    """The worker's loop: build the context, say ready, answer samples until stdin ends."""
    from tasks.data import gates
    from tasks.data.datasets import DATASETS

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything GX prints must not land in the replies
    gates._context()
    _send(out, "ready")
    while True:
        try:
            gate, dataset, sample, total = _receive(inp)
        except EOFError:
            return
        try:
            reply: Any = gates._gx_checks(gate, DATASETS[dataset], sample.to_pandas(), total)
        except Exception as exc:  # reported to the caller, which validates in process
            reply = f"{type(exc).__name__}: {exc}"
        _send(out, reply)


if __name__ == "__main__":
    main()
