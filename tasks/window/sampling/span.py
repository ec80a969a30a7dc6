"""One sampler run: a span of reads on each node, written atomically, gaps made rows.

The schedule in prefect.yaml starts a run every span; each run:

1. salvages what a killed sampler run flushed (its part files are complete parquet files:
   the run is committed with outcome ``killed`` so they count), then finds, per node, where
   the committed samples and gaps end and records the stretch up to its own first read as a
   **gap row** with the reason (a run that stopped, or no run at all);
2. reads every ``interval_s`` on a monotonic schedule. Row times are the run's first wall
   time plus CLOCK_MONOTONIC offsets: a wall clock stepped backwards never makes a row end
   before it starts, and consecutive rows tile the span exactly;
3. flushes its buffer every ``flush_s`` as a new part file (temp + rename) and commits the
   run last. A kill loses at most one flush interval, which the next run records as a gap.

A sample is written once: each read's rows go to exactly one part file, and a later run
starts after the last row any run wrote. One sampler per node at a time (a node lock
apart from the experiments' locks: sampling runs while experiments do).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import zoneinfo
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.compute as pc
import pyarrow.dataset as pads

from tasks.data.datasets import SAMPLE_GAPS, SAMPLES, DatasetSpec
from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext
from tasks.data.runs import commit_run, uncommitted_runs
from tasks.data.store import dataset_files, write_dataset
from tasks.data.weeks import WEEK_PARTITION, week_label
from tasks.window.sampling import Backend, GapRow, SampleRow, gap_row

STAGE = "sample_window"
FLUSH_S = 300.0
# How far back the next run looks for where the last one ended: a sampler silent for longer
# than this is one gap from the window start (or this far back) instead.
LOOKBACK_WEEKS = 3


class SamplingError(CkptPocError):
    pass


@dataclass(frozen=True, slots=True)
class SampleRun:
    """One sampler run committed: the nodes read, the rows and part files written."""

    run_id: str
    nodes: list[str]
    reads: int
    samples: int  # rows written
    gaps: int  # gap rows written
    parts: int
    salvaged_runs: list[str]  # killed runs whose flushed parts this one committed
    from_: str  # ISO times of the span
    to: str
    data_dir: str

    # a dict: the span's start under its JSON key, `from` (a keyword in Python)
    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "nodes": self.nodes,
            "reads": self.reads,
            "samples": self.samples,
            "gaps": self.gaps,
            "parts": self.parts,
            "salvaged_runs": self.salvaged_runs,
            "from": self.from_,
            "to": self.to,
            "data_dir": self.data_dir,
        }


def salvage_killed_runs(data_dir: Path, poc: str) -> list[str]:
    """Commit the flushed parts of sampler runs that died before committing."""
    salvaged = []
    for run in uncommitted_runs(data_dir, poc):
        if run.stage == STAGE and not run.alive and run.files:
            commit_run(data_dir, poc, run.run_id, STAGE, "killed: rows up to its last flush kept")
            salvaged.append(run.run_id)
    return salvaged


def _recent_files(data_dir: Path, poc: str, spec: DatasetSpec, now: dt.datetime) -> list[str]:
    labels = {
        f"{WEEK_PARTITION}={week_label(now - dt.timedelta(weeks=k))}"
        for k in range(LOOKBACK_WEEKS + 1)
    }
    return [f for f in dataset_files(data_dir, poc, spec) if Path(f).parent.name in labels]


def covered_until(
    data_dir: Path, poc: str, node: str, source: str, now: dt.datetime
) -> dt.datetime | None:
    """Where the committed samples and gaps of ``node`` (from ``source``) end."""
    ends: list[dt.datetime] = []
    for spec in (SAMPLES, SAMPLE_GAPS):
        files = _recent_files(data_dir, poc, spec, now)
        if not files:
            continue
        ds = pads.dataset(files, schema=spec.arrow_schema, format="parquet")
        flt = (pc.field("node") == node) & (pc.field("source") == source)
        t_to = ds.to_table(columns=["t_to"], filter=flt).column("t_to")
        if len(t_to):
            ends.append(pc.max(t_to).as_py())
    return max(ends) if ends else None


def window_start(plan: Plan) -> dt.datetime:
    tz = zoneinfo.ZoneInfo(plan.window.schedules.timezone)
    start = dt.datetime.combine(plan.window.start, dt.time(), tzinfo=tz)
    return start.astimezone(dt.UTC)


def first_sampled(data_dir: Path, poc: str) -> dt.datetime | None:
    """Where the PoC's committed samples and gaps begin, any node (None: nothing yet)."""
    starts: list[dt.datetime] = []
    for spec in (SAMPLES, SAMPLE_GAPS):
        files = dataset_files(data_dir, poc, spec)
        if files:
            ds = pads.dataset(files, schema=spec.arrow_schema, format="parquet")
            t_from = ds.to_table(columns=["t_from"]).column("t_from")
            if len(t_from):
                starts.append(pc.min(t_from).as_py())
    return min(starts) if starts else None


def window_opens(plan: Plan, data_dir: Path, first_read: dt.datetime) -> dt.datetime:
    """When the window opened: its start day's midnight in the plan's time zone; a window
    that starts ``today`` (relative to the PoC's anchor day) opens at the PoC's first sample
    instead: nothing before the PoC began sampling was due (tasks/data/plan_dates.py)."""
    start = window_start(plan)
    if not plan.dates.window_opens_at_first_sample:
        return start
    return max(start, first_sampled(data_dir, plan.poc) or first_read)


def opening_gap(
    plan: Plan,
    data_dir: Path,
    node: str,
    source: str,
    first_read: dt.datetime,
    salvaged: list[str],
) -> GapRow | None:
    """The stretch between the last committed row and this run's first read, as a gap."""
    previous = covered_until(data_dir, plan.poc, node, source, first_read)
    if previous is None:
        opens = window_opens(plan, data_dir, first_read)
        start = max(opens, first_read - dt.timedelta(weeks=LOOKBACK_WEEKS))
        if start >= first_read:
            return None  # the window has not started: nothing is missing yet
        reason = f"no sampler run covered this stretch (first run since {start:%Y-%m-%d %H:%M})"
        return gap_row(
            node=node,
            source=source,
            t_from=start,
            t_to=first_read,
            reason=reason,
            detected_by="next_run",
        )
    if previous >= first_read:
        return None
    if salvaged:
        reason = (
            f"sampler run(s) {', '.join(salvaged)} stopped without finishing (killed or "
            "crashed): rows after their last flush are lost"
        )
    else:
        reason = "no sampler run covered this stretch (between runs, late, or not running)"
    return gap_row(
        node=node,
        source=source,
        t_from=previous,
        t_to=first_read,
        reason=reason,
        detected_by="next_run",
    )


@dataclass
class SpanWriter:
    """Buffers rows and writes them as numbered part files of the run."""

    ctx: RunContext
    parts: int = 0
    rows_written: dict[str, int] = field(default_factory=lambda: {"samples": 0, "gaps": 0})
    samples: list[SampleRow] = field(default_factory=list)
    gaps: list[GapRow] = field(default_factory=list)

    def _frame(self, rows: list[dict[str, Any]], spec: DatasetSpec) -> pd.DataFrame:
        frame = pd.DataFrame(rows)
        for key, value in self.ctx.stamp().items():
            frame[key] = value
        return frame[spec.column_names]

    def flush(self) -> None:
        for rows, spec, name in (
            (self.samples, SAMPLES, "samples"),
            (self.gaps, SAMPLE_GAPS, "gaps"),
        ):
            if not rows:
                continue
            self.parts += 1
            write_dataset(
                self._frame(rows, spec),
                spec,
                data_dir=self.ctx.data_dir,
                poc=self.ctx.poc,
                run_id=self.ctx.run_id,
                part=self.parts,
                metadata=self.ctx.file_metadata,
            )
            self.rows_written[name] += len(rows)
            rows.clear()


def run_span(
    plan: Plan,
    ctx: RunContext,
    backends: Mapping[str, Backend],
    *,
    span_s: float,
    interval_s: float,
    flush_s: float = FLUSH_S,
    stop: threading.Event | None = None,
    on_read: Callable[[int], None] | None = None,
) -> SampleRun:
    """Sample every node's backend for ``span_s`` seconds, then commit the run."""
    unknown = sorted(set(backends) - set(plan.cluster.nodes))
    if unknown:
        raise SamplingError(f"nodes {unknown} are not the plan's nodes {plan.cluster.nodes}")
    stop = stop or threading.Event()
    salvaged = salvage_killed_runs(ctx.data_dir, ctx.poc)
    writer = SpanWriter(ctx)
    # The first read primes every backend (CPU counters, driver timestamps): rows start here.
    mono0, wall0 = time.monotonic(), dt.datetime.now(dt.UTC)
    writer.gaps.extend(_prime(backends, wall0))
    for node, backend in backends.items():
        gap = opening_gap(plan, ctx.data_dir, node, backend.source, wall0, salvaged)
        if gap is not None:
            writer.gaps.append(gap)
    last_t = wall0
    reads, last_flush = 0, mono0
    deadline = mono0 + span_s
    while not stop.is_set():
        next_read = mono0 + (reads + 1) * interval_s
        if next_read > deadline + 1e-9:
            break
        if stop.wait(max(0.0, next_read - time.monotonic())):
            break
        read = [_read_or_gap(node, backend, last_t) for node, backend in backends.items()]
        # One end time per round, so each node's rows tile the span without slivers.
        t_to = wall0 + dt.timedelta(seconds=time.monotonic() - mono0)
        _place_round(read, last_t, t_to, writer)
        last_t = t_to
        reads += 1
        if on_read is not None:
            on_read(reads)
        if time.monotonic() - last_flush >= flush_s:
            writer.flush()
            last_flush = time.monotonic()
    writer.flush()
    for backend in backends.values():
        backend.close()
    ctx.ends_as("complete" if not stop.is_set() else "stopped early")
    return SampleRun(
        run_id=ctx.run_id,
        nodes=sorted(backends),
        reads=reads,
        samples=writer.rows_written["samples"],
        gaps=writer.rows_written["gaps"],
        parts=writer.parts,
        salvaged_runs=salvaged,
        from_=wall0.isoformat(),
        to=last_t.isoformat(),
        data_dir=str(ctx.data_dir),
    )


def _read_or_gap(
    node: str, backend: Backend, at: dt.datetime
) -> tuple[list[SampleRow], list[GapRow]]:
    """One read of the node's backend; one that cannot read (unsupported metrics, a lost
    GPU) gives a gap row instead, its times ``at`` until the round's end is known."""
    try:
        return backend.read()
    except CkptPocError as exc:
        gap = gap_row(
            node=node,
            source=backend.source,
            t_from=at,
            t_to=at,
            reason=str(exc),
            detected_by="sampler",
        )
        return [], [gap]


def _prime(backends: Mapping[str, Backend], wall0: dt.datetime) -> list[GapRow]:
    """The first read of every backend (CPU counters, driver timestamps): its rows cover
    nothing yet; its gaps, at ``wall0`` and 0 s long, say what cannot be read."""
    primed: list[GapRow] = []
    for node, backend in backends.items():
        _, gaps = _read_or_gap(node, backend, wall0)
        for gap in gaps:
            gap["t_from"] = gap["t_to"] = wall0
            gap["gap_s"] = 0.0
        primed.extend(gaps)
    return primed


def _place_round(
    read: list[tuple[list[SampleRow], list[GapRow]]],
    t_from: dt.datetime,
    t_to: dt.datetime,
    writer: SpanWriter,
) -> None:
    """Give one round's rows and gaps its times [t_from, t_to] and buffer them."""
    for rows, gaps in read:
        for row in rows:
            row["t_from"], row["t_to"] = t_from, t_to
        for gap in gaps:
            gap["t_from"], gap["t_to"] = t_from, t_to
            gap["gap_s"] = (t_to - t_from).total_seconds()
        writer.samples.extend(rows)
        writer.gaps.extend(gaps)
