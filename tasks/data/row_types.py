"""The groups of columns the stages build their rows of, typed (the datasets: datasets.py).

Each key names a column of the dataset its row is written to; tests/unit/test_row_types.py
reads the columns from the declarations, so no group can name a column its dataset lacks.
The keys that ride beside a row and are never written are grouped apart (``NOT_COLUMNS``).

A `trials` row is built in parts: its start (which trial, how it is timed, on what), then the
groups its experiment's steps fill. ``total=False``: columns a row may lack (a failed trial
has no numbers); a group is so too, for the rows to merge it, though its builder gives every
key.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, TypedDict

from tasks.data.fingerprint import Fingerprint


class RunStamp(Fingerprint):
    """The columns every row of a run carries (RunContext.stamp): the run, its fingerprint."""

    poc: str
    run_id: str


# --- beside the rows, never written ------------------------------------------------------------


class FailureNotes(TypedDict, total=False):
    """Beside a failed `trials` row, for the flow run's logs and the report (as_trials drops
    them): the tail of its workload's log (LOG_TAIL) and, a recovery trial's, whether its
    fault was delivered (FAULT_DELIVERED)."""

    log_tail: str
    fault_delivered: bool


class ReportCriterion(TypedDict):
    """Beside a weekly report row, for its page: the plan criterion it answers, if any."""

    criterion: str | None
    statistic: str | None
    at_most: bool | None


NOT_COLUMNS: tuple[type, ...] = (FailureNotes, ReportCriterion)


# --- trials: the groups ------------------------------------------------------------------------


class TrialStart(TypedDict):
    """What every `trials` row starts as: which trial, how it is timed, on what."""

    measure: str
    trial_id: str
    arm: str
    repeat: int
    started_at: dt.datetime
    clock: str
    includes: str
    gpus: int
    gpus_from: str
    nodes: str
    workload_hash: str


class TrialEnd(FailureNotes, total=False):
    """How the trial ended: ok, or failed with why."""

    status: str
    reason: str


class PageCacheColumns(TypedDict, total=False):
    """The page cache before a start was timed: its state, and how it was dropped."""

    page_cache: str
    page_cache_drop: str | None


class ImagesPlace(TypedDict, total=False):
    """Where a dump wrote its images or a restore read them, and on what file system."""

    images_dir: str | None
    images_fs: str | None


class DumpPhases(TypedDict, total=False):
    """CRIU's own split of one dump (its `--display-stats`), on every dump row."""

    dump_memdump_s: float | None
    dump_memwrite_s: float | None
    dump_pages_scanned: int | None
    dump_pages_written: int | None


class RestoredNumbers(TrialEnd, ImagesPlace, total=False):
    """A restored copy's numbers once it is ready: ready and restore seconds, their parts,
    and bytes over restore seconds."""

    restore: str
    ready_s: float
    restore_s: float
    restore_fork_s: float | None
    restore_warmup_s: float
    restore_gbps: float | None


class RawRead(TypedDict, total=False):
    """A plain read of a restore's images after it, outside its clock (absent: the harness
    cannot see them)."""

    raw_read_gbps: float | None


# --- trials: the rows --------------------------------------------------------------------------


class _OverheadStart(TrialStart):
    variant: str
    pair: int


class OverheadRow(_OverheadStart, TrialEnd, Fingerprint, total=False):
    """One timed run of the workload; a Slurm job's carries its node's fingerprint."""

    run_s: float
    steps: int
    steps_per_s: float | None
    job_id: str


class ColdStartRow(
    TrialStart, RestoredNumbers, PageCacheColumns, RawRead, Fingerprint, total=False
):
    """One start of a cold-start pair: the native one (ready_s) or the restore of its copy."""

    job_id: str
    checkpoint_bytes: int


class CheckpointRow(TrialStart, TrialEnd, DumpPhases, ImagesPlace, total=False):
    """One CRIU dump, taken in any experiment."""

    dump_s: float | None
    freeze_s: float | None
    checkpoint_bytes: int | None
    images_write_gbps: float | None


class _RecoveryStart(TrialStart):
    fault: str


class RecoveryRow(_RecoveryStart, TrialEnd, ImagesPlace, total=False):
    """One recovery trial: the clock's parts and the work lost, as the trial's steps and its
    cluster's (tasks/engine/clusters/*/recovery*.py) fill them."""

    recovery_s: float
    detection_s: float
    scheduling_s: float
    restore_s: float
    restore: str
    restore_fork_s: float | None
    warmup_s: float
    work_lost_s: float
    work_lost_gpu_h: float
    steps_lost: int
    recoverable_point: str
    checkpoint_bytes: int
    detect_latency_ms: float
    serving_latency_ms: float
    job_id: str
    recovery_job_id: str
    fault_outcome: str
    notice_checkpoint: str
    notice_checkpoint_s: float | None
    queued_s: float


# --- samples and their gaps (the run's stamp added as they are written) ------------------------


class AttributionColumns(TypedDict):
    """Whose a sample is: a PoC job's (its arm, workload, trial), or nobody's we know."""

    job_id: str | None
    arm: str | None
    workload: str | None
    trial_id: str | None
    attributed_by: str


class SampleRow(AttributionColumns):
    """One `samples` row as a sampler reads it."""

    node: str
    source: str
    entity: str
    device: str
    gpu_uuid: str | None
    gpu_index: int | None
    metric: str
    unit: str
    value: float
    t_from: dt.datetime
    t_to: dt.datetime
    points: int
    pid: int | None


class GapRow(TypedDict):
    """One `sample_gaps` row: a stretch without samples, with why."""

    node: str
    source: str
    entity: str | None
    metric: str | None
    t_from: dt.datetime
    t_to: dt.datetime
    gap_s: float
    reason: str
    detected_by: str


# --- reports -----------------------------------------------------------------------------------


class ReportRow(TypedDict):
    """One weekly `reports` row as the week's rows are built; the run's stamp and
    computed_at are added as it is written."""

    week: str
    week_start: dt.datetime  # a pd.Timestamp, its week's Monday
    measure: str
    arm: str
    n: int
    value: float | None
    ci_low: float | None
    ci_high: float | None
    unit: str
    method: str
    basis: str
    inputs: str | None  # JSON
    threshold: float | None
    verdict: str
    note: str
    segment: int
    provisional: bool


class JudgedRow(ReportRow, ReportCriterion):
    """A weekly report row with the plan criterion it answers beside it."""


# --- events ------------------------------------------------------------------------------------


class EventLine(TypedDict):
    """A line of a run's events.jsonl, as the recorder writes it (tasks/engine/clock.py): the
    `events` row it becomes once stamped, its wall clock ISO text and its detail a mapping
    until the dataset is written."""

    trial_id: str
    arm: str
    event: str
    t_wall: str
    t_mono_ns: int
    host: str
    detail: dict[str, Any]
