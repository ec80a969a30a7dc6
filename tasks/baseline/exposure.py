"""Baseline exposure from parsed accounting: what failures and time limits cost today.

Per final state of each allocation (every attempt of a requeued job counts): allocations,
node-hours and GPU-hours (elapsed × gres/gpu / 3600). Exposed GPU-hours are those of states
where the work was interrupted; resubmission chains show the work users redo by hand.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tasks.baseline.fields import normalise_state
from tasks.data.jsonform import JsonForm
from tasks.data.slurm_states import NO_STATE, UNKNOWN_STATE

EXPOSED_STATES = (
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
)
REPORTED_APART = ("CANCELLED", "REQUEUED")
CHAIN_GAP_US = 24 * 3600 * 10**6  # a resubmission follows the failure within 24 h
# Columns of the jobs dataset that exposure reads.
EXPOSURE_INPUT_COLUMNS = (
    "cluster",
    "job_id",
    "job_id_raw",
    "user",
    "account",
    "job_name",
    "state",
    "state_raw",
    "submit",
    "start",
    "end",
    "elapsed_s",
    "nnodes",
    "gpus",
)
# Two rows with the same values here are the same attempt captured twice (e.g. live sacct
# queried in day chunks reports a multi-day job once per day).
DUPLICATE_KEY = ("cluster", "job_id", "submit", "start", "end", "state_raw")

LIMITATIONS = (
    "A job that reached its time limit did not necessarily lose all of its work: these "
    "numbers show where loss is concentrated, not how much was lost.",
    "The application's own checkpoints are invisible in accounting data: a failed job that "
    "resumed from its own checkpoint counts as fully exposed here.",
    "A cancellation is ambiguous (a user fixing a mistake, or work abandoned after a hang): "
    "CANCELLED is reported apart and not counted as exposed.",
    "REQUEUED attempts are reported apart: Slurm restarted them, so their loss depends on "
    "whether the job resumes from a checkpoint.",
    "Resubmission chains are inferred from (user, account, job name) and submit times within "
    "24 h of a non-COMPLETED end; an attempt requeued under the same job id is not a "
    "resubmission.",
)


@dataclass(frozen=True)
class Exposure:
    by_state: pd.DataFrame  # index: state; allocations, node_hours, gpu_hours
    exposed_gpu_hours: float
    timeout_gpu_hours: float
    chains: list[list[str]]
    candidates: pd.DataFrame  # ranked workloads
    duplicates_ignored: int
    window: tuple[pd.Timestamp | None, pd.Timestamp | None]
    # Measure → "the dump lacks X, Y" (tasks.baseline.accounting.not_computed): such a measure is
    # null in the summary, never a zero.
    not_computed: dict[str, str] = field(default_factory=dict)

    def summary(
        self, rows_read: int, rows_quarantined: int, time_formats: Mapping[str, str], short: int
    ) -> BaselineSummary:
        """The --json summary: the keys the CLI promises, and how the dump was read."""
        bs = self.by_state

        def measured(key: str, value: Any) -> Any:
            return None if key in self.not_computed else value

        return BaselineSummary(
            rows_read=int(rows_read),
            rows_quarantined=int(rows_quarantined),
            allocations_by_state={s: int(v) for s, v in bs["allocations"].items()},
            node_hours_by_state=measured(
                "node_hours_by_state", {s: float(v) for s, v in bs["node_hours"].items()}
            ),
            gpu_hours_by_state=measured(
                "gpu_hours_by_state", {s: float(v) for s, v in bs["gpu_hours"].items()}
            ),
            exposed_gpu_hours=measured("exposed_gpu_hours", float(self.exposed_gpu_hours)),
            timeout_gpu_hours=measured("timeout_gpu_hours", float(self.timeout_gpu_hours)),
            chains=measured("chains", tuple(tuple(c) for c in self.chains)),
            not_computed=dict(self.not_computed),
            time_formats=dict(time_formats),
            rows_short_of_fields=int(short),
        )


@dataclass(frozen=True, slots=True)
class BaselineSummary(JsonForm):
    """The baseline's summary (`--json`). A measure the dump cannot give is None (null),
    never a zero; ``not_computed`` says why."""

    rows_read: int
    rows_quarantined: int
    allocations_by_state: Mapping[str, int]  # final state → allocations
    node_hours_by_state: Mapping[str, float] | None
    gpu_hours_by_state: Mapping[str, float] | None
    exposed_gpu_hours: float | None
    timeout_gpu_hours: float | None
    chains: tuple[tuple[str, ...], ...] | None  # resubmission chains, by job id
    not_computed: Mapping[str, str]  # measure → "the dump lacks X, Y"
    time_formats: Mapping[str, str]  # time field → the format it was read in
    rows_short_of_fields: int


Jobs = pa.Table | pd.DataFrame


def as_table(jobs: Jobs) -> pa.Table:
    return jobs if isinstance(jobs, pa.Table) else pa.Table.from_pandas(jobs, preserve_index=False)


def allocations_only(jobs: Jobs) -> tuple[pa.Table, int]:
    """Allocation rows (not steps), exact duplicate captures dropped; (rows, duplicates)."""
    table = as_table(jobs)
    # Select first: filtering copies every column it keeps.
    table = table.select(
        [c for c in (*EXPOSURE_INPUT_COLUMNS, "is_allocation") if c in table.column_names]
    )
    if "is_allocation" in table.column_names:
        is_alloc = pc.fill_null(table.column("is_allocation"), False)
        if not pc.all(is_alloc).as_py():
            table = table.filter(is_alloc)
        table = table.drop_columns("is_allocation")
    table = table.unify_dictionaries()
    if table.num_rows == 0:
        return table, 0
    # Only rows whose raw job id repeats can be duplicate captures (or requeue attempts):
    # group just those on the full key, which is far cheaper than grouping every row.
    suspect = pa.array(_repeats(table.column("job_id_raw")))
    if not pc.any(suspect).as_py():
        return table, 0
    rows = pa.array(np.arange(table.num_rows))
    keyed = table.filter(suspect).append_column("_row", rows.filter(suspect))
    first = keyed.group_by(list(DUPLICATE_KEY), use_threads=False).aggregate([("_row", "min")])
    duplicates = keyed.num_rows - first.num_rows
    if duplicates:
        drop = pc.invert(pc.is_in(keyed.column("_row"), first.column("_row_min")))
        keep = pc.invert(pc.is_in(rows, keyed.column("_row").filter(drop)))
        table = table.filter(keep)
    return table, duplicates


def _numeric_ids(col: pa.ChunkedArray) -> np.ndarray | None:
    """Raw job ids as int64 when they all are numbers (sacct's always are), else None."""
    try:
        return pc.cast(col, pa.int64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _repeats(col: pa.ChunkedArray) -> np.ndarray:
    """Mask of rows whose value occurs more than once."""
    ids = _numeric_ids(col)
    return _repeated_numbers(ids if ids is not None and not col.null_count else _codes(col)[0])


def _repeated_numbers(values: np.ndarray) -> np.ndarray:
    """Mask of the values that occur more than once. Slurm numbers jobs in sequence, so their
    ids span a range not much wider than their count: a count per id in that range (at 5 M
    rows 40 MB) instead of a hash table (pandas' duplicated: a few times that, and slower)."""
    if values.size == 0:
        return np.zeros(0, dtype=bool)
    low, high = int(values.min()), int(values.max())
    if high - low >= 4 * values.size + (1 << 16):
        return pd.Series(values).duplicated(keep=False).to_numpy()
    offsets = values - low
    counts = np.bincount(offsets, minlength=high - low + 1)
    return counts[offsets] > 1


def _codes(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[Any]]:
    """Integer codes and the distinct values they index (nulls share one code)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    values = arr.dictionary.to_pylist()
    codes = pc.fill_null(arr.indices, len(values)).to_numpy(zero_copy_only=False)
    return codes.astype(np.int64), [*values, None]


def _numbers(table: pa.Table, name: str) -> np.ndarray:
    return pc.fill_null(table.column(name), 0).to_numpy().astype(np.float64)


def _epoch_us(table: pa.Table, name: str) -> np.ndarray:
    """Microseconds since the epoch; missing times become NaT-like int64 min."""
    col = pc.cast(table.column(name), pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return pc.fill_null(col, np.iinfo(np.int64).min).to_numpy()


@dataclass(frozen=True)
class _Hours:
    state_codes: np.ndarray
    states: list[Any]
    node_hours: np.ndarray
    gpu_hours: np.ndarray


def state_codes(alloc: pa.Table) -> tuple[np.ndarray, list[Any]]:
    """Codes and names of each allocation's final state; a state sacct does not document
    (``state`` UNKNOWN) goes under its own name, read from ``state_raw``; one of a dump
    without State (``state_raw`` empty) under NO_STATE."""
    codes, states = _codes(alloc.column("state"))
    if UNKNOWN_STATE not in states or "state_raw" not in alloc.column_names:
        return codes, states
    raw_codes, raw_states = _codes(alloc.column("state_raw"))
    index: dict[Any, int] = {}
    known = np.array([index.setdefault(s, len(index)) for s in states], dtype=np.int64)
    named = np.array(
        [index.setdefault(normalise_state(s) or NO_STATE, len(index)) for s in raw_states],
        dtype=np.int64,
    )
    unknown = codes == states.index(UNKNOWN_STATE)
    return np.where(unknown, named[raw_codes], known[codes]), list(index)


def _hours(alloc: pa.Table) -> _Hours:
    elapsed = _numbers(alloc, "elapsed_s")
    codes, states = state_codes(alloc)
    return _Hours(
        codes,
        states,
        elapsed * _numbers(alloc, "nnodes") / 3600.0,
        elapsed * _numbers(alloc, "gpus") / 3600.0,
    )


def exposure_by_state(alloc: pa.Table, hours: _Hours | None = None) -> pd.DataFrame:
    h = hours or _hours(alloc)
    k = len(h.states)
    out = pd.DataFrame(
        {
            "allocations": np.bincount(h.state_codes, minlength=k).astype(np.int64),
            "node_hours": np.bincount(h.state_codes, h.node_hours, minlength=k),
            "gpu_hours": np.bincount(h.state_codes, h.gpu_hours, minlength=k),
        },
        index=pd.Index([str(s) for s in h.states], name="state"),
    )
    return out[out["allocations"] > 0].sort_index()


def _workload_key(table: pa.Table, columns: tuple[str, ...]) -> np.ndarray:
    """One int64 per distinct combination of the columns (sortable, comparable)."""
    key = np.zeros(table.num_rows, dtype=np.int64)
    for name in columns:
        codes, values = _codes(table.column(name))
        if key.max(initial=0) >= (1 << 62) // len(values):
            # Re-densify so the product of cardinalities never overflows int64.
            key = np.unique(key, return_inverse=True)[1].astype(np.int64)
        key = key * len(values) + codes
    return key


def find_chains(alloc: Jobs) -> tuple[list[list[str]], np.ndarray, list[int]]:
    """Resubmission chains in submit order, each allocation's chain number (-1: none), and
    each chain's first submit time (epoch µs) so chains from several partitions can merge.

    A later allocation of the same (user, account, job name) continues a chain when it was
    submitted within 24 h after the previous one ended in a state other than COMPLETED.
    Attempts of one job id (requeues) stay in one link of the chain.
    """
    alloc = as_table(alloc)
    n = alloc.num_rows
    chain_of = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return [], chain_of, []
    missing = np.iinfo(np.int64).min
    submit, end = _epoch_us(alloc, "submit"), _epoch_us(alloc, "end")
    key = _workload_key(alloc, ("user", "account", "job_name"))
    state_codes, states = _codes(alloc.column("state"))
    completed = np.array([s == "COMPLETED" for s in states])[state_codes]
    sort_submit = np.where(submit == missing, np.iinfo(np.int64).max, submit)
    order = np.lexsort((sort_submit, key))
    # Each full-length temporary is dropped once used: at 5 M allocations each is 40 MB.
    del sort_submit
    ok = completed[order]
    del completed
    same_key = np.zeros(n, dtype=bool)
    k = key[order]
    del key
    same_key[1:] = k[1:] == k[:-1]
    del k
    s, e = submit[order], end[order]
    del submit, end
    same_job = _same_job(alloc, order, same_key)
    # A resubmission: same key, the previous one did not complete, submitted 0-24 h after
    # it ended (both times known).
    gap = s[1:] - e[:-1]
    follows = (gap >= 0) & (gap <= CHAIN_GAP_US)
    del gap
    follows &= (s[1:] != missing) & (e[:-1] != missing) & ~ok[:-1]
    del e, ok
    link = same_job.copy()
    link[1:] |= same_key[1:] & follows
    del follows, same_key
    group = np.cumsum(~link) - 1  # contiguous and increasing in sorted order
    del link
    # A chain is a linked group holding at least two distinct job ids.
    distinct_jobs = np.bincount(group[~same_job], minlength=int(group[-1]) + 1)
    in_chain = np.flatnonzero(distinct_jobs[group] >= 2)  # sorted positions
    del distinct_jobs
    group = group[in_chain]
    members = ~same_job[in_chain]
    del same_job
    chain_groups, starts = np.unique(group[members], return_index=True)
    if not len(starts):
        return [], chain_of, []
    member_rows = order[in_chain[members]]
    # Chains in the order their first allocation was submitted; each a slice of the members'
    # ids (np.split made an array per chain: a second for 344 k chains).
    first_submit = s[in_chain[members]][starts]
    del s
    by_time = np.argsort(first_submit, kind="stable")
    rank_of_group = np.empty(len(chain_groups), dtype=np.int64)
    rank_of_group[by_time] = np.arange(len(chain_groups))
    # Every linked group of a chain holds a member: its group is among chain_groups.
    chain_of[order[in_chain]] = rank_of_group[np.searchsorted(chain_groups, group)]
    del order, in_chain, group, members, rank_of_group, chain_groups
    ids = pc.cast(alloc.column("job_id"), pa.string()).take(pa.array(member_rows)).to_pylist()
    del member_rows
    ends = [*starts[1:].tolist(), len(ids)]
    bounds = starts.tolist()
    return (
        [ids[bounds[i] : ends[i]] for i in by_time.tolist()],
        chain_of,
        first_submit[by_time].tolist(),
    )


def _same_job(alloc: pa.Table, order: np.ndarray, same_key: np.ndarray) -> np.ndarray:
    """Which allocations, in ``order``, are another attempt (a requeue) of the one before:
    the same workload key, raw job id and cluster."""
    raw_ids = _numeric_ids(alloc.column("job_id_raw"))
    raw = raw_ids[order] if raw_ids is not None else _codes(alloc.column("job_id_raw"))[0][order]
    same_job = np.zeros(len(order), dtype=bool)
    same_job[1:] = same_key[1:] & (raw[1:] == raw[:-1])
    del raw, raw_ids
    cluster_codes, clusters = _codes(alloc.column("cluster"))
    # Compared only where there can be two: _codes lists the nulls' code last.
    if len(clusters) - 1 > 1 or alloc.column("cluster").null_count:
        cluster = cluster_codes[order]
        same_job[1:] &= cluster[1:] == cluster[:-1]
    return same_job


def rank_candidates(
    alloc: pa.Table, chain_of: np.ndarray, top: int | None = 20, hours: _Hours | None = None
) -> pd.DataFrame:
    """Workloads (account, job name) ranked by exposed GPU-hours, then by recurrence."""
    h = hours or _hours(alloc)
    workload, accounts = _codes(alloc.column("account"))
    name, names = _codes(alloc.column("job_name"))
    workload *= len(names)  # in place: at 5 M rows each row-length copy is 40 MB
    workload += name
    del name
    keys, inverse = _dense(workload)
    del workload
    k = len(keys)
    exposed_state = np.array([s in EXPOSED_STATES for s in h.states])[h.state_codes]
    timeout_state = np.array([s == "TIMEOUT" for s in h.states])[h.state_codes]
    in_chain = chain_of >= 0
    # A workload's chains: its distinct (workload, chain) pairs, as one int64 each.
    span = int(chain_of.max(initial=0)) + 1
    chain_workloads = np.unique(inverse[in_chain] * span + chain_of[in_chain]) // span
    out = pd.DataFrame(
        {
            "workload": [f"{accounts[c // len(names)]}/{names[c % len(names)]}" for c in keys],
            "allocations": np.bincount(inverse, minlength=k).astype(np.int64),
            "node_hours": np.bincount(inverse, h.node_hours, minlength=k),
            "gpu_hours": np.bincount(inverse, h.gpu_hours, minlength=k),
            # Over the rows in the state, not all rows weighted 0 or 1: no row-length copies.
            "exposed_gpu_hours": np.bincount(
                inverse[exposed_state], h.gpu_hours[exposed_state], minlength=k
            ),
            "timeout_gpu_hours": np.bincount(
                inverse[timeout_state], h.gpu_hours[timeout_state], minlength=k
            ),
            "exposed_allocations": np.bincount(inverse, exposed_state, minlength=k).astype(
                np.int64
            ),
            "chains": np.bincount(chain_workloads, minlength=k).astype(np.int64),
        }
    )
    if top is None:  # a part's: combine_parts keeps and ranks them once all are in
        return out.assign(rank=0)
    return order_candidates(out, top)


def _dense(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(codes, return_inverse=True) for codes below a few million: a count per code
    instead of a sort of every row (at 5 M rows a second, and three row-length copies)."""
    top = int(codes.max(initial=-1)) + 1
    if codes.size == 0 or top > max(1 << 22, codes.size):
        keys, inverse = np.unique(codes, return_inverse=True)
        return keys, inverse.reshape(-1)
    present = np.bincount(codes, minlength=top) > 0
    keys = np.flatnonzero(present)
    dense = np.cumsum(present, dtype=np.int64) - 1
    return keys, dense[codes]


def order_candidates(
    cands: pd.DataFrame, top: int | None, with_states: bool = True
) -> pd.DataFrame:
    """Keep workloads with exposure, rank by exposed GPU-hours, then recurrence. Without
    states (a dump lacking State) there is no exposure: every workload, by GPU-hours."""
    if with_states:
        keys = ["exposed_gpu_hours", "exposed_allocations", "chains", "workload"]
        kept = cands[cands["exposed_allocations"] > 0]
    else:
        keys = ["gpu_hours", "node_hours", "allocations", "workload"]
        kept = cands
    out = kept.sort_values(keys, ascending=[False, False, False, True], kind="stable")
    if top is not None:
        out = out.head(top)
    out = out.reset_index(drop=True)
    out["rank"] = np.arange(1, len(out) + 1)
    return out


def _time_bound(alloc: pa.Table, name: str, fn: str) -> pd.Timestamp | None:
    if alloc.num_rows == 0:
        return None
    value = getattr(pc, fn)(alloc.column(name)).as_py()
    return pd.Timestamp(value) if value is not None else None


@dataclass(frozen=True)
class ExposurePart:
    """Exposure of one set of allocations holding every allocation of its (user, account,
    job name) keys; parts combine into the whole (the out-of-core path makes many)."""

    by_state: pd.DataFrame
    chains: list[tuple[int, list[str]]]  # (first submit µs, job ids)
    candidates: pd.DataFrame  # every workload, unranked
    duplicates: int
    window: tuple[pd.Timestamp | None, pd.Timestamp | None]


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while the chains are built: hundreds of thousands
    of small lists, none in a cycle, that each full collection would walk again (at 5 M rows
    0.5 of the 0.65 s building them took)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def exposure_part(jobs: Jobs, with_chains: bool = True) -> ExposurePart:
    """``with_chains=False`` where the dump lacks what chains need: none are looked for."""
    alloc, duplicates = allocations_only(jobs)
    if with_chains:
        with _collector_paused():
            chains, chain_of, first = find_chains(alloc)
            dated_chains = list(zip(first, chains, strict=True))
    else:
        dated_chains, chain_of = [], np.full(alloc.num_rows, -1, dtype=np.int64)
    hours = _hours(alloc)  # after the chains: not held through their peak (5 M rows: 100 MB)
    return ExposurePart(
        by_state=exposure_by_state(alloc, hours),
        chains=dated_chains,
        candidates=rank_candidates(alloc, chain_of, top=None, hours=hours),
        duplicates=duplicates,
        window=(_time_bound(alloc, "submit", "min"), _time_bound(alloc, "end", "max")),
    )


def combine_parts(parts: list[ExposurePart], top: int = 20, with_states: bool = True) -> Exposure:
    by_state = pd.concat([p.by_state for p in parts]).groupby(level=0).sum().sort_index()
    gpu = by_state["gpu_hours"]
    # In order of first submit; ties (same second) by job ids, so every path agrees.
    with _collector_paused():
        chains = [ids for _, ids in sorted(c for p in parts for c in p.chains)]
    # A workload (account, job name) can span parts, which are keyed by user too.
    cands = pd.concat([p.candidates for p in parts], ignore_index=True).drop(columns="rank")
    cands = cands.groupby("workload", as_index=False).sum()
    starts = [p.window[0] for p in parts if p.window[0] is not None]
    ends = [p.window[1] for p in parts if p.window[1] is not None]
    return Exposure(
        by_state=by_state,
        exposed_gpu_hours=float(gpu[gpu.index.isin(EXPOSED_STATES)].sum()),
        timeout_gpu_hours=float(gpu.get("TIMEOUT", 0.0)),
        chains=chains,
        candidates=order_candidates(cands, top, with_states),
        duplicates_ignored=sum(p.duplicates for p in parts),
        window=(min(starts) if starts else None, max(ends) if ends else None),
    )


def compute_exposure(jobs: Jobs, with_chains: bool = True, with_states: bool = True) -> Exposure:
    return combine_parts([exposure_part(jobs, with_chains)], with_states=with_states)
