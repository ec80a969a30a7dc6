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
from typing import Any

from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan
from tasks.engine.clock import Event, EventRecorder, span_s
from tasks.engine.page_cache import CacheState
from tasks.engine.probes import LogProgressProbe, wait_ready
from tasks.experiments.checkpoints import restore_fork_s
from tasks.experiments.clocks import clock_of
from tasks.experiments.trials import LOG_TAIL, workload_hash


class RunFailed(CkptPocError):
    """A timed run that cannot give a number; its row says why."""


class StartFailed(CkptPocError):
    """A start that cannot give a number; its row says why."""


def overhead_row(
    plan: Plan, variant: str, pair: int, arm: str, node: str, includes: str
) -> dict[str, Any]:
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


def fill_progress_span(row: dict[str, Any], probe: LogProgressProbe) -> None:
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
    """The workload's progress regex, or NO_PROGRESS for a server timed by its ready probe."""
    probe = plan.workload.progress_probe
    return probe.log_regex if probe is not None and probe.log_regex else NO_PROGRESS


def cold_start_trial(page_cache: str, repeat: int) -> str:
    """A cold-start pair's trial id: `cold-N` with the cache dropped, `cold-warm-N` warm."""
    return f"cold-{repeat}" if page_cache == "dropped" else f"cold-{page_cache}-{repeat}"


def cache_columns(cache: CacheState) -> dict[str, Any]:
    """A row's page-cache columns: its state before the start and how it was dropped."""
    return {"page_cache": cache.state, "page_cache_drop": cache.drop}


def cold_start_row(
    plan: Plan, trial: str, arm: str, repeat: int, node: str, includes: str
) -> dict[str, Any]:
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
    plan: Plan,
    probe: LogProgressProbe,
    rec: EventRecorder,
    trial: str,
    arm: str,
    *,
    after_offset: int,
    timeout_s: float,
    alive: Callable[[], bool],
    who: str,
) -> Event:
    """The plan's ready signal from the copy (``who`` names it in a failure): its ready URL
    answering 200, else its first progress line past ``after_offset``. The `ready` event
    ends both clocks."""
    if plan.workload.ready_probe:
        url = plan.workload.ready_probe.url
        if wait_ready(url, rec, trial, arm, timeout=timeout_s, alive=alive):
            return rec.events(trial, arm, "ready")[-1]
        raise StartFailed(f"{url} never answered 200 ({who})")
    seen = probe.wait_for(lambda s: s.offset > after_offset, timeout_s)
    if seen is None:
        raise StartFailed(f"no progress line within {timeout_s:.0f} s ({who})")
    # Timed to the line's write, as recovery's `serving_again` is (the probe's read may be
    # later: its latency is `learned_ms`).
    learned_ms = (time.monotonic_ns() - seen.t_mono_ns) / 1e6
    return rec.record_at(
        trial, arm, "ready", seen.t_mono_ns,
        step=seen.step, probe="first progress line", learned_ms=learned_ms,
    )  # fmt: skip


def restored_numbers(
    image_bytes: int, started: Event, restored: Event, ready: Event
) -> dict[str, Any]:
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
    }


def fail_starts(
    rows: list[dict[str, Any] | None], rec: EventRecorder, trial: str, exc: Exception, tail: str
) -> None:
    """Every row of the pair not yet ok fails with the reason; one `start_failed` event."""
    reason = str(exc).splitlines()[0][:500]
    for row in rows:
        if row is not None and row.get("status") != "ok":
            row.update(status="failed", reason=reason, **{LOG_TAIL: tail})
    rec.record(trial, "managed" if rows[-1] else "unmanaged", "start_failed", reason=reason)
