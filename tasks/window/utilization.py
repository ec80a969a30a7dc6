"""Job-level utilization (goodput) per arm, ISO week and workload (docs/design.md §4).

Input: the committed `events` of a PoC (and `trials` for GPU counts, `samples` for the busy
fraction). Output: rows of the `utilization` dataset. The chains and their split into the
categories, both readings of goodput and the exclusions: tasks/window/chains.py.

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
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tasks.data.arms import ARMS
from tasks.data.datasets import EVENTS, SAMPLES, TRIALS, UTILIZATION
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext
from tasks.data.store import normalise_dtypes, read_dataset, write_dataset
from tasks.data.weeks import week_label, week_start
from tasks.window.chains import CATEGORIES, Chain, classify_chains, epoch_s, paired_trials
from tasks.window.intervals import Interval, intersect, length_s, union

# GPU-hours per (arm, week) besides the categories (tasks/window/chains.py: two readings,
# exclusions): the job span's queue, the lost step in flight, what the exclusions removed.
EXTRA_GPU_H = ("queued", "unfinished_step", "excluded")
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


# --- all chains → rows --------------------------------------------------------------------


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
        t_from, t_to = epoch_s(rows["t_from"]), epoch_s(rows["t_to"])
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


@dataclass
class _ArmWeek:
    """What the chains put into one (arm, week): GPU-hours by name, attempts, chains."""

    gpu_h: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    jobs: int = 0
    alloc_ivs: dict[str, list[Interval]] = field(default_factory=lambda: defaultdict(list))
    chains: set[tuple[str, str]] = field(default_factory=set)
    open_chains: set[tuple[str, str]] = field(default_factory=set)


def _add_chain(acc: dict[tuple[str, str], _ArmWeek], chain: Chain) -> None:
    gpu_h = chain.gpus / 3600
    for label, ivs in split_by_week(chain.allocated).items():
        week = acc[(chain.arm, label)]
        week.gpu_h["allocated"] += length_s(ivs) * gpu_h
        week.alloc_ivs[chain.trial_id] += ivs
        week.jobs += sum(1 for att in chain.attempts if length_s(intersect([att], ivs)) > 0)
    sets = {
        **chain.parts,
        "queued": chain.queued,
        "unfinished_step": chain.unfinished_lost,
        "excluded": chain.excluded,
    }
    for name, ivs in sets.items():
        for label, pieces in split_by_week(ivs).items():
            acc[(chain.arm, label)].gpu_h[name] += length_s(pieces) * gpu_h
    for label in split_by_week(union(chain.allocated + chain.queued + chain.excluded)):
        week = acc[(chain.arm, label)]
        week.chains.add((chain.run_id, chain.trial_id))
        if not chain.ended:
            week.open_chains.add((chain.run_id, chain.trial_id))


def utilization_rows(
    events: pd.DataFrame,
    trials: pd.DataFrame | None = None,
    samples: pd.DataFrame | None = None,
    *,
    workload: str,
    default_gpus: int,
    week: str | None = None,
    exclusions: Sequence[Interval] = (),
    computed_at: dt.datetime | None = None,
) -> pd.DataFrame:
    """The `utilization` rows (without poc, run_id and fp_*) of ``events``: per arm and ISO
    week, for ``workload`` (a plan names one workload: every chain is its). ``week``: only
    that week's rows; ``exclusions``: (start, end) POSIX seconds cut out of every chain."""
    computed_at = computed_at or dt.datetime.now(dt.UTC)
    if week is not None:
        week_start(week)  # refuse a malformed week before any work
    acc: dict[tuple[str, str], _ArmWeek] = defaultdict(_ArmWeek)
    for chain in classify_chains(events, trials, default_gpus=default_gpus, exclusions=exclusions):
        _add_chain(acc, chain)
    # A week asked for is written even with nothing allocated: both arms, jobs 0, null goodput.
    weeks = [week] if week is not None else sorted({label for _, label in acc})
    rows = []
    for label in weeks:
        starts_at = week_start(label)
        for arm in sorted(ARMS):  # managed first: the order its rows have always had
            got = acc.get((arm, label), _ArmWeek())
            gpu_h = got.gpu_h
            allocated, delivered = gpu_h.get("allocated", 0.0), gpu_h.get("delivered", 0.0)
            span = allocated + gpu_h.get("queued", 0.0)
            busy, metric, n = _busy(samples, workload, arm, got.alloc_ivs)
            rows.append(
                {
                    "week": label,
                    "week_start": starts_at,
                    "arm": arm,
                    "workload": workload,
                    "jobs": got.jobs,
                    "allocated_gpu_h": allocated,
                    **{f"{c}_gpu_h": gpu_h.get(c, 0.0) for c in CATEGORIES},
                    "goodput": delivered / allocated if allocated > 0 else None,
                    **{f"{c}_gpu_h": gpu_h.get(c, 0.0) for c in EXTRA_GPU_H},
                    "goodput_job_span": delivered / span if span > 0 else None,
                    "chains": len(got.chains),
                    "chains_open": len(got.open_chains),
                    "provisional": bool(got.open_chains),
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
    """Read the PoC's committed events (the trials run on both arms), trials and samples,
    compute the utilization rows (``week``: that ISO week only), the plan's exclusions cut
    out, stamp them with the run and write them (atomically).
    Returns the rows written; the caller commits the run."""
    where = {"data_dir": ctx.data_dir, "poc": ctx.poc}
    rows = utilization_rows(
        paired_trials(read_dataset(EVENTS, **where, columns=EVENT_COLUMNS)),
        read_dataset(TRIALS, **where, columns=("run_id", "trial_id", "arm", "gpus")),
        read_dataset(SAMPLES, **where, columns=SAMPLE_COLUMNS),
        workload=plan.workload.name,
        default_gpus=plan.workload.gpus,
        week=week,
        exclusions=[x.interval for x in plan.exclusions],
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
