"""What overhead and cold start share on every cluster: their rows, the failures that give a
failed row instead of a number, and the readings of a copy's progress that end their clocks.

The local runs (backends/local/timed_runs.py) and the Slurm runs
(backends/slurm/timed_runs.py) build their rows here, so a row means the same whichever
backend ran it.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.errors import CkptPocError
from tasks.data.events import Ev
from tasks.data.plan import Plan, ReadyProbe
from tasks.data.row_types import (
    ColdStartRow,
    OverheadRow,
    PageCacheColumns,
    RawRead,
    RestoredNumbers,
)
from tasks.engine.clock import Event, EventRecorder, span_s
from tasks.engine.page_cache import CacheState, raw_read
from tasks.engine.probes import LogProgressProbe
from tasks.engine.ready import ready_line_regex, wait_ready
from tasks.experiments.checkpoints import images_place, restore_fork_s
from tasks.experiments.clocks import clock_of
from tasks.experiments.trials import LOG_TAIL, workload_hash


class RunFailed(CkptPocError):
    """A timed run that cannot give a number; its row says why."""


class StartFailed(CkptPocError):
    """A start that cannot give a number; its row says why."""


def overhead_row(
    plan: Plan, variant: str, pair: int, arm: str, node: str, includes: str
) -> OverheadRow:
    return {
        "measure": "overhead",
        "trial_id": f"{variant}-{pair}",
        "arm": arm,
        "variant": variant,
        "pair": pair,
        "repeat": pair,
        "started_at": dt.datetime.now(dt.UTC),
        "clock": clock_of("overhead", arm),
        "includes": includes
        + (" with CRIU dumps every interval" if variant == "checkpointing" else ""),
        "gpus": plan.workload.gpus,
        "gpus_from": "plan",
        "nodes": node,
        "workload_hash": workload_hash(plan),
    }


def fill_progress_span(row: OverheadRow, probe: LogProgressProbe) -> None:
    """The run's time: from its first progress line to its last, as the probe saw them."""
    if len(probe.seen) < 2:
        raise RunFailed("fewer than two progress steps seen: nothing to time")
    first, last = probe.seen[0], probe.seen[-1]
    run_s = (last.t_mono_ns - first.t_mono_ns) / 1e9
    steps = last.step - first.step
    row.update(status="ok", run_s=run_s, steps=steps, steps_per_s=steps / run_s if run_s else None)


# A server's log has no progress lines: a one-group pattern that never matches (`(?!)`
# fails at once), so its probe follows the log and records nothing.
NO_PROGRESS = r"(?!)(\d+)"


def progress_regex(plan: Plan) -> str:
    """What cold start's log probe follows: a log ready probe's line, NO_PROGRESS for a
    server another ready probe times, else the workload's progress regex."""
    ready = plan.workload.ready_probe
    if ready is not None:
        return ready_line_regex(ready.log) if ready.log is not None else NO_PROGRESS
    probe = plan.workload.progress_probe
    return probe.log_regex if probe is not None and probe.log_regex else NO_PROGRESS


def timed_by_log(ready: ReadyProbe | None) -> bool:
    """Whether cold start's clocks end on a line of the copy's log (a log ready probe, or
    the first progress line) rather than on a probe's answer."""
    return ready is None or ready.log is not None


def cold_start_trial(page_cache: str, repeat: int) -> str:
    """A cold-start pair's trial id: `cold-N` with the cache dropped, `cold-warm-N` warm."""
    return f"cold-{repeat}" if page_cache == "dropped" else f"cold-{page_cache}-{repeat}"


def cache_columns(cache: CacheState) -> PageCacheColumns:
    """A row's page-cache columns: its state before the start and how it was dropped."""
    return {"page_cache": cache.state, "page_cache_drop": cache.drop}


def cold_start_row(
    plan: Plan, trial: str, arm: str, repeat: int, node: str, includes: str
) -> ColdStartRow:
    return {
        "measure": "cold_start",
        "trial_id": trial,
        "arm": arm,
        "repeat": repeat,
        "started_at": dt.datetime.now(dt.UTC),
        "clock": clock_of("cold_start", arm),
        "includes": includes,
        "gpus": plan.workload.gpus,
        "gpus_from": "plan",
        "nodes": node,
        "workload_hash": workload_hash(plan),
    }


def wait_for_ready(
    ready: ReadyProbe | None,
    probe: LogProgressProbe,
    rec: EventRecorder,
    trial: str,
    arm: str,
    *,
    after_offset: int,
    timeout_s: float,
    alive: Callable[[], bool],
    who: str,
    restored: Event | None = None,
) -> Event:
    """The copy's ready signal (``who`` names it in a failure): the plan's ready probe
    (``ready``, filled in for this copy) saying ready, timed when it first answered; a log
    ready probe's line or, without a ready probe, the first progress line past
    ``after_offset``, timed to its write. The `ready` event ends both clocks; a probe that
    never says ready fails the start with its last answer.

    A restored copy (``restored``: CRIU's event) does not log its ready line again: it was
    dumped after logging it. With a log ready probe it is ready once restored, and its
    `ready` says so."""
    if ready is not None and ready.log is not None and restored is not None:
        return rec.record_at(
            trial, arm, Ev.READY, restored.t_mono_ns,
            probe="restored: its ready line was logged before the dump",
        )  # fmt: skip
    if not timed_by_log(ready):
        assert ready is not None
        answer = wait_ready(ready, rec, trial, arm, timeout=timeout_s, alive=alive)
        if answer.ready:
            return rec.events(trial, arm, Ev.READY)[-1]
        raise StartFailed(
            f"its ready probe ({ready.describe()}) never said ready ({who}); "
            f"its last answer: {answer.last}"
        )
    seen = probe.wait_for(lambda s: s.offset > after_offset, timeout_s)
    what = f"line matching {ready.log!r}" if ready is not None else "progress line"
    if seen is None:
        raise StartFailed(f"no {what} within {timeout_s:.0f} s ({who})")
    # Timed to the line's write, as recovery's `serving_again` is (the probe's read may be
    # later: its latency is `learned_ms`).
    learned_ms = (time.monotonic_ns() - seen.t_mono_ns) / 1e6
    return rec.record_at(
        trial, arm, Ev.READY, seen.t_mono_ns,
        step=seen.step, probe=f"first {what}", learned_ms=learned_ms,
    )  # fmt: skip


def restored_numbers(
    image_bytes: int, started: Event, restored: Event, ready: Event
) -> RestoredNumbers:
    """A restore row's numbers: ready and restore seconds, and bytes over restore seconds."""
    # A copy may write its first line before `criu restore` has returned: its restore ended
    # by then at the latest.
    back = min(restored, ready, key=lambda e: e.t_mono_ns)
    restore_s = span_s(started, back)
    return {
        "status": "ok",
        "restore": "ok",
        "ready_s": span_s(started, ready),
        "restore_s": restore_s,
        "restore_fork_s": restore_fork_s(restored),
        "restore_warmup_s": span_s(back, ready),
        "restore_gbps": image_bytes / restore_s / 1e9 if restore_s > 0 else None,
        **images_place(restored),
    }


def raw_read_numbers(images: Path, page_cache: str) -> RawRead:
    """After a restore, outside its clock: a plain read of the same images with the cache as
    the restore found it (``raw_read_gbps``); nothing when the harness cannot see them (a
    node's local scratch, from the harness's host)."""
    files = sorted(images.glob("*.img"))  # the bytes checkpoint_bytes counts
    if not files:
        return {}
    seconds, size = raw_read(files, page_cache)
    return {"raw_read_gbps": size / seconds / 1e9 if seconds > 0 else None}


def fail_starts(
    rows: list[ColdStartRow | None], rec: EventRecorder, trial: str, exc: Exception, tail: str
) -> None:
    """Every row of the pair not yet ok fails with the reason; one `start_failed` event."""
    reason = str(exc).splitlines()[0][:500]
    for row in rows:
        if row is not None and row.get("status") != "ok":
            row.update(status="failed", reason=reason, **{LOG_TAIL: tail})
    rec.record(trial, MANAGED if rows[-1] else UNMANAGED, Ev.START_FAILED, reason=reason)
