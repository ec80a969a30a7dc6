"""Job-level utilization (goodput) per arm, ISO week and workload (DESIGN §4).

Input: the committed `events` of a PoC (and `trials` for GPU counts, `samples` for the busy
fraction). Output: rows of the `utilization` dataset.

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

Limits: when the probe read several new lines at once, `serving_again` carries the last of
them, so ``r`` is too high and lost too low by less than that read's steps; the frozen span's
position within its dump is assumed; GPU counts come from the plan where `trials` has no
row for the chain (side-by-side runs).

A chain with no `progress` events has no working span: its allocation is idle (other,
recovery, checkpoint) — never delivered.

**Weeks.** Every interval is split at ISO week boundaries (Monday 00:00 UTC): an attempt
running Sunday → Monday contributes to both weeks. Rows are written for both arms of every
week that has any allocation (or, with ``week`` given, for that week only, even when
nothing was allocated); an arm with none that week gets ``jobs`` = 0 and a null goodput.

**Busy fraction.** The mean of the arm's samples over its allocation in that week, each
weighted by how long its interval [t_from, t_to] overlaps the allocation (a sample with a
`trial_id` counts only against that trial's chains; one with a `workload` only for that
workload). GPU data first: ``device='gpu'``, ``metric='gpu_utilization'`` (percent → a
fraction, averaged over the GPUs and the time, as XDMoD's gpu_usage); only when the row has
none, ``device='cpu'``, ``metric='cpu_utilization'``, and ``busy_metric`` says so: a CPU
figure is never passed off as a GPU one. A CPU sample in ``cores`` (procfs: cores busy on
average) stays in cores, labelled ``cpu_utilization [cores]``: the samples do not say how
many cores the copy held, so it is not turned into a fraction. No samples: null, 0.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tasks.data.arms import ARMS
from tasks.data.datasets import EVENTS, SAMPLES, TRIALS, UTILIZATION
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext
from tasks.data.store import normalise_dtypes, read_dataset, write_dataset
from tasks.data.weeks import week_label, week_start
from tasks.window.intervals import Interval, intersect, length_s, subtract, union

CATEGORIES = ("delivered", "lost", "idle_checkpoint", "idle_recovery", "idle_other")
# Events that mean a new copy is being brought up after a fault (a restore or a restart).
RESTART_EVENTS = frozenset(
    {"started", "job_started", "restore_start", "restored", "restart_start", "restarted"}
)
WEEK_S = 7 * 86400
EVENT_COLUMNS = ("run_id", "trial_id", "arm", "event", "t_wall", "t_mono_ns", "host", "detail")
SAMPLE_COLUMNS = (
    "arm",
    "workload",
    "trial_id",
    "device",
    "metric",
    "unit",
    "value",
    "t_from",
    "t_to",
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


# --- weeks ---------------------------------------------------------------------------------


def iso_week(t: float) -> tuple[str, float]:
    """The ISO week label (YYYY-Www) of POSIX time ``t`` and the POSIX time it starts at."""
    day = dt.datetime.fromtimestamp(t, dt.UTC).date()
    label = week_label(day)
    return label, (week_start(label) - _EPOCH).total_seconds()


def split_by_week(ivs: Iterable[Interval]) -> dict[str, list[Interval]]:
    """Each interval cut at ISO week boundaries (Monday 00:00 UTC), grouped by week."""
    out: dict[str, list[Interval]] = defaultdict(list)
    for a, b in ivs:
        while a < b:
            label, start = iso_week(a)
            cut = min(b, start + WEEK_S)
            out[label].append((a, cut))
            a = cut
    return out


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


def _epoch_s(values: pd.Series) -> np.ndarray:
    ts = pd.to_datetime(values, utc=True)
    return ((ts - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)).to_numpy(float)


def chain_events(frame: pd.DataFrame) -> list[ChainEvent]:
    """One chain's events on one time line, in order (see the module docstring: Times)."""
    frame = frame.sort_values("t_mono_ns", kind="stable")
    wall = _epoch_s(frame["t_wall"])
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
        if e.event == "checkpoint_start":
            starts[index] = e.t
        elif e.event in ("checkpoint_end", "checkpoint_failed"):
            began = starts.pop(index, e.t)
            frozen = _int(e.detail.get("frozen_us")) if e.event == "checkpoint_end" else None
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
    faults = [e.t for e in events if e.event == "fault_injected"]
    bounds = [*faults, end]
    progress = [
        (e.t, s)
        for e in events
        if e.event == "progress" and (s := _int(e.detail.get("step"))) is not None
    ]

    holes: list[Interval] = []
    recovery: list[Interval] = []
    lost_windows: list[Interval] = []
    attempts: list[_Attempt] = []
    spans = [(start, bounds[0])]
    first_pts = [(t, s) for t, s in progress if t < bounds[0] or not faults]
    attempts.append(
        _Attempt(None, first_pts[0][0] if first_pts else bounds[0], bounds[0], first_pts)
    )
    for k, fault in enumerate(faults):
        seg_end = bounds[k + 1]
        seg = [e for e in events if fault <= e.t <= seg_end]
        if "recovery_submitted" in {e.event for e in seg}:  # Slurm released the allocation
            holes.append(_released(seg, fault, seg_end))
        marker = _first(seg, RESTART_EVENTS)
        new_pts = [(t, s) for t, s in progress if fault < t <= seg_end and t > marker]
        serving = next((e for e in seg if e.event == "serving_again"), None)
        s1 = _int(serving.detail.get("step")) if serving else None
        back_at = serving.t if serving else (new_pts[0][0] if new_pts else math.nan)
        if s1 is None and new_pts:
            s1 = new_pts[0][1]
        prev = attempts[-1]
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
    return chain


def _chain_start(events: list[ChainEvent]) -> float:
    """When the chain's allocation starts: its job, else its launch, else its first restore."""
    return next(
        (
            t
            for names in (("job_started",), ("launch",), ("restore_start",))
            if not math.isnan(t := _first(events, names))
        ),
        events[0].t,
    )


def _released(seg: list[ChainEvent], fault: float, seg_end: float) -> Interval:
    """The hole in the allocation after a fault Slurm released it for: from detection (else
    the fault) to the recovery job's start (else its submission, else the segment's end)."""
    released = _first(seg, ("detected",))
    back = _first(seg, ("job_started",), _first(seg, ("recovery_submitted",)))
    return (fault if math.isnan(released) else released, seg_end if math.isnan(back) else back)


def _restored_checkpoint_time(
    events: list[ChainEvent], seg: list[ChainEvent], fault: float, back_at: float
) -> float:
    """When the checkpoint the copy was restored from began (nan: no restore, or unknown)."""
    restored = [e for e in seg if e.event == "restored" and e.t <= back_at]
    index = _int(restored[-1].detail.get("index")) if restored else None
    return next(
        (
            e.t
            for e in reversed(events)
            if e.event == "checkpoint_start"
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


# --- all chains → rows --------------------------------------------------------------------


def _gpus_by_chain(trials: pd.DataFrame | None) -> dict[tuple[str, str, str], int]:
    if trials is None or trials.empty:
        return {}
    frame = trials.dropna(subset=["gpus"])
    grouped = frame.groupby(["run_id", "trial_id", "arm"], observed=True)["gpus"].max()
    return {(str(r), str(t), str(a)): int(g) for (r, t, a), g in grouped.items()}


def classify_chains(
    events: pd.DataFrame, trials: pd.DataFrame | None = None, *, default_gpus: int
) -> list[Chain]:
    """Every chain of ``events`` classified; GPUs from ``trials`` where it has the chain."""
    gpus = _gpus_by_chain(trials)
    chains = []
    if events.empty:
        return chains
    for (run_id, trial_id, arm), frame in events.groupby(
        ["run_id", "trial_id", "arm"], observed=True, sort=True
    ):
        key = (str(run_id), str(trial_id), str(arm))
        chains.append(classify_chain(chain_events(frame), *key, gpus=gpus.get(key, default_gpus)))
    return chains


def _busy(
    samples: pd.DataFrame | None, workload: str, arm: str, week_ivs: dict[str, list[Interval]]
) -> tuple[float | None, str | None, int]:
    """(busy_fraction, busy_metric, samples) of one arm over its allocation in one week.

    ``week_ivs``: that week's allocated intervals, by trial_id. A sample with a trial_id is
    weighed against that trial's, one without against all of the arm's (a union: chains
    at the same time do not count a sample twice)."""
    if samples is None or samples.empty or not week_ivs:
        return None, None, 0
    mine = samples[(samples["arm"] == arm).fillna(False).astype(bool)]
    mine = mine[(mine["workload"].isna() | (mine["workload"] == workload)).astype(bool)]
    everyone = union(iv for ivs in week_ivs.values() for iv in ivs)
    for device, metric in (("gpu", "gpu_utilization"), ("cpu", "cpu_utilization")):
        rows = mine[((mine["device"] == device) & (mine["metric"] == metric)).astype(bool)]
        if rows.empty:
            continue
        t_from, t_to = _epoch_s(rows["t_from"]), _epoch_s(rows["t_to"])
        trial = rows["trial_id"]
        weight = np.zeros(len(rows))
        hit = np.zeros(len(rows), dtype=bool)
        groups = [(trial.isna().to_numpy(bool), everyone)] + [
            ((trial == t).fillna(False).to_numpy(bool), union(ivs)) for t, ivs in week_ivs.items()
        ]
        for applies, ivs in groups:
            for a, b in ivs:
                overlap = np.clip(np.minimum(t_to, b) - np.maximum(t_from, a), 0, None)
                point = (t_from == t_to) & (t_from >= a) & (t_from < b)
                weight += np.where(applies, overlap, 0.0)
                hit |= applies & ((overlap > 0) | point)
        if not hit.any():
            continue
        units = rows["unit"].astype(object).to_numpy()
        unit = pd.Series(units[hit]).mode().iloc[0]  # one unit per row: never mixed
        keep = hit & (units == unit)
        values = rows["value"].to_numpy(float) / (100.0 if unit == "percent" else 1.0)
        w = weight[keep]
        busy = (
            float(np.sum(w * values[keep]) / np.sum(w))
            if w.sum() > 0
            else float(values[keep].mean())
        )
        label = metric if unit in ("percent", "fraction") else f"{metric} [{unit}]"
        return busy, label, int(keep.sum())
    return None, None, 0


def utilization_rows(
    events: pd.DataFrame,
    trials: pd.DataFrame | None = None,
    samples: pd.DataFrame | None = None,
    *,
    workload: str,
    default_gpus: int,
    week: str | None = None,
    computed_at: dt.datetime | None = None,
) -> pd.DataFrame:
    """The `utilization` rows (without poc, run_id and fp_*) of ``events``: per arm and ISO
    week, for ``workload`` (a plan names one workload: every chain is its). ``week``: only
    that week's rows."""
    computed_at = computed_at or dt.datetime.now(dt.UTC)
    if week is not None:
        week_start(week)  # refuse a malformed week before any work
    acc: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    jobs: dict[tuple[str, str], int] = defaultdict(int)
    alloc_ivs: dict[tuple[str, str], dict[str, list[Interval]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for chain in classify_chains(events, trials, default_gpus=default_gpus):
        gpu_h = chain.gpus / 3600
        by_week = split_by_week(chain.allocated)
        for label, ivs in by_week.items():
            key = (chain.arm, label)
            acc[key]["allocated"] += length_s(ivs) * gpu_h
            alloc_ivs[key][chain.trial_id] += ivs
            jobs[key] += sum(
                1 for att in chain.attempts if length_s(intersect(union([att]), union(ivs))) > 0
            )
        for name, ivs in chain.parts.items():
            for label, pieces in split_by_week(ivs).items():
                acc[(chain.arm, label)][name] += length_s(pieces) * gpu_h
    # A week asked for is written even with nothing allocated: both arms, jobs 0, null goodput.
    weeks = [week] if week is not None else sorted({label for _, label in acc})
    rows = []
    for label in weeks:
        starts_at = week_start(label)
        for arm in sorted(ARMS):  # managed first: the order its rows have always had
            got = acc.get((arm, label), {})
            allocated = got.get("allocated", 0.0)
            busy, metric, n = _busy(samples, workload, arm, alloc_ivs.get((arm, label), {}))
            rows.append(
                {
                    "week": label,
                    "week_start": starts_at,
                    "arm": arm,
                    "workload": workload,
                    "jobs": jobs.get((arm, label), 0),
                    "allocated_gpu_h": allocated,
                    **{f"{c}_gpu_h": got.get(c, 0.0) for c in CATEGORIES},
                    "goodput": got.get("delivered", 0.0) / allocated if allocated > 0 else None,
                    "busy_fraction": busy,
                    "busy_metric": metric,
                    "samples": n,
                    "computed_at": computed_at,
                }
            )
    columns = [c for c in UTILIZATION.column_names if c not in ("poc", "run_id")]
    columns = [c for c in columns if not c.startswith("fp_")]
    return pd.DataFrame(rows, columns=columns)


def compute_utilization(plan: Plan, ctx: RunContext, week: str | None = None) -> pd.DataFrame:
    """Read the PoC's committed events, trials and samples, compute the utilization rows
    (``week``: that ISO week only), stamp them with the run and write them (atomically).
    Returns the rows written; the caller commits the run."""
    where = {"data_dir": ctx.data_dir, "poc": ctx.poc}
    rows = utilization_rows(
        read_dataset(EVENTS, **where, columns=EVENT_COLUMNS),
        read_dataset(TRIALS, **where, columns=("run_id", "trial_id", "arm", "gpus")),
        read_dataset(SAMPLES, **where, columns=SAMPLE_COLUMNS),
        workload=plan.workload.name,
        default_gpus=plan.workload.gpus,
        week=week,
    )
    stamped = pd.DataFrame(
        [{**ctx.stamp(), **row} for row in rows.to_dict("records")],
        columns=UTILIZATION.column_names,
    )
    write_dataset(
        stamped,
        UTILIZATION,
        data_dir=ctx.data_dir,
        poc=ctx.poc,
        run_id=ctx.run_id,
        metadata=ctx.file_metadata,
    )
    return normalise_dtypes(stamped, UTILIZATION)
