"""Baseline exposure from parsed accounting: what failures and time limits cost today.

Per final state of each allocation (every attempt of a requeued job counts): allocations,
node-hours and GPU-hours (elapsed × gres/gpu / 3600). Exposed GPU-hours are those of states
where the work was interrupted; resubmission chains show the work users redo by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

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
CHAIN_GAP = pd.Timedelta(hours=24)
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

    def summary(self, rows_read: int, rows_quarantined: int) -> dict[str, Any]:
        """The JSON summary, with exactly the keys the CLI promises."""
        bs = self.by_state
        return {
            "rows_read": int(rows_read),
            "rows_quarantined": int(rows_quarantined),
            "allocations_by_state": {s: int(v) for s, v in bs["allocations"].items()},
            "node_hours_by_state": {s: float(v) for s, v in bs["node_hours"].items()},
            "gpu_hours_by_state": {s: float(v) for s, v in bs["gpu_hours"].items()},
            "exposed_gpu_hours": float(self.exposed_gpu_hours),
            "timeout_gpu_hours": float(self.timeout_gpu_hours),
            "chains": self.chains,
        }


def allocations_only(jobs: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Allocation rows (not steps), exact duplicate captures dropped; (rows, duplicates)."""
    alloc = jobs[jobs["is_allocation"].astype(bool)] if "is_allocation" in jobs else jobs
    dup = alloc.duplicated(list(DUPLICATE_KEY), keep="first")
    n_dup = int(dup.sum())
    return (alloc[~dup] if n_dup else alloc), n_dup


def _hours(alloc: pd.DataFrame) -> pd.DataFrame:
    elapsed = alloc["elapsed_s"].astype("int64").to_numpy()
    return pd.DataFrame(
        {
            "state": alloc["state"].astype(str).to_numpy(),
            "node_hours": elapsed * alloc["nnodes"].astype("int64").to_numpy() / 3600.0,
            "gpu_hours": elapsed * alloc["gpus"].astype("int64").to_numpy() / 3600.0,
        }
    )


def exposure_by_state(alloc: pd.DataFrame) -> pd.DataFrame:
    hours = _hours(alloc)
    grouped = hours.groupby("state", sort=True)
    out = grouped.agg(
        allocations=("state", "size"),
        node_hours=("node_hours", "sum"),
        gpu_hours=("gpu_hours", "sum"),
    )
    return out


def _codes(col: pd.Series) -> np.ndarray:
    return pd.factorize(col, use_na_sentinel=True)[0]


def find_chains(alloc: pd.DataFrame) -> tuple[list[list[str]], np.ndarray, list[int]]:
    """Resubmission chains in submit order, each allocation's chain number (-1: none), and
    each chain's first submit time (epoch µs) so chains from several partitions can merge.

    A later allocation of the same (user, account, job name) continues a chain when it was
    submitted within 24 h after the previous one ended in a state other than COMPLETED.
    Attempts of one job id (requeues) stay in one link of the chain.
    """
    n = len(alloc)
    chain_of = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return [], chain_of, []
    submit = alloc["submit"].astype("datetime64[us, UTC]").to_numpy(dtype="datetime64[us]")
    end = alloc["end"].astype("datetime64[us, UTC]").to_numpy(dtype="datetime64[us]")
    key = (
        _codes(alloc["user"]).astype(np.int64) * 1_000_003 + _codes(alloc["account"])
    ) * 1_000_003 + _codes(alloc["job_name"])
    job = _codes(alloc["job_id_raw"].astype(str) + "@" + alloc["cluster"].astype(str))
    state_ok = (alloc["state"].astype(str) == "COMPLETED").to_numpy()
    submit_i = submit.astype("int64")
    submit_i = np.where(np.isnat(submit), np.iinfo(np.int64).max, submit_i)
    order = np.lexsort((submit_i, key))
    k, s, e, j, ok = key[order], submit[order], end[order], job[order], state_ok[order]
    same_key = np.zeros(n, dtype=bool)
    same_key[1:] = k[1:] == k[:-1]
    same_job = np.zeros(n, dtype=bool)
    same_job[1:] = same_key[1:] & (j[1:] == j[:-1])
    gap = np.full(n, np.timedelta64("NaT"), dtype="timedelta64[us]")
    gap[1:] = s[1:] - e[:-1]
    prev_failed = np.zeros(n, dtype=bool)
    prev_failed[1:] = ~ok[:-1]
    resubmitted = (
        same_key
        & prev_failed
        & ~np.isnat(gap)
        & (gap >= np.timedelta64(0, "us"))
        & (gap <= CHAIN_GAP.to_timedelta64())
    )
    link = same_job | resubmitted
    group = np.cumsum(~link) - 1  # contiguous and increasing in sorted order
    # A chain is a linked group holding at least two distinct job ids.
    distinct_jobs = np.bincount(group, weights=(~same_job).astype(np.int64))
    in_chain = distinct_jobs[group] >= 2
    members = in_chain & ~same_job
    chain_groups, starts = np.unique(group[members], return_index=True)
    ids = alloc["job_id"].astype(str).to_numpy()[order][members]
    chains = [list(c) for c in np.split(ids, starts[1:])] if len(starts) else []
    # Chains in the order their first allocation was submitted.
    first_submit = submit_i[order][members][starts] if len(starts) else np.array([])
    by_time = np.argsort(first_submit, kind="stable")
    chains = [[str(x) for x in chains[i]] for i in by_time]
    rank_of_group = np.empty(len(chain_groups), dtype=np.int64)
    rank_of_group[by_time] = np.arange(len(chain_groups))
    pos = np.searchsorted(chain_groups, group)
    found = in_chain & (pos < len(chain_groups))
    chain_of[order[found]] = rank_of_group[pos[found]]
    return chains, chain_of, [int(first_submit[i]) for i in by_time]


def rank_candidates(
    alloc: pd.DataFrame, chain_of: np.ndarray, top: int | None = 20
) -> pd.DataFrame:
    """Workloads (account, job name) ranked by exposed GPU-hours, then by recurrence."""
    hours = _hours(alloc)
    exposed = hours["state"].isin(EXPOSED_STATES).to_numpy()
    frame = pd.DataFrame(
        {
            "workload": alloc["account"].astype(str).to_numpy()
            + "/"
            + alloc["job_name"].astype(str).to_numpy(),
            "allocations": 1,
            "node_hours": hours["node_hours"].to_numpy(),
            "gpu_hours": hours["gpu_hours"].to_numpy(),
            "exposed_gpu_hours": np.where(exposed, hours["gpu_hours"].to_numpy(), 0.0),
            "timeout_gpu_hours": np.where(
                hours["state"].to_numpy() == "TIMEOUT", hours["gpu_hours"].to_numpy(), 0.0
            ),
            "exposed_allocations": exposed.astype(np.int64),
            "chain": chain_of,
        }
    )
    g = frame.groupby("workload", sort=False)
    out = g.agg(
        allocations=("allocations", "sum"),
        node_hours=("node_hours", "sum"),
        gpu_hours=("gpu_hours", "sum"),
        exposed_gpu_hours=("exposed_gpu_hours", "sum"),
        timeout_gpu_hours=("timeout_gpu_hours", "sum"),
        exposed_allocations=("exposed_allocations", "sum"),
    )
    chained = frame[frame["chain"] >= 0].groupby("workload")["chain"].nunique()
    out["chains"] = chained.reindex(out.index).fillna(0).astype("int64")
    return order_candidates(out.reset_index(), top)


def order_candidates(cands: pd.DataFrame, top: int | None) -> pd.DataFrame:
    """Keep workloads with exposure, rank by exposed GPU-hours, then recurrence."""
    out = cands[cands["exposed_allocations"] > 0].sort_values(
        ["exposed_gpu_hours", "exposed_allocations", "chains", "workload"],
        ascending=[False, False, False, True],
        kind="stable",
    )
    if top is not None:
        out = out.head(top)
    out = out.reset_index(drop=True)
    out["rank"] = np.arange(1, len(out) + 1)
    return out


def compute_exposure(jobs: pd.DataFrame) -> Exposure:
    alloc, duplicates = allocations_only(jobs)
    by_state = exposure_by_state(alloc)
    gpu = by_state["gpu_hours"]
    chains, chain_of, _ = find_chains(alloc)
    submit = alloc["submit"].dropna()
    end = alloc["end"].dropna()
    return Exposure(
        by_state=by_state,
        exposed_gpu_hours=float(gpu[gpu.index.isin(EXPOSED_STATES)].sum()),
        timeout_gpu_hours=float(gpu.get("TIMEOUT", 0.0)),
        chains=chains,
        candidates=rank_candidates(alloc, chain_of),
        duplicates_ignored=duplicates,
        window=(submit.min() if len(submit) else None, end.max() if len(end) else None),
    )
