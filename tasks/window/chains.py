"""The chains of a PoC's events and their allocation split into the utilization categories
(docs/design.md §4); tasks/window/utilization.py sums them into the weekly rows.

**The unit** is a *chain*: the events of one (run_id, trial_id, arm), that is one workload
copy and the copies a recovery brought back in its place (a CRIU restore or a restart). Each
copy is an *attempt*: the first from the chain's start, each later one from the fault whose
recovery started it (``jobs`` counts the attempts that held an allocation in the week).

**Times.** A chain recorded on one host is placed on CLOCK_MONOTONIC, anchored at its first
event's wall time (durations never jump); a chain with events from several hosts (a Slurm
job's node) uses the wall clock.

**Allocation** of a chain: from its first `job_started` (Slurm: the allocation, not the
queue), else its first `launch`, else its first `restore_start` (a copy that only ever was a
restore, as in the cold-start experiment), else its first event; to its last event of any
name (`exited`, `serving_again`, `trial_failed`, `left_running`, … — the harness stops a
recovery trial's copy once it serves again and records no separate event for that). Events
before the start are not the chain's (the cold-start experiment records the dump of the
native copy under the managed arm, before the managed copy's restore). On
Slurm, the time between an interrupted job's end (`detected`) and its recovery job's start
(the first `job_started` after `recovery_submitted`) is *not* allocated: Slurm released it.
GPU-hours = seconds × the chain's GPUs (`trials.gpus` of its (run_id, trial_id, arm), else
the plan's workload.gpus) / 3600.

**Categories.** Every allocated instant falls in exactly one of these, in this precedence, so
that allocated = delivered + lost + idle_checkpoint + idle_recovery + idle_other exactly:

1. idle_recovery: from each `fault_injected` to the next `serving_again` (the first new
   progress of the copy that came back: detection, scheduling, restore or cold init,
   warm-up). A fault with no `serving_again` and no new progress after it: to the next
   fault, or to the end of the allocation (the copy never came back).
2. idle_checkpoint: the workload frozen by CRIU: ``frozen_us`` of each `checkpoint_end`
   (the trials' ``freeze_s``), placed at the end of the dump (CRIU resumes the tasks near
   its end; only the length is measured, not the position within the dump). A dump with no
   frozen time, a `checkpoint_failed` one, or one still open at the end: its whole
   `checkpoint_start` → end span (an upper bound: how long it froze is not known).
3. progress time, the *working span* of each attempt minus 1 and 2: the first attempt's
   from its first `progress` event, a recovered attempt's from its `serving_again`; to the
   fault that ended it, or to its last `progress` event (what follows — saving, exiting —
   is not progress). Within it:
   - lost: time whose progress was redone or discarded. After a fault whose copy came
     back, the resumed copy's first new step ``s1`` (the step `serving_again` carries) says
     where it restarted from: ``r = s1 − 1`` (a step number seen again marks wasted
     progress, as in Google's ml-goodput-measurement). Progress made after the moment the
     recoverable point was taken and before the fault is lost: that moment is the
     `checkpoint_start` of the CRIU checkpoint that was restored (the `restored` event's
     ``index``; CRIU keeps the partial step in flight), else the time step ``r`` was first
     reached in the latest attempt that started at or before ``r`` (the progress event of
     the first step ≥ ``r``, interpolated linearly when the probe reported several steps at
     once) — the recovery experiment's own ``work_lost_s`` uses the same two moments. A
     fault nothing came back from: all of that attempt's working span is lost (nothing
     later kept any of it).
   - delivered: the rest of the progress time. That is progress *not shown to be redone
     or discarded*: a copy still running when its record ends, or stopped by the harness
     at the end of a trial, keeps its progress as delivered. Requiring a completed run
     instead would count every recovery trial's progress as lost on both arms.
4. idle_other: allocated and none of the above: start-up before the first progress step,
   after the last one, waiting.

Limits: from the fault on the probe reads each write alone (`time_exactly`), so
`serving_again` is the first line back; a copy writing two lines within one wake-up still
puts ``r`` one step high (and lost one step low); the frozen span's
position within its dump is assumed; GPU counts come from the plan where `trials` has no
row for the chain (side-by-side runs).

A chain with no `progress` events has no working span: its allocation is idle (other,
recovery, checkpoint) — never delivered.

Only a workload's chains count: one with a launch, a job, a restore or a progress report (the
install and opt-in steps the harness records under the managed arm are not an allocation of
the workload, and would be idle time on one arm only).

**Two readings of the same time** (both arms alike). The split above is the seed's: its
denominator is the allocated GPU-hours. Google's ml-goodput-measurement reads a chain from
its first start to its last end, time in the queue included (``queued``: what Slurm released
between attempts), and counts the step in flight at a fault (the attempt's last progress
report → the fault) to the recovery from that disruption, not to lost progress
(``unfinished_lost``: the part of ``lost`` that was that step). Delivered is the same in both.

**Exclusions** (the plan's maintenance windows) are cut out of everything — allocation,
every category, the queue — before anything is summed; ``excluded`` keeps what was cut.

**Ended.** A chain has ended when its trial's `trials` row was written (the harness closed
the trial, ok or failed) or its record holds an end (`exited`, `workload_exited`,
`stopped_by_harness`, `trial_failed`, `run_failed`). Until then a figure containing it is
provisional: a copy still running can yet lose what reads as delivered.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tasks.data.events import Ev
from tasks.window.intervals import Interval, intersect, subtract, union

CATEGORIES = ("delivered", "lost", "idle_checkpoint", "idle_recovery", "idle_other")
# Events that mean a new copy is being brought up after a fault (a restore or a restart).
RESTART_EVENTS = frozenset(
    {Ev.STARTED, Ev.JOB_STARTED, Ev.RESTORE_START, Ev.RESTORED, Ev.RESTART_START, Ev.RESTARTED}
)
# Events only a workload's copy has (a chain without one is the harness's own: install, opt-in).
WORKLOAD_EVENTS = frozenset({Ev.LAUNCH, Ev.JOB_STARTED, Ev.RESTORE_START, Ev.STARTED, Ev.PROGRESS})
# Events after which a chain's record holds nothing more (module docstring: Ended).
END_EVENTS = frozenset(
    {Ev.EXITED, Ev.WORKLOAD_EXITED, Ev.STOPPED_BY_HARNESS, Ev.TRIAL_FAILED, Ev.RUN_FAILED}
)


# --- one chain -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainEvent:
    t: float
    event: str
    detail: dict[str, Any]


@dataclass
class Chain:
    """One (run_id, trial_id, arm): its allocation split into the categories (seconds)."""

    run_id: str
    trial_id: str
    arm: str
    gpus: int
    allocated: list[Interval] = field(default_factory=list)
    parts: dict[str, list[Interval]] = field(default_factory=dict)
    attempts: list[Interval] = field(default_factory=list)
    queued: list[Interval] = field(default_factory=list)  # released between attempts (Slurm)
    unfinished_lost: list[Interval] = field(default_factory=list)  # lost: the step in flight
    excluded: list[Interval] = field(default_factory=list)  # allocation in the exclusions
    ended: bool = False

    def exclude(self, windows: Sequence[Interval]) -> None:
        """Cut the plan's exclusions out of every interval set; keep what was cut."""
        cut = union(windows)
        if not cut:
            return
        self.excluded = intersect(self.allocated, cut)
        self.allocated = subtract(self.allocated, cut)
        self.parts = {name: subtract(ivs, cut) for name, ivs in self.parts.items()}
        self.queued = subtract(self.queued, cut)
        self.unfinished_lost = subtract(self.unfinished_lost, cut)


# a dict: an event's detail JSON, as parsed
def _detail(raw: Any) -> dict[str, Any]:
    if raw is None or (isinstance(raw, float) and math.isnan(raw)) or raw is pd.NA:
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def epoch_s(values: pd.Series) -> np.ndarray:
    ts = pd.to_datetime(values, utc=True)
    return ((ts - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)).to_numpy(float)


def chain_events(frame: pd.DataFrame) -> list[ChainEvent]:
    """One chain's events on one time line, in order (see the module docstring: Times)."""
    frame = frame.sort_values("t_mono_ns", kind="stable")
    wall = epoch_s(frame["t_wall"])
    if frame["host"].nunique() <= 1:
        mono = frame["t_mono_ns"].astype("int64").to_numpy()
        times = wall[0] + (mono - mono[0]) / 1e9
    else:
        order = np.argsort(wall, kind="stable")
        frame, times = frame.iloc[order], wall[order]
    return [
        ChainEvent(float(t), str(name), _detail(raw))
        for t, name, raw in zip(times, frame["event"], frame["detail"], strict=True)
    ]


def _first(events: list[ChainEvent], names: Iterable[str], after: float = -math.inf) -> float:
    names = set(names)
    return next((e.t for e in events if e.event in names and e.t >= after), math.nan)


def _freezes(events: list[ChainEvent], end: float) -> list[Interval]:
    """When CRIU kept the workload frozen (module docstring: idle_checkpoint)."""
    starts: dict[int | None, float] = {}
    out: list[Interval] = []
    for e in events:
        index = _int(e.detail.get("index"))
        if e.event == Ev.CHECKPOINT_START:
            starts[index] = e.t
        elif e.event in (Ev.CHECKPOINT_END, Ev.CHECKPOINT_FAILED):
            began = starts.pop(index, e.t)
            frozen = _int(e.detail.get("frozen_us")) if e.event == Ev.CHECKPOINT_END else None
            out.append(
                (max(began, e.t - frozen / 1e6), e.t) if frozen is not None else (began, e.t)
            )
    out += [(began, end) for began in starts.values()]  # open at the end of the record
    return out


@dataclass
class _Attempt:
    """One copy: where its working span runs, which step it started from, its progress."""

    base: int | None  # the step it resumed from; None: the first copy
    work_from: float
    work_to: float
    points: list[tuple[float, int]]  # (time, step) of its progress events


def _time_of_step(r: int, attempts: list[_Attempt]) -> float:
    """When step ``r`` was first reached in the latest attempt that started at or before it."""
    for att in reversed(attempts):
        if att.base is not None and att.base > r:
            continue  # it started past r: r was reached in an earlier attempt
        pts = att.points
        if not pts:
            return att.work_from
        steps = [s for _, s in pts]
        i = next((k for k, s in enumerate(steps) if s >= r), None)
        if i is None:  # r at or past its last report: only the step in flight was lost
            return pts[-1][0]
        t, s = pts[i]
        if s == r or i == 0:
            return t if s == r else att.work_from
        tp, sp = pts[i - 1]
        return tp + (r - sp) / (s - sp) * (t - tp)
    return attempts[0].work_from if attempts else math.nan


def classify_chain(
    events: list[ChainEvent], run_id: str, trial_id: str, arm: str, gpus: int
) -> Chain:
    """Split one chain's allocation into the categories (module docstring)."""
    chain = Chain(run_id, trial_id, arm, gpus)
    if not events:
        return chain
    start = _chain_start(events)
    end = events[-1].t
    events = [e for e in events if e.t >= start]  # before the start: another copy's doing
    if end <= start:
        return chain
    faults = [e.t for e in events if e.event == Ev.FAULT_INJECTED]
    bounds = [*faults, end]
    progress = [
        (e.t, s)
        for e in events
        if e.event == Ev.PROGRESS and (s := _int(e.detail.get("step"))) is not None
    ]

    holes: list[Interval] = []
    recovery: list[Interval] = []
    lost_windows: list[Interval] = []
    in_flight: list[Interval] = []  # each fault's step in flight: its last report → the fault
    attempts: list[_Attempt] = []
    spans = [(start, bounds[0])]
    first_pts = [(t, s) for t, s in progress if t < bounds[0] or not faults]
    attempts.append(
        _Attempt(None, first_pts[0][0] if first_pts else bounds[0], bounds[0], first_pts)
    )
    for k, fault in enumerate(faults):
        seg_end = bounds[k + 1]
        seg = [e for e in events if fault <= e.t <= seg_end]
        if Ev.RECOVERY_SUBMITTED in {e.event for e in seg}:  # Slurm released the allocation
            holes.append(_released(seg, fault, seg_end))
        marker = _first(seg, RESTART_EVENTS)
        new_pts = [(t, s) for t, s in progress if fault < t <= seg_end and t > marker]
        serving = next((e for e in seg if e.event == Ev.SERVING_AGAIN), None)
        s1 = _int(serving.detail.get("step")) if serving else None
        back_at = serving.t if serving else (new_pts[0][0] if new_pts else math.nan)
        if s1 is None and new_pts:
            s1 = new_pts[0][1]
        prev = attempts[-1]
        reported = [t for t, _ in prev.points if t < fault]
        in_flight.append((reported[-1] if reported else prev.work_from, fault))
        if math.isnan(back_at) or s1 is None:  # it never came back: its progress was lost
            recovery.append((fault, seg_end))
            lost_windows.append((prev.work_from, fault))
            continue
        recovery.append((fault, back_at))
        r = s1 - 1
        ckpt = _restored_checkpoint_time(events, seg, fault, back_at)
        recoverable = ckpt if not math.isnan(ckpt) else _time_of_step(r, attempts)
        lost_windows.append((recoverable, fault))
        last_pt = [t for t, _ in new_pts]
        work_to = seg_end if k + 1 < len(faults) else (max(last_pt) if last_pt else back_at)
        attempts.append(_Attempt(r, back_at, max(work_to, back_at), new_pts))
        spans.append((fault, seg_end))
    if not faults:  # the only attempt ends at its last progress report, not at a fault
        attempts[0].work_to = first_pts[-1][0] if first_pts else start
    allocated = subtract(union([(start, end)]), union(holes))
    chain.allocated = allocated
    chain.parts = _categories(allocated, attempts, recovery, lost_windows, _freezes(events, end))
    chain.attempts = [(a, b) for a, b in spans if b > a]
    chain.queued = intersect(union(holes), [(start, end)])
    chain.unfinished_lost = intersect(chain.parts["lost"], union(in_flight))
    chain.ended = any(e.event in END_EVENTS for e in events)
    return chain


def _chain_start(events: list[ChainEvent]) -> float:
    """When the chain's allocation starts: its job, else its launch, else its first restore."""
    return next(
        (
            t
            for names in ((Ev.JOB_STARTED,), (Ev.LAUNCH,), (Ev.RESTORE_START,))
            if not math.isnan(t := _first(events, names))
        ),
        events[0].t,
    )


def _released(seg: list[ChainEvent], fault: float, seg_end: float) -> Interval:
    """The hole in the allocation after a fault Slurm released it for: from detection (else
    the fault) to the recovery job's start (else its submission, else the segment's end)."""
    released = _first(seg, (Ev.DETECTED,))
    back = _first(seg, (Ev.JOB_STARTED,), _first(seg, (Ev.RECOVERY_SUBMITTED,)))
    return (fault if math.isnan(released) else released, seg_end if math.isnan(back) else back)


def _restored_checkpoint_time(
    events: list[ChainEvent], seg: list[ChainEvent], fault: float, back_at: float
) -> float:
    """When the checkpoint the copy was restored from began (nan: no restore, or unknown)."""
    restored = [e for e in seg if e.event == Ev.RESTORED and e.t <= back_at]
    index = _int(restored[-1].detail.get("index")) if restored else None
    return next(
        (
            e.t
            for e in reversed(events)
            if e.event == Ev.CHECKPOINT_START
            and e.t < fault
            and index is not None
            and _int(e.detail.get("index")) == index
        ),
        math.nan,
    )


def _categories(
    allocated: list[Interval],
    attempts: list[_Attempt],
    recovery: list[Interval],
    lost_windows: list[Interval],
    freezes: list[Interval],
) -> dict[str, list[Interval]]:
    """The allocation split into the categories (module docstring), each a list of intervals."""
    working = union((a.work_from, a.work_to) for a in attempts)
    rec = intersect(allocated, union(recovery))
    ckpt_frozen = subtract(intersect(allocated, union(freezes)), rec)
    busy_idle = union(rec + ckpt_frozen)
    progress_time = subtract(intersect(allocated, working), busy_idle)
    lost = intersect(progress_time, union(lost_windows))
    return {
        "idle_recovery": rec,
        "idle_checkpoint": ckpt_frozen,
        "lost": lost,
        "delivered": subtract(progress_time, lost),
        "idle_other": subtract(allocated, union(busy_idle + working)),
    }


def _gpus_by_chain(trials: pd.DataFrame | None) -> dict[tuple[str, str, str], int]:
    if trials is None or trials.empty:
        return {}
    frame = trials.dropna(subset=["gpus"])
    grouped = frame.groupby(["run_id", "trial_id", "arm"], observed=True)["gpus"].max()
    return {(str(r), str(t), str(a)): int(g) for (r, t, a), g in grouped.items()}


def paired_trials(events: pd.DataFrame) -> pd.DataFrame:
    """The events of the trials with a workload chain on both arms: the comparison's. A trial
    on one arm only (the compatibility sweep's cycles, the deadline sweep's dumps, the install
    steps) has no counterpart, and counted would weigh on that arm alone."""
    if events.empty:
        return events
    work = events[events["event"].isin(WORKLOAD_EVENTS).to_numpy(bool)]
    arms = work.groupby(["run_id", "trial_id"], observed=True)["arm"].nunique()
    both = {(str(r), str(t)) for (r, t), n in arms.items() if n >= 2}
    keys = zip(events["run_id"].astype(str), events["trial_id"].astype(str), strict=True)
    return events[[key in both for key in keys]]


def _trial_keys(trials: pd.DataFrame | None) -> set[tuple[str, str, str]]:
    """The (run_id, trial_id, arm) the harness wrote a `trials` row for: trials it closed."""
    if trials is None or trials.empty:
        return set()
    keys = trials[["run_id", "trial_id", "arm"]].astype(str).itertuples(index=False)
    return {(r, t, a) for r, t, a in keys}


def classify_chains(
    events: pd.DataFrame,
    trials: pd.DataFrame | None = None,
    *,
    default_gpus: int,
    exclusions: Sequence[Interval] = (),
) -> list[Chain]:
    """Every workload chain of ``events`` classified, the ``exclusions`` cut out; GPUs from
    ``trials`` where it has the chain, and a chain with a `trials` row has ended."""
    gpus = _gpus_by_chain(trials)
    closed = _trial_keys(trials)
    chains = []
    if events.empty:
        return chains
    for (run_id, trial_id, arm), frame in events.groupby(
        ["run_id", "trial_id", "arm"], observed=True, sort=True
    ):
        if not frame["event"].isin(WORKLOAD_EVENTS).any():
            continue  # the harness's own steps (install, opt-in), not a copy of the workload
        key = (str(run_id), str(trial_id), str(arm))
        chain = classify_chain(chain_events(frame), *key, gpus=gpus.get(key, default_gpus))
        chain.ended = chain.ended or key in closed
        chain.exclude(exclusions)
        chains.append(chain)
    return chains
