"""What runs inside a ckpt-poc Slurm job: one attempt of a workload copy.

`python -m tasks.engine.clusters.slurm.job SPEC.json`, started by `scripts/slurm-job`. The
spec says:

- ``mode: run`` — start the plan's argv as `unshare --pid --fork --kill-child setsid ARGV`
  (its own PID namespace, so a restore never collides with a PID; `--kill-child`, so
  that when Slurm kills the job's process group the workload dies with it even though it
  leads its own session). With ``checkpoint: true`` (the managed copy) take a CRIU dump
  every ``interval_s`` into ``ckpt_root``, a folder every attempt of the copy can reach.
- ``mode: restore`` — restore ``checkpoint`` with CRIU in the foreground (CRIU stays the
  workload's parent, so Slurm's kill still reaches it), then go on dumping every
  ``interval_s`` as the first attempt did.

Before its first event the job reads the node's fingerprint (``fingerprint: true``: the
rows then carry the node's, not the harness host's) and drops the node's page cache
(``page_cache: dropped``; ``cache_files``: what to drop where a global drop is refused), so
neither is in any clock. With ``dump_request: PATH`` (cold start's ready copy) the copy is
dumped once that file exists, and CRIU ends it; ``checkpoint_arm`` names the arm its dumps
are recorded under, when not the job's own. With ``ready_probe`` (cold start's url, tcp or
exec probe) the job asks it on the node once the copy runs and records `ready` or
`ready_failed` (within ``ready_timeout_s``).

The job exits with the workload's status, or fails with the exception that ended its
checkpoint thread. Its events (`job_started` first thing, then `workload_started`, the
checkpoint and restore events) are appended as JSON lines to ``events``, which the harness
reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.data.events import Ev
from tasks.engine.checkpointers.criu import Checkpoint, CriuCheckpointer, CriuError
from tasks.engine.checkpointers.criu_gpu import GpuCriuCheckpointer, gpu_checkpointer
from tasks.engine.checkpointers.periodic import PeriodicCheckpoints
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.process import WorkloadProcess
from tasks.engine.clusters.reaper import child_pids
from tasks.engine.clusters.slurm.notice import NoticeCheckpoint, restarts, resume_spec
from tasks.engine.interpreter import resolve_workload_argv, workload_env
from tasks.engine.page_cache import prepare_cache


def _ns_init(launcher: subprocess.Popen, timeout: float = 10) -> int:
    """The workload's host pid: `unshare --fork`'s one child."""
    deadline = time.monotonic() + timeout
    while not (kids := child_pids(launcher.pid)):
        if launcher.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the workload did not start (unshare exited {launcher.poll()})")
        time.sleep(0.002)
    return kids[0]


# How long a signalled job waits for its workload to be gone before it dies itself.
WORKLOAD_GONE_WAIT_S = 5.0


def _read_the_node(spec: dict[str, Any], recorder: EventRecorder) -> None:
    """Before `job_started` (so in no clock): the node's fingerprint, read here rather than
    on the harness's host, and the page cache dropped, when the spec asks."""
    trial, arm = spec["trial_id"], spec["arm"]
    if spec.get("fingerprint"):
        from tasks.data.fingerprint import collect_fingerprint

        recorder.record(trial, arm, Ev.NODE_FINGERPRINT, **collect_fingerprint())
    if spec.get("ready_probe"):
        import tasks.engine.ready  # noqa: F401  (loaded here: its import is in no clock)
    if spec.get("page_cache"):
        files = [Path(f) for f in spec.get("cache_files", [])]
        cache = prepare_cache(spec["page_cache"], files)
        recorder.record(
            trial, arm, Ev.PAGE_CACHE, state=cache.state, drop=cache.drop, files=cache.files
        )


def run(spec: dict[str, Any]) -> int:
    recorder = EventRecorder(None, jsonl=Path(spec["events"]))
    trial, arm, node = spec["trial_id"], spec["arm"], spec["node"]
    _read_the_node(spec, recorder)
    # The job holds its resources from here: the moment `started` marks for recovery.
    restart = restarts()
    recorder.record(
        trial, arm, Ev.JOB_STARTED, job_id=os.environ.get("SLURM_JOB_ID"), restarts=restart
    )
    if restart and spec.get("requeued"):
        spec = resume_spec(spec, recorder)  # a requeued attempt: restore, resume or rerun
    pidfds: list[int] = []  # once the workload runs: its launcher's and its own pidfd
    # A job with a notice (`--signal=B:USR1@N`): USR1 is Slurm's word of a coming kill.
    on_notice = NoticeCheckpoint(spec, recorder) if spec.get("notice") else None
    if on_notice is not None:
        signal.signal(
            signal.SIGUSR1, lambda signum, _f: on_notice.notice(signal.Signals(signum).name)
        )

    def signalled(signum: int, _frame: object) -> None:
        # Slurm's SIGTERM (scancel, time limit, a node set down) reaches the whole job at
        # once: record when it landed. The workload (its own session) dies with its
        # launcher, which Slurm kills once this process is gone; kill it here instead and
        # record `workload_exited` once it is gone: from then on nothing of this attempt
        # writes to the log (a node-down job leaves Slurm's queue before its node has
        # signalled it, so this record is the harness's only sign). Then die of the signal.
        name = signal.Signals(signum).name
        recorder.record(trial, arm, Ev.SIGNALLED, signal=name)
        if pidfds:
            launcher, workload = pidfds
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(launcher, signal.SIGKILL)
            if select.select([workload], [], [], WORKLOAD_GONE_WAIT_S)[0]:
                recorder.record(trial, arm, Ev.WORKLOAD_EXITED, signal=name)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, signalled)
    on_request = DumpOnRequest.if_asked(spec, recorder)
    log = Path(spec["log"])
    criu = _checkpointer(spec, recorder)
    started = _start(spec, criu, recorder)
    if isinstance(started, int):
        return started  # the restore could not run
    root, pid = started
    _ask_ready_in_job(spec, recorder, alive=lambda: root.poll() is None)
    # Readable once the process has exited. Gone already, or no pidfd: a signalled job
    # dies at once, and the harness waits for `workload_exited` in vain and reads on.
    with contextlib.suppress(OSError):
        pidfds[:] = [os.pidfd_open(root.pid), os.pidfd_open(pid)]
    periodic = None
    if criu is not None:
        proc = WorkloadProcess(node, arm, pid, log)
        # A dead checkpoint thread ends the attempt: its launcher (or foreground CRIU) is
        # killed, the job fails with the exception, and Slurm ends what is left of the job.
        periodic = PeriodicCheckpoints(
            criu, proc, float(spec["interval_s"]), on_failure=lambda _exc: root.kill()
        ).start()
        if on_notice is not None:
            on_notice.arm_for(criu, proc, periodic)
        if on_request is not None:
            on_request.arm_for(criu, proc)
    rc = root.wait()
    recorder.record(trial, arm, Ev.WORKLOAD_EXITED, rc=rc)
    if on_request is not None:
        on_request.wait_if_dumping()
    if on_notice is not None:
        on_notice.wait_for_the_kill()  # ended by its notice dump: the requeue ends the job
    if periodic is not None:
        periodic.stop()  # raises what ended the checkpoint thread, if anything did
    return rc


def _ask_ready_in_job(
    spec: dict[str, Any], recorder: EventRecorder, alive: Callable[[], bool]
) -> threading.Thread | None:
    """Cold start's ready probe (``ready_probe``: url, tcp or exec, filled in for this copy),
    asked here on the node, where a server's 127.0.0.1 and an exec probe's command are:
    `ready` when it first says so, else `ready_failed` with its last answer."""
    if not spec.get("ready_probe"):
        return None
    from tasks.data.plan_workload import ReadyProbe
    from tasks.engine.ready import poll_ready

    probe = ReadyProbe.model_validate(spec["ready_probe"])
    trial, arm = spec["trial_id"], spec["arm"]

    def ask() -> None:
        answer = poll_ready(probe, timeout=float(spec["ready_timeout_s"]), alive=alive)
        event = Ev.READY if answer.ready else Ev.READY_FAILED
        recorder.record_at(
            trial, arm, event, answer.t_mono_ns, probe=probe.describe(), answer=answer.last
        )

    thread = threading.Thread(target=ask, name="ready-probe", daemon=True)
    thread.start()
    return thread


def _checkpointer(
    spec: dict[str, Any], recorder: EventRecorder
) -> CriuCheckpointer | GpuCriuCheckpointer | None:
    """The copy's CRIU when the spec checkpoints it (the managed arm, a cold start's copy);
    for a GPU plan, with the toggle (its capability check runs here, on the node)."""
    if not spec.get("checkpoint"):
        return None
    # The checkpoint this attempt restores is never cleaned up as stale at start-up.
    protect = [Path(spec["restore_from"])] if spec["mode"] == "restore" else []
    criu = CriuCheckpointer(
        Path(spec["ckpt_root"]),
        int(spec["keep"]),
        recorder,
        spec["trial_id"],
        spec.get("checkpoint_arm", spec["arm"]),  # a cold start's native copy: dumped managed
        protect=protect,
    )
    return gpu_checkpointer(criu) if spec.get("gpu") else criu


class DumpOnRequest:
    """The harness's request (it creates the spec's ``dump_request`` file): dump the copy
    once and let CRIU end it, so the job ends with a complete checkpoint (cold start's ready
    copy). A file, not a signal: Slurm delivers a signal for the batch step to its whole
    process group, and `unshare`, which the copy's life hangs on (--kill-child), dies of it
    mid-dump. Watched from before the workload starts (a request may come as soon as the
    copy logs its first line); the dump runs once both the request and the copy are there."""

    POLL_S = 0.01

    def __init__(self, request: Path, recorder: EventRecorder, trial: str, arm: str) -> None:
        self._request = request
        self._recorder, self._trial, self._arm = recorder, trial, arm
        self._target: tuple[CriuCheckpointer | GpuCriuCheckpointer, WorkloadProcess] | None = None
        self._dumping, self._done = threading.Event(), threading.Event()
        threading.Thread(target=self._dump_when_asked, name="dump-on-request", daemon=True).start()

    @classmethod
    def if_asked(cls, spec: dict[str, Any], recorder: EventRecorder) -> DumpOnRequest | None:
        if not spec.get("dump_request"):
            return None
        arm = spec.get("checkpoint_arm", spec["arm"])
        return cls(Path(spec["dump_request"]), recorder, spec["trial_id"], arm)

    def arm_for(self, criu: CriuCheckpointer | GpuCriuCheckpointer, proc: WorkloadProcess) -> None:
        self._target = (criu, proc)

    def _dump_when_asked(self) -> None:
        while not self._request.exists() or self._target is None:
            time.sleep(self.POLL_S)
        self._recorder.record(self._trial, self._arm, Ev.DUMP_REQUESTED)
        criu, proc = self._target
        self._dumping.set()
        try:
            criu.dump(proc, leave_running=False)
        except CriuError as exc:
            reason = str(exc).splitlines()[0][:500]
            self._recorder.record(self._trial, self._arm, Ev.DUMP_FAILED, reason=reason)
        finally:
            self._done.set()

    def wait_if_dumping(self, timeout: float = 600) -> None:
        """The copy has exited: when its dump ended it, wait until that dump is complete
        (CRIU ends the copy a moment before the checkpoint's record is written)."""
        if self._dumping.is_set():
            self._done.wait(timeout)


def _start(
    spec: dict[str, Any],
    criu: CriuCheckpointer | GpuCriuCheckpointer | None,
    recorder: EventRecorder,
) -> tuple[subprocess.Popen, int] | int:
    """This attempt's workload (its root process, its pid): restored from the checkpoint the
    spec names, or launched; an exit status when the restore cannot run."""
    trial, arm = spec["trial_id"], spec["arm"]
    if spec["mode"] == "restore":
        assert criu is not None, "a restore job always checkpoints"
        point = Checkpoint.load(Path(spec["restore_from"]))
        if point is None:
            recorder.record(trial, arm, Ev.RESTORE_FAILED, reason="checkpoint is not complete")
            return 70
        try:
            return criu.restore_attached(point)
        except CriuError as exc:
            print(f"ckpt-poc: {exc}", file=sys.stderr)
            return 71
    workload = resolve_workload_argv(spec["argv"])
    argv = ["unshare", "--pid", "--fork", "--kill-child=SIGKILL", "setsid", *workload]
    root = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=workload_env())
    pid = _ns_init(root)
    recorder.record(trial, arm, Ev.WORKLOAD_STARTED, pid=pid)
    return root, pid


def main() -> int:
    return run(json.loads(Path(sys.argv[1]).read_text()))


if __name__ == "__main__":
    sys.exit(main())
