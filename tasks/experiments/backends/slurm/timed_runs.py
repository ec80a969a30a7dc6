"""Overhead and cold start on Slurm: every timed run a batch job pinned to the plan's node.

The jobs run the one wrapper every ckpt-poc job runs (tasks/engine/clusters/slurm/job.py), with the
node to itself (`--exclusive`): nothing else's load falls on one arm. The harness follows
the copy's log on the shared folder with the same progress probe as locally, so both
backends time the same span on the same kind of clock; the scheduler's queueing, the job's
start-up and the wrapper stay outside it.

- Overhead: one job per run; the managed arm's job is opted in as recovery's is (the
  wrapper dumps it every ``checkpointer.interval_s``) in the ``checkpointing`` variant, and
  runs as the same wrapper without dumps in ``steady``. Each job reads the node's
  fingerprint itself; the rows carry that, not the harness host's.
- Cold start: native = the job's own first moment on the node (`job_started`, recorded by
  its wrapper) → ready; the harness then asks that job (a request file beside the copy's
  log, on the shared folder) to dump the ready copy, CRIU ends it, and a second job on the
  node restores it: restore_start → ready. Both jobs drop the node's page cache first where
  the node permits it (before their first event: the drop is in no clock) and say so on
  their row.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.errors import CkptPocError
from tasks.data.events import Ev
from tasks.data.fingerprint import FINGERPRINT_COLUMNS, Fingerprint
from tasks.data.plan import Plan, ReadyProbe
from tasks.data.row_types import ColdStartRow, OverheadRow, PageCacheColumns
from tasks.data.runctx import RunContext
from tasks.engine.checkpointers.criu import CriuCheckpointer, CriuError
from tasks.engine.clock import Event, EventRecorder, span_s
from tasks.engine.clusters.slurm.cluster import (
    ACTIVE_STATES,
    JobNeverStarted,
    SlurmCluster,
    SlurmJob,
)
from tasks.engine.clusters.slurm.spec import copy_spec, wait_job_event
from tasks.engine.paths import checkpoint_folder, run_folder
from tasks.engine.preflight import log_tail
from tasks.engine.prepared import (
    copy_port,
    workload_argv,
    workload_prepared,
    workload_ready_probe,
)
from tasks.engine.probes import LogProgressProbe
from tasks.experiments.timed_runs import (
    RunFailed,
    StartFailed,
    cold_start_row,
    cold_start_trial,
    fail_starts,
    fill_progress_span,
    overhead_row,
    progress_regex,
    raw_read_numbers,
    restored_numbers,
    timed_by_log,
    wait_for_ready,
)
from tasks.experiments.trials import LOG_TAIL

OVERHEAD_INCLUDES = "the progress span of one whole run (a Slurm job, the node exclusive)"
COLD_START_INCLUDES = {
    UNMANAGED: "the job's first moment on the node (its wrapper's job_started), process "
    "start, imports and initialisation up to ready; queueing and the wrapper's own start "
    "are outside",
    MANAGED: "criu restore of the ready copy in a new job on the node, then up to ready; "
    "queueing and the wrapper's own start are outside",
}
# How long after its end (or the start's timeout) a job may still append its ready answer.
READY_GRACE_S = 5.0
# A cold start's copy dumps only when asked: its periodic interval is past any run.
NO_PERIODIC_S = 10 * 24 * 3600.0


def node_fingerprint(rec: EventRecorder, trial: str, arm: str) -> Fingerprint:
    """The fingerprint the job read on its node (empty: it read none)."""
    seen = rec.events(trial, arm, Ev.NODE_FINGERPRINT)
    if not seen:
        return {}
    detail = seen[-1].detail
    return cast(Fingerprint, {k: detail[k] for k in FINGERPRINT_COLUMNS if k in detail})


def _page_cache(rec: EventRecorder, trial: str, arm: str) -> PageCacheColumns:
    """The page cache the job left before its first event (none seen: not_allowed)."""
    seen = rec.events(trial, arm, Ev.PAGE_CACHE)
    if not seen:
        return {"page_cache": "not_allowed", "page_cache_drop": None}
    return {"page_cache": seen[-1].detail["state"], "page_cache_drop": seen[-1].detail.get("drop")}


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _alive(cluster: SlurmCluster, job: SlurmJob) -> Callable[[], bool]:
    return lambda: cluster.observe(job)[0] in ACTIVE_STATES


def _wait_ready(
    ready: ReadyProbe | None,
    probe: LogProgressProbe,
    rec: EventRecorder,
    events: Path,
    trial: str,
    arm: str,
    *,
    after_offset: int,
    timeout_s: float,
    alive: Callable[[], bool],
    who: str,
    restored: Event | None = None,
) -> Event:
    """The copy's `ready`: a log line the harness reads on the shared folder (a restored
    copy's: its restore, wait_for_ready), else what the job's own ask of the ready probe
    recorded (`ready`, or `ready_failed` with the probe's last answer); a job gone without
    either fails the start."""
    if timed_by_log(ready):
        return wait_for_ready(
            ready, probe, rec, trial, arm, after_offset=after_offset,
            timeout_s=timeout_s, alive=alive, who=who, restored=restored,
        )  # fmt: skip
    assert ready is not None
    names = (Ev.READY, Ev.READY_FAILED)
    deadline = time.monotonic() + timeout_s + READY_GRACE_S
    while (answer := wait_job_event(rec, events, trial, arm, names, None, 0.5)) is None:
        if time.monotonic() > deadline or not alive():
            answer = wait_job_event(rec, events, trial, arm, names, None, READY_GRACE_S)
            break
    if answer is None:
        raise StartFailed(f"the job never said what its ready probe answered ({who})")
    if answer.event == Ev.READY_FAILED:
        raise StartFailed(
            f"its ready probe ({ready.describe()}) never said ready ({who}); "
            f"its last answer: {answer.detail.get('answer')}"
        )
    return answer


def _wait_ended(cluster: SlurmCluster, job: SlurmJob, timeout_s: float) -> None:
    if cluster.wait_until(job, lambda s: s not in ACTIVE_STATES, timeout_s) is None:
        raise RunFailed(f"job {job.job_id} did not end within {timeout_s:.0f} s")


def overhead_run_on_slurm(
    plan: Plan,
    ctx: RunContext,
    cluster: SlurmCluster,
    rec: EventRecorder,
    variant: str,
    pair: int,
    arm: str,
    timeout_s: float,
) -> OverheadRow:
    """One whole run as a job; its row (failed with a reason). A job that never starts
    raises JobNeverStarted: the stage ends with Slurm's reason."""
    node = plan.cluster.nodes[0]
    row = overhead_row(plan, variant, pair, arm, node, OVERHEAD_INCLUDES)
    trial = row["trial_id"]
    copy_dir = run_folder(ctx) / f"overhead-{trial}-{arm}"  # fresh: nothing to resume
    copy_dir.mkdir(parents=True, exist_ok=True)
    log, events = copy_dir / "workload.log", copy_dir / "job-events.jsonl"
    dumps = arm == MANAGED and variant == "checkpointing"
    probe: LogProgressProbe | None = None
    try:
        rec.record(trial, arm, Ev.LAUNCH, node=node)
        argv = workload_argv(plan, copy_dir)
        spec = copy_spec(
            plan, trial, arm, copy_dir, checkpoint=dumps, mode="run", argv=argv, fingerprint=True
        )
        gpus = plan.workload.gpus
        job = cluster.submit(node, arm, spec, name=trial, log=log, gpus=gpus, exclusive=True)
        row["job_id"] = job.job_id
        cluster.wait_started(job, timeout_s)
        probe = LogProgressProbe(log, plan.workload.progress_probe.log_regex, rec, trial, arm)
        probe.start()
        _wait_ended(cluster, job, timeout_s)
        probe.poll()  # the last lines, written just before the end
        exited = wait_job_event(rec, events, trial, arm, (Ev.WORKLOAD_EXITED,), None, 10)
        rc = exited.detail.get("rc") if exited else None
        rec.record(trial, arm, Ev.EXITED, rc=rc, job_id=job.job_id)
        if exited is None:
            state = cluster.final_state(job)
            raise RunFailed(f"job {job.job_id} ended {state} before its workload exited")
        if rc:
            raise RunFailed(f"the workload exited {rc} (job {job.job_id})")
        fill_progress_span(row, probe)
        row.update(node_fingerprint(rec, trial, arm))
    except JobNeverStarted:
        raise
    except (RunFailed, CriuError, CkptPocError) as exc:
        row.update(status="failed", reason=str(exc).splitlines()[0][:500])
        row[LOG_TAIL] = log_tail(log)
        rec.record(trial, arm, Ev.RUN_FAILED, reason=row["reason"])
    finally:
        if probe:
            probe.stop()
        cluster.stop_all()
        rec.import_jsonl(events)  # its dumps: checkpoint rows
    return row


# long: one native start, its dump and one restore, each step a line the reader can follow
def cold_start_pair_on_slurm(
    plan: Plan,
    ctx: RunContext,
    cluster: SlurmCluster,
    rec: EventRecorder,
    repeat: int,
    timeout_s: float,
    page_cache: str,
) -> list[ColdStartRow]:
    """One native start and one restore of the same copy, each a job on the plan's node,
    the page cache as ``page_cache`` asks before each; two rows, failed ones kept. A job
    that never starts raises JobNeverStarted."""
    node = plan.cluster.nodes[0]
    trial = cold_start_trial(page_cache, repeat)
    copy_dir = run_folder(ctx) / f"{trial}-copy"
    copy_dir.mkdir(parents=True, exist_ok=True)
    log, events = copy_dir / "workload.log", copy_dir / "job-events.jsonl"
    request = copy_dir / "dump-request"
    includes = COLD_START_INCLUDES
    native = cold_start_row(plan, trial, UNMANAGED, repeat, node, includes[UNMANAGED])
    restore: ColdStartRow | None = None
    regex = progress_regex(plan)
    port = copy_port(plan)  # the restored copy listens on it again
    ready_probe = workload_ready_probe(plan, copy_dir, port)
    common = {
        "keep": 1,
        "interval_s": NO_PERIODIC_S,
        "page_cache": page_cache,
        "cache_files": [str(workload_prepared(plan)), str(copy_dir)],
        "ready_timeout_s": timeout_s,
    }
    if not timed_by_log(ready_probe):  # asked inside each job, on the node
        assert ready_probe is not None
        common["ready_probe"] = ready_probe.model_dump(exclude_none=True)
    gpus = plan.workload.gpus
    probes: list[LogProgressProbe] = []
    try:
        argv = workload_argv(plan, copy_dir, port)
        spec = copy_spec(
            plan,
            trial,
            UNMANAGED,
            copy_dir,
            checkpoint=True,
            mode="run",
            argv=argv,
            dump_request=str(request),
            checkpoint_arm=MANAGED,
            fingerprint=True,
            **common,
        )
        job = cluster.submit(node, UNMANAGED, spec, name=trial, log=log, gpus=gpus, exclusive=True)
        native["job_id"] = job.job_id
        cluster.wait_started(job, timeout_s)
        probes.append(probe := LogProgressProbe(log, regex, rec, trial, UNMANAGED).start())
        started = wait_job_event(rec, events, trial, UNMANAGED, (Ev.JOB_STARTED,), None, timeout_s)
        if started is None:
            raise StartFailed(f"job {job.job_id} ran but never reported starting")
        launch = rec.alias(started, Ev.LAUNCH, job_id=job.job_id, node=node)
        ready = _wait_ready(
            ready_probe, probe, rec, events, trial, UNMANAGED,
            after_offset=-1, timeout_s=timeout_s, alive=_alive(cluster, job),
            who=f"unmanaged, job {job.job_id}",
        )  # fmt: skip
        native.update(
            status="ok",
            ready_s=span_s(launch, ready),
            **_page_cache(rec, trial, UNMANAGED),
            **node_fingerprint(rec, trial, UNMANAGED),
        )

        restore = cold_start_row(plan, trial, MANAGED, repeat, node, includes[MANAGED])
        _write_atomically(request, f"dump the ready copy of job {job.job_id}\n")  # CRIU ends it
        _wait_ended(cluster, job, timeout_s)
        probe.stop()
        rec.import_jsonl(events)
        point = CriuCheckpointer.last_complete_under(checkpoint_folder(plan, copy_dir))
        if point is None:
            failed = rec.events(trial, MANAGED, Ev.DUMP_FAILED)
            why = failed[-1].detail.get("reason") if failed else "no complete checkpoint"
            raise StartFailed(f"the ready copy's dump (job {job.job_id}) failed: {why}")
        restore["checkpoint_bytes"] = point.image_bytes
        killed_at = log.stat().st_size
        restore["restore"] = "failed"  # until the restored copy is ready (restore_attempted)
        spec = copy_spec(
            plan,
            trial,
            MANAGED,
            copy_dir,
            checkpoint=True,
            mode="restore",
            restore_from=str(point.path),
            fingerprint=True,
            **common,
        )
        # The restored copy writes on into the native copy's log (CRIU restores its file
        # descriptors): only lines past what the native copy wrote count. The probe follows
        # from before the job, unheld: a first line written as the restore ends is timed.
        probe = LogProgressProbe(log, regex, rec, trial, MANAGED, from_offset=killed_at)
        probes.append(probe.start())
        with probe.time_exactly():
            new = cluster.submit(
                node, MANAGED, spec, name=trial, log=log, gpus=gpus, exclusive=True
            )
            restore["job_id"] = new.job_id
            cluster.wait_started(new, timeout_s)
            names = (Ev.RESTORED, Ev.RESTORE_FAILED)
            restored = wait_job_event(rec, events, trial, MANAGED, names, None, timeout_s)
            if restored is None or restored.event == Ev.RESTORE_FAILED:
                tail = str(restored.detail.get("log_tail", "")) if restored else ""
                last = tail.strip().splitlines()[-1] if tail.strip() else "no restore event"
                raise StartFailed(f"restore job {new.job_id} did not bring the copy back: {last}")
            restore_start = rec.events(trial, MANAGED, Ev.RESTORE_START)[-1]
            ready = _wait_ready(
                ready_probe, probe, rec, events, trial, MANAGED,
                after_offset=killed_at, timeout_s=timeout_s, alive=_alive(cluster, new),
                who=f"managed, job {new.job_id}", restored=restored,
            )  # fmt: skip
        restore.update(
            restored_numbers(point.image_bytes, restore_start, restored, ready),
            **_page_cache(rec, trial, MANAGED),
            **node_fingerprint(rec, trial, MANAGED),
        )
        cluster.stop_all()  # the restore job: the read below is alone on the node
        restore.update(raw_read_numbers(point.path, restore["page_cache"]))
    except JobNeverStarted:
        raise
    except (StartFailed, RunFailed, CriuError, CkptPocError) as exc:
        fail_starts([native, restore], rec, trial, exc, log_tail(log))
    finally:
        for probe in probes:
            probe.stop()
        cluster.stop_all()
        rec.import_jsonl(events)
    return [native] + ([restore] if restore is not None else [])
