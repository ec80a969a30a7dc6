"""The managed arm's checkpoints on a timer (CRIU dumps left running)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from tasks.data.events import Ev
from tasks.engine.checkpointers.criu import CriuCheckpointer, CriuError
from tasks.engine.clusters.process import WorkloadProcess


class PeriodicCheckpoints:
    """Dump every ``interval_s`` on a schedule; a tick that comes while a dump still runs is
    recorded as `checkpoint_skipped`, never queued behind it.

    A failed dump (CriuError) is recorded in ``errors`` and the schedule goes on. Anything
    else that ends the thread is a bug or a bad setting: it is kept in ``failure``, recorded
    as `thread_failed`, and raised by ``check()`` or ``stop()``, so the run fails with it
    instead of going on with no checkpoints."""

    def __init__(
        self,
        checkpointer: CriuCheckpointer,
        proc: WorkloadProcess,
        interval_s: float,
        on_failure: Callable[[BaseException], object] | None = None,
    ) -> None:
        self.checkpointer, self.proc, self.interval_s = checkpointer, proc, interval_s
        self._on_failure = on_failure  # for a caller blocked elsewhere (a Slurm job's wait)
        self.errors: list[CriuError] = []
        self.failure: BaseException | None = None
        self._raised = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="checkpoints", daemon=True)

    def start(self) -> PeriodicCheckpoints:
        self._thread.start()
        return self

    def check(self) -> None:
        """Raise the exception that ended the thread, once (a caller's cleanup that calls
        ``stop()`` again then still runs to its end)."""
        if self.failure is not None and not self._raised:
            self._raised = True
            raise self.failure

    def halt(self) -> None:
        """No further tick, without waiting for a dump in flight (a notice's dump queues
        behind it on the checkpointer's lock)."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        self.check()

    def _run(self) -> None:
        try:
            self._dump_on_schedule()
        except BaseException as exc:
            self.failure = exc
            with contextlib.suppress(Exception):  # the failure is kept even if this fails
                self.checkpointer.record(
                    Ev.THREAD_FAILED, thread=self._thread.name, error=repr(exc)[:2000]
                )
            if self._on_failure is not None:
                self._on_failure(exc)

    def _dump_on_schedule(self) -> None:
        origin = time.monotonic()
        tick = 1
        while not self._stop.wait(max(0.0, origin + tick * self.interval_s - time.monotonic())):
            if not self.proc.alive():
                return
            try:
                self.checkpointer.dump(self.proc)
            except CriuError as exc:
                self.errors.append(exc)
            # Ticks that fell due while that dump ran are skipped, and recorded as such.
            due = int((time.monotonic() - origin) // self.interval_s)
            if due > tick:
                self.checkpointer.record(
                    Ev.CHECKPOINT_SKIPPED,
                    ticks=due - tick,
                    reason="previous dump still running",
                )
            tick = due + 1
