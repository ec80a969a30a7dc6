"""Seeded synthetic long window: `samples` and `sample_gaps` as the samplers would write them.

One simulated sampler run per node per day (run id ``sampler-<node>-<YYYYMMDD>``), written
with ``tasks.data.store.write_dataset`` into the real layout and committed with
``tasks.data.runs.commit_run`` so the readers see it. Each node has 8 GPUs sampled every 10 s
(``gpu_utilization``, percent; the interval jitters by up to 0.3 s so covered seconds
differ row to row). Per GPU the day is a sequence of phases (exponential lengths, mean 2 h):
a job of the managed or unmanaged arm (two workloads), unattributed busy time, or idle.
Busy phases start with a short low-utilisation warm-up. Some node-days lose a stretch (the
sampler was down: the rows are missing and a `sample_gaps` row says why) and some GPUs miss
single stretches (a per-GPU gap row). Generation holds one node-day (~69 k rows) at a time.

    uv run python bench/synth_samples.py /tmp/window --days 7 --gpus 8
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.data.datasets import SAMPLE_GAPS, SAMPLES
from tasks.data.fingerprint import FINGERPRINT_COLUMNS
from tasks.data.runs import commit_run
from tasks.data.store import write_dataset

GENERATOR_VERSION = "1"
POC = "bench"
GPUS_PER_NODE = 8
INTERVAL_S = 10
START = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # a Monday: week 2026-W02 starts here
US = 1_000_000
DAY_US = 86_400 * US

# phase kinds: (arm, workload, busy)
PHASES = (
    ("managed", "train-llm", True),
    ("managed", "serve-digits", True),
    ("unmanaged", "train-llm", True),
    ("unmanaged", "serve-digits", True),
    (None, None, True),  # someone else's job: busy, not ours
    (None, None, False),  # idle
)
PHASE_P = np.array([0.17, 0.13, 0.17, 0.13, 0.15, 0.25])


def _dict(indices: np.ndarray, values: list[str | None]) -> pa.DictionaryArray:
    """A dictionary-encoded string column; an index pointing at None is a null."""
    null_at = [i for i, v in enumerate(values) if v is None]
    mask = np.isin(indices, null_at) if null_at else None
    dictionary = pa.array([v if v is not None else "" for v in values], pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(indices.astype(np.int32), mask=mask), dictionary)


def _const(value: str | int | None, n: int, typ: pa.DataType) -> pa.Array:
    if pa.types.is_string(typ):
        return _dict(np.zeros(n, np.int32), [value])
    return pa.array(np.full(n, value), typ)


def _fingerprint(n: int) -> dict[str, pa.Array]:
    out = {}
    for name in FINGERPRINT_COLUMNS:
        if name in ("fp_cores", "fp_mem_bytes", "fp_gpu_count"):
            out[name] = _const(
                {"fp_cores": 64, "fp_mem_bytes": 1 << 40, "fp_gpu_count": 8}[name], n, pa.int64()
            )
        else:
            out[name] = _const("bench", n, pa.string())
    return out


def node_day(
    rng: np.random.Generator, node: str, day: int, run_id: str, start: dt.datetime = START
) -> tuple[pa.Table, pa.Table]:
    """One sampler run: a node's 8 GPUs for one day, and its gap rows."""
    per_day = 86_400 // INTERVAL_S
    day0 = int(start.timestamp()) * US + day * DAY_US
    gap_rows: list[dict] = []
    keep = np.ones((GPUS_PER_NODE, per_day), bool)
    # The sampler was down for a stretch on ~15 % of node-days (all GPUs, all metrics).
    if rng.random() < 0.15:
        length = int(rng.integers(3, 720))  # 30 s .. 2 h
        at = int(rng.integers(0, per_day - length))
        keep[:, at : at + length] = False
        reason = str(rng.choice(["sampler_down", "node_reboot", "nvml_error"]))
        gap_rows.append({"k0": at, "k1": at + length, "entity": None, "reason": reason})
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("gpu", "k", "phase", "value", "jit")}
    for g in range(GPUS_PER_NODE):
        # One GPU misses a short stretch on ~5 % of GPU-days (the driver did not answer).
        if rng.random() < 0.05:
            length = int(rng.integers(1, 60))
            at = int(rng.integers(0, per_day - length))
            if keep[g, at : at + length].all():
                keep[g, at : at + length] = False
                gap_rows.append(
                    {
                        "k0": at,
                        "k1": at + length,
                        "entity": f"GPU-{node}-{g}",
                        "reason": "nvml_error",
                    }
                )
        # Phases: exponential lengths (mean 2 h), kinds drawn with PHASE_P.
        lengths = np.maximum(1, rng.exponential(720, 64).astype(np.int64))
        starts = np.concatenate([[0], np.cumsum(lengths)])
        kinds = rng.choice(len(PHASES), len(starts), p=PHASE_P)
        k = np.arange(per_day)
        seg = np.searchsorted(starts, k, side="right") - 1
        phase = kinds[seg]
        busy = np.array([p[2] for p in PHASES])[phase]
        since = k - starts[seg]  # samples since the phase began: a busy phase warms up
        value = np.where(
            busy,
            np.where(since < 30, rng.uniform(5, 40, per_day), rng.normal(82, 8, per_day)),
            rng.exponential(1.0, per_day),
        )
        value = np.clip(np.round(value, 2), 0, 100)
        m = keep[g]
        cols["gpu"].append(np.full(m.sum(), g, np.int32))
        cols["k"].append(k[m])
        cols["phase"].append(phase[m])
        cols["value"].append(value[m])
        cols["jit"].append(rng.integers(0, 300_000, per_day)[m])
    gpu, k, phase, value, jit = (
        np.concatenate(cols[c]) for c in ("gpu", "k", "phase", "value", "jit")
    )
    n = len(k)
    # The read at the end of interval k lands up to 0.3 s late; an interval runs from the
    # previous read (or, after a gap or at the day's start, from its nominal start).
    t_to = day0 + (k + 1) * INTERVAL_S * US + jit
    prev_ok = np.concatenate([[False], (k[1:] == k[:-1] + 1) & (gpu[1:] == gpu[:-1])])
    t_from = np.where(prev_ok, np.roll(t_to, 1), day0 + k * INTERVAL_S * US)
    arms = [p[0] for p in PHASES]
    workloads = [p[1] for p in PHASES]
    attributed = np.array([p[0] is not None for p in PHASES])[phase]
    job = np.where(attributed, phase, len(PHASES))  # one job id per phase kind per node-day
    job_ids = [f"{node}-{day}-{i}" for i in range(len(PHASES))] + [None]
    ts = pa.timestamp("us", tz="UTC")
    samples = pa.table(
        {
            "poc": _const(POC, n, pa.string()),
            "run_id": _const(run_id, n, pa.string()),
            "node": _const(node, n, pa.string()),
            "source": _const("nvml", n, pa.string()),
            "entity": _dict(gpu, [f"GPU-{node}-{g}" for g in range(GPUS_PER_NODE)]),
            "device": _const("gpu", n, pa.string()),
            "gpu_uuid": _dict(gpu, [f"GPU-{node}-{g}" for g in range(GPUS_PER_NODE)]),
            "gpu_index": pa.array(gpu.astype(np.int64)),
            "metric": _const("gpu_utilization", n, pa.string()),
            "unit": _const("percent", n, pa.string()),
            "value": pa.array(value),
            "t_from": pa.array(t_from, ts),
            "t_to": pa.array(t_to, ts),
            "points": pa.array(np.where(rng.random(n) < 0.02, 9, 10).astype(np.int64)),
            "pid": pa.nulls(n, pa.int64()),
            "job_id": _dict(job, job_ids),
            "arm": _dict(phase, arms),
            "workload": _dict(phase, workloads),
            "trial_id": pa.nulls(n, pa.string()),
            "attributed_by": _dict(attributed.astype(np.int32), ["none", "cuda_visible_devices"]),
            **_fingerprint(n),
        }
    )
    gaps = pa.table(
        {
            "poc": [POC] * len(gap_rows),
            "run_id": [run_id] * len(gap_rows),
            "node": [node] * len(gap_rows),
            "source": ["nvml"] * len(gap_rows),
            "entity": [r["entity"] for r in gap_rows],
            "metric": [None if r["entity"] is None else "gpu_utilization" for r in gap_rows],
            "t_from": pa.array([day0 + r["k0"] * INTERVAL_S * US for r in gap_rows], ts),
            "t_to": pa.array([day0 + r["k1"] * INTERVAL_S * US for r in gap_rows], ts),
            "gap_s": [float((r["k1"] - r["k0"]) * INTERVAL_S) for r in gap_rows],
            "reason": [r["reason"] for r in gap_rows],
            "detected_by": ["next_run"] * len(gap_rows),
            **{k: v.to_pylist() for k, v in _fingerprint(len(gap_rows)).items()},
        },
        schema=SAMPLE_GAPS.arrow_schema,
    )
    return samples, gaps


def generate(
    data_dir: Path,
    days: int,
    gpus: int,
    seed: int = 1,
    progress: bool = False,
    start: dt.datetime = START,
) -> int:
    """Write the window from ``start`` (midnight UTC), ``gpus`` rounded up to whole 8-GPU
    nodes; returns the sample rows written."""
    nodes = [f"gpu{i:03d}" for i in range(-(-gpus // GPUS_PER_NODE))]
    rng = np.random.default_rng(seed)
    rows = 0
    t = time.perf_counter()
    for day in range(days):
        date = (start + dt.timedelta(days=day)).strftime("%Y%m%d")
        for node in nodes:
            run_id = f"sampler-{node}-{date}"
            samples, gaps = node_day(rng, node, day, run_id, start)
            write_dataset(samples, SAMPLES, data_dir=data_dir, poc=POC, run_id=run_id)
            write_dataset(gaps, SAMPLE_GAPS, data_dir=data_dir, poc=POC, run_id=run_id)
            commit_run(data_dir, POC, run_id, stage="sample", outcome="complete")
            rows += samples.num_rows
        if progress and (day + 1) % 10 == 0:
            print(
                f"  day {day + 1}/{days}: {rows:,} rows, {time.perf_counter() - t:.0f}s", flush=True
            )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data_dir", type=Path)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    t = time.perf_counter()
    rows = generate(args.data_dir, args.days, args.gpus, args.seed, progress=True)
    print(f"{rows:,} sample rows in {time.perf_counter() - t:.1f}s under {args.data_dir}/{POC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
