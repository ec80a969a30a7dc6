"""A seeded synthetic ``sacct -P`` dump (with header) that looks like a real GPU cluster's.

    uv run python bench/synth_sacct.py OUT --rows 5000000 --seed 1

Allocation rows only, in the field order ckpt-poc asks sacct for (``tasks.baseline.accounting``):

    JobID|JobIDRaw|Cluster|Partition|User|Account|JobName|State|ExitCode|Submit|Start|End|
    Elapsed|ElapsedRaw|Timelimit|NNodes|NCPUS|AllocTRES|NodeList

What it models (all seeded, all vectorised with NumPy and Arrow compute):

* state mix of a busy GPU cluster: COMPLETED 68 %, FAILED 10 %, CANCELLED 9 % (written
  ``CANCELLED by <uid>``, a third of them cancelled while pending), TIMEOUT 6 %,
  OUT_OF_MEMORY 2 %, PREEMPTED 1.5 %, NODE_FAIL 0.5 %, REQUEUED 0.5 %, BOOT_FAIL 0.1 %,
  DEADLINE 0.05 %, RUNNING 1.5 %, PENDING 0.85 % (Start and End ``Unknown``, elapsed 0);
* submissions, about a fifth of the rows array tasks (``123_4``, each with its own JobIDRaw);
* a few hundred users with Zipf-like activity, ~80 accounts, a few thousand job names;
* 0/1/2/4/8 GPUs per node, occasionally multi-node; AllocTRES with typed and untyped GPU
  entries (``billing=16,cpu=16,gres/gpu:a100=4,gres/gpu=4,mem=128G,node=1``), some with only
  one of the two;
* heavy-tailed (log-normal) elapsed times within the time limit, TIMEOUT just past it;
* a 90-day window ending at a fixed "now"; job ids increase with submit time.

The output is written atomically (temp file + rename). ``cached_dump`` names a file by rows,
seed and generator version, so a benchmark reuses a dump it already made.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from tasks.baseline.accounting import SACCT_FIELDS

GENERATOR_VERSION = 2

FIELDS = SACCT_FIELDS  # the --format ckpt-poc asks sacct for, in its column order

# (state, share of rows, median elapsed s, log-normal sigma)
STATES = (
    ("COMPLETED", 0.68, 2400, 1.9),
    ("FAILED", 0.10, 300, 2.2),
    ("CANCELLED", 0.09, 1800, 2.0),
    ("TIMEOUT", 0.06, 0, 0.0),  # just past the time limit
    ("OUT_OF_MEMORY", 0.02, 900, 1.8),
    ("PREEMPTED", 0.015, 5400, 1.5),
    ("NODE_FAIL", 0.005, 10800, 1.5),
    ("REQUEUED", 0.005, 3600, 1.5),
    ("BOOT_FAIL", 0.001, 0, 0.0),  # 0-60 s
    ("DEADLINE", 0.0005, 1200, 1.5),
    ("RUNNING", 0.015, 0, 0.0),
    ("PENDING", 0.0, 0, 0.0),  # the rest
)
STATE_NAMES = [s[0] for s in STATES]
S = {name: i for i, name in enumerate(STATE_NAMES)}
CANCELLED_BEFORE_START = 1 / 3
DEADLINE_BEFORE_START = 1 / 2

# (ExitCode, weight) per state.
EXIT_CODES = {
    "COMPLETED": (("0:0", 1.0),),
    "FAILED": (
        ("1:0", 0.6),
        ("2:0", 0.1),
        ("127:0", 0.05),
        ("137:0", 0.05),
        ("255:0", 0.05),
        ("0:6", 0.05),
        ("0:11", 0.1),
    ),
    "CANCELLED": (("0:15", 0.85), ("0:9", 0.05), ("0:0", 0.1)),
    "TIMEOUT": (("0:15", 0.7), ("0:0", 0.3)),
    "OUT_OF_MEMORY": (("0:125", 1.0),),
    "PREEMPTED": (("0:15", 0.8), ("0:0", 0.2)),
    "NODE_FAIL": (("0:0", 0.9), ("1:0", 0.1)),
    "REQUEUED": (("0:0", 1.0),),
    "BOOT_FAIL": (("0:0", 1.0),),
    "DEADLINE": (("0:0", 1.0),),
    "RUNNING": (("0:0", 1.0),),
    "PENDING": (("0:0", 1.0),),
}

# (Timelimit as sacct prints it, effective seconds, weight)
TIMELIMITS = (
    ("00:30:00", 1800, 0.05),
    ("01:00:00", 3600, 0.10),
    ("02:00:00", 7200, 0.10),
    ("04:00:00", 14400, 0.12),
    ("08:00:00", 28800, 0.10),
    ("12:00:00", 43200, 0.10),
    ("1-00:00:00", 86400, 0.18),
    ("2-00:00:00", 172800, 0.10),
    ("3-00:00:00", 259200, 0.06),
    ("7-00:00:00", 604800, 0.04),
    ("UNLIMITED", 604800, 0.02),  # the partition's maximum applies
    ("Partition_Limit", 172800, 0.03),
)

GPUS_PER_NODE = np.array([0, 1, 2, 4, 8])
GPUS_PER_NODE_P = np.array([0.22, 0.33, 0.12, 0.18, 0.15])
NNODES = np.array([1, 2, 4, 8, 16, 32])
NNODES_P = np.array([0.95, 0.02, 0.015, 0.01, 0.004, 0.001])
# GPU model: (type in gres, partition, node prefix, weight)
GPU_TYPES = (
    ("a100", "gpu-a100", "ga", 0.5),
    ("h100", "gpu-h100", "gh", 0.3),
    ("v100", "gpu-v100", "gv", 0.2),
)
# Partitions: the GPU ones above, then these.
OTHER_PARTITIONS = ("preempt", "debug", "cpu", "bigmem")
NODES_PER_POOL = 256
CLUSTER = "gaia"
T0 = np.datetime64("2025-03-03T00:00:00", "s")
WINDOW_S = 90 * 86400
FIRST_JOB_ID = 4_100_000

N_USERS = 320
N_ACCOUNTS = 80
MEAN_NAMES_PER_USER = 14
ARRAY_SUBMISSION_P = 0.0125  # share of submissions that are job arrays
ARRAY_MEAN_TASKS = 20


def _lognormal(rng: np.random.Generator, median: float, sigma: float, n: int) -> np.ndarray:
    return rng.lognormal(np.log(max(median, 1)), sigma, n)


def _pick(rng: np.random.Generator, weights: np.ndarray, n: int) -> np.ndarray:
    """Indices drawn with the given weights (compact dtype)."""
    cdf = np.cumsum(np.asarray(weights, dtype=np.float64))
    cdf /= cdf[-1]
    return np.searchsorted(cdf, rng.random(n), side="right").astype(np.int16)


# --- names ----------------------------------------------------------------------------------

_SYL = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "an", "el", "ir", "os", "ba", "de")
_SURNAMES = (
    "smith", "garcia", "mueller", "rossi", "novak", "kim", "chen", "patel", "silva", "dubois",
    "kowalski", "jensen", "tanaka", "nguyen", "ivanova", "okafor", "haddad", "larsen", "costa",
    "weber", "schmidt", "moreau", "fischer", "ali", "khan", "lee", "wang", "zhang", "sato", "lopez",
)  # fmt: skip
_DEPTS = (
    "phys", "chem", "bio", "cs", "ml", "astro", "geo", "math", "eng", "med", "clim", "neuro",
    "mat", "econ", "ling", "fin",
)  # fmt: skip
_PROJECTS = (
    "qcd", "dft", "md", "vision", "nlp", "rl", "llm", "cosmo", "seismic", "genomics", "cfd",
    "proteins", "weather", "imaging", "speech", "graphs", "robotics", "fusion", "optics", "lattice",
)  # fmt: skip
_VERBS = (
    "train", "eval", "ft", "pretrain", "sweep", "infer", "prep", "sim", "bench", "run", "test",
    "debug", "export", "tune", "score",
)  # fmt: skip
_MODELS = (
    "resnet50", "vit-b16", "bert-base", "llama-7b", "llama-70b", "gpt2", "t5", "unet", "yolo",
    "whisper", "gromacs", "lammps", "vasp", "cp2k", "wrf", "openfoam", "alphafold", "namd",
    "diffusion", "mae", "clip", "gnn", "ppo", "sam",
)  # fmt: skip
_SHARED_NAMES = ("bash", "interactive", "jupyter", "sys/dashboard/sys/jupyter", "vscode", "sh")


def _user_names(rng: np.random.Generator, n: int) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        first = "".join(rng.choice(_SYL, 1 + int(rng.integers(0, 2))))
        style = rng.integers(0, 3)
        sur = str(rng.choice(_SURNAMES))
        name = {0: f"{first[0]}{sur}", 1: f"{first}.{sur}", 2: f"{sur}{int(rng.integers(1, 99))}"}[
            int(style)
        ]
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


def _account_names(rng: np.random.Generator, n: int) -> list[str]:
    combos = [f"{d}-{p}" for d in _DEPTS for p in _PROJECTS]
    picked = rng.choice(len(combos), n, replace=False)
    return [combos[i] for i in picked]


def _job_name(rng: np.random.Generator) -> str:
    r = rng.random()
    if r < 0.05:
        return str(rng.choice(_SHARED_NAMES))
    verb, model = str(rng.choice(_VERBS)), str(rng.choice(_MODELS))
    if r < 0.35:
        return f"{verb}_{model}"
    if r < 0.7:
        return f"{verb}-{model}-{int(rng.integers(1, 100))}"
    return f"{model}_{verb}_v{int(rng.integers(1, 20))}.sh"


# --- numeric model --------------------------------------------------------------------------


def _model(rows: int, seed: int) -> dict[str, np.ndarray | list[str]]:
    """Every row's numbers (and the small dictionaries they index), in job id order."""
    rng = np.random.default_rng(seed)
    n = rows

    # Submissions (a job array is one submission of many rows).
    sizes = np.ones(n, dtype=np.int32)
    is_arr = rng.random(n) < ARRAY_SUBMISSION_P
    sizes[is_arr] = 2 + np.minimum(rng.geometric(1 / (ARRAY_MEAN_TASKS - 1), is_arr.sum()), 998)
    ends = np.cumsum(sizes, dtype=np.int64)
    g = int(np.searchsorted(ends, n)) + 1
    sizes = sizes[:g]
    sizes[-1] -= int(ends[g - 1] - n)
    is_arr = is_arr[:g] & (sizes > 1)
    group = np.repeat(np.arange(g, dtype=np.int32), sizes)
    offsets = np.zeros(g, dtype=np.int64)
    offsets[1:] = np.cumsum(sizes[:-1])

    # Identities: users with Zipf-like activity, each with a home account and job names.
    users = _user_names(rng, N_USERS)
    accounts = _account_names(rng, N_ACCOUNTS)
    uids = rng.choice(np.arange(10000, 60000), N_USERS, replace=False)
    user_w = 1 / np.arange(1, N_USERS + 1) ** 1.1
    home = _pick(rng, 1 / np.arange(1, N_ACCOUNTS + 1) ** 0.9, N_USERS)
    second = rng.integers(0, N_ACCOUNTS, N_USERS).astype(np.int16)
    n_names = 2 + rng.poisson(MEAN_NAMES_PER_USER - 2, N_USERS)
    name_start = np.zeros(N_USERS, dtype=np.int64)
    name_start[1:] = np.cumsum(n_names[:-1])
    names = [_job_name(rng) for _ in range(int(n_names.sum()))]

    g_user = _pick(rng, user_w, g)
    g_account = np.where(rng.random(g) < 0.9, home[g_user], second[g_user]).astype(np.int16)
    g_name = (name_start[g_user] + (rng.geometric(0.3, g) - 1) % n_names[g_user]).astype(np.int32)

    # Resources per submission.
    g_gpn = GPUS_PER_NODE[_pick(rng, GPUS_PER_NODE_P, g)].astype(np.int16)
    g_nn = NNODES[_pick(rng, NNODES_P, g)].astype(np.int16)
    g_nn[(g_gpn == 1) | (g_gpn == 2)] = 1  # multi-node jobs take whole GPU nodes (or CPUs)
    g_type = _pick(rng, np.array([t[3] for t in GPU_TYPES]), g)
    # partition index: 0..2 the GPU pools, then OTHER_PARTITIONS
    g_part = g_type.copy()
    r = rng.random(g)
    g_part[(g_gpn > 0) & (r < 0.10)] = 3  # preempt
    g_part[(g_gpn > 0) & (r >= 0.10) & (r < 0.13) & (g_nn == 1)] = 4  # debug
    cpu = g_gpn == 0
    g_part[cpu] = np.where(r[cpu] < 0.85, 5, np.where(r[cpu] < 0.95, 4, 6))
    g_cpn = np.where(
        cpu,
        np.array([1, 2, 4, 8, 16, 32, 64, 128])[rng.integers(0, 8, g)],
        g_gpn * np.array([4, 8, 16])[rng.integers(0, 3, g)],
    ).astype(np.int32)
    g_mem_g = np.where(
        cpu,
        np.array([4, 8, 16, 32, 64, 128, 256, 512])[rng.integers(0, 8, g)],
        g_gpn * np.array([32, 64, 128])[rng.integers(0, 3, g)],
    ).astype(np.int32)
    g_mem_g[g_part == 6] *= 4  # bigmem
    g_mem_in_m = rng.random(g) < 0.2  # "128000M" rather than "125G"
    # 0: typed and untyped, 1: untyped only, 2: typed only
    g_tres_style = _pick(rng, np.array([0.89, 0.08, 0.03]), g)
    g_limit = _pick(rng, np.array([t[2] for t in TIMELIMITS]), g)
    g_node0 = 1 + (rng.random(g) * (NODES_PER_POOL - g_nn)).astype(np.int32)

    # Per row: state, elapsed, queue wait.
    state = _pick(rng, np.array([s[1] for s in STATES[:-1]] + [1 - sum(s[1] for s in STATES)]), n)
    state = state.astype(np.int8)
    limit_s = np.array([t[1] for t in TIMELIMITS], dtype=np.int64)[g_limit[group]]
    elapsed = np.zeros(n, dtype=np.int64)
    for name, _, median, sigma in STATES:
        m = state == S[name]
        k = int(m.sum())
        if not k or sigma == 0:
            continue
        elapsed[m] = np.clip(_lognormal(rng, median, sigma, k), 1, limit_s[m] - 1).astype(np.int64)
    m = state == S["TIMEOUT"]
    elapsed[m] = limit_s[m] + rng.integers(0, 120, int(m.sum()))
    m = state == S["BOOT_FAIL"]
    elapsed[m] = rng.integers(0, 61, int(m.sum()))
    never_started = state == S["PENDING"]
    never_started |= (state == S["CANCELLED"]) & (rng.random(n) < CANCELLED_BEFORE_START)
    never_started |= (state == S["DEADLINE"]) & (rng.random(n) < DEADLINE_BEFORE_START)
    elapsed[never_started] = 0
    running = state == S["RUNNING"]
    elapsed[running] = (
        rng.random(int(running.sum())) * np.minimum(limit_s[running], 3 * 86400)
    ).astype(np.int64)
    task = np.arange(n, dtype=np.int64) - offsets[group]
    wait = np.minimum(_lognormal(rng, 120, 2.0, n), 86400).astype(np.int64) + task * rng.integers(
        0, 60, n
    )
    wait = np.minimum(wait, 2 * 86400)

    # Submit time per submission (seconds from T0): finished rows end by "now", running and
    # pending ones are recent; a submission's tasks all share its submit time.
    now = WINDOW_S
    pending = state == S["PENDING"]
    live = running | pending
    latest = now - wait - elapsed - 1  # the latest submit that lets a finished row end by now
    latest[running] = now - elapsed[running] - wait[running]
    latest[pending] = now - np.minimum(
        rng.exponential(6 * 3600, int(pending.sum())), 2 * 86400
    ).astype(np.int64)
    g_latest = np.maximum(np.minimum.reduceat(latest, offsets), 0)
    g_live = np.maximum.reduceat(live, offsets)
    g_submit = np.where(g_live, g_latest, (rng.random(g) * g_latest).astype(np.int64))
    start = g_submit[group] + wait
    start[running] = now - elapsed[running]
    end = start + elapsed

    # Job id order = submission order: reorder submissions by submit time.
    order = np.argsort(g_submit, kind="stable")
    new_sizes = sizes[order]
    new_offsets = np.zeros(g, dtype=np.int64)
    new_offsets[1:] = np.cumsum(new_sizes[:-1])
    perm = np.repeat(offsets[order] - new_offsets, new_sizes) + np.arange(n, dtype=np.int64)
    new_group = np.repeat(order.astype(np.int32), new_sizes)  # old submission index per row
    raw_id = FIRST_JOB_ID + np.arange(n, dtype=np.int64) + np.cumsum(rng.random(n) < 0.02)
    first_of_row = np.repeat(new_offsets, new_sizes)
    array_id = raw_id[first_of_row]
    in_array = np.repeat(is_arr[order], new_sizes)
    task = np.arange(n, dtype=np.int64) - first_of_row

    canceller = np.where(rng.random(n) < 0.9, uids[g_user[new_group]], 0)

    def by_row(a: np.ndarray) -> np.ndarray:
        return a[new_group]

    state = state[perm]
    return {
        "raw_id": raw_id,
        "array_id": array_id,
        "task": task,
        "in_array": in_array,
        "user": by_row(g_user),
        "account": by_row(g_account),
        "name": by_row(g_name),
        "state": state,
        "canceller": canceller,
        "exit_u": rng.random(n),
        "submit": by_row(g_submit),
        "start": start[perm],
        "end": end[perm],
        "elapsed": elapsed[perm],
        "never_started": never_started[perm],
        "limit": by_row(g_limit),
        "nnodes": by_row(g_nn),
        "gpn": by_row(g_gpn),
        "gtype": by_row(g_type),
        "part": by_row(g_part),
        "cpn": by_row(g_cpn),
        "mem_g": by_row(g_mem_g),
        "mem_in_m": by_row(g_mem_in_m),
        "tres_style": by_row(g_tres_style),
        "node0": by_row(g_node0),
        "users": users,
        "accounts": accounts,
        "names": names,
    }


# --- formatting -----------------------------------------------------------------------------


def _s(a: np.ndarray | pa.Array) -> pa.Array:
    return pc.cast(pa.array(a) if isinstance(a, np.ndarray) else a, pa.string())


def _take(values: list[str], idx: np.ndarray) -> pa.Array:
    return pc.take(pa.array(values, pa.string()), pa.array(idx))


def _join(*parts: pa.Array | str, sep: str = "") -> pa.Array:
    return pc.binary_join_element_wise(*parts, sep)


def _stamp(secs: np.ndarray) -> pa.Array:
    ts = pa.array((T0 + secs.astype("timedelta64[s]")).astype("datetime64[s]"))
    return pc.replace_substring(pc.cast(ts, pa.string()), " ", "T", max_replacements=1)


def _duration(secs: np.ndarray) -> pa.Array:
    d, rem = np.divmod(secs, 86400)
    h, rem = np.divmod(rem, 3600)
    m, s = np.divmod(rem, 60)

    def two(x: np.ndarray) -> pa.Array:
        return pc.utf8_lpad(_s(x), 2, "0")

    hms = _join(two(h), two(m), two(s), sep=":")
    return pc.if_else(pa.array(d > 0), _join(_s(d), hms, sep="-"), hms)


def _when(mask: np.ndarray, text: str, values: pa.Array) -> pa.Array:
    return pc.if_else(pa.array(mask), pa.scalar(text), values)


def _exit_codes(state: np.ndarray, u: np.ndarray) -> pa.Array:
    codes = sorted({c for opts in EXIT_CODES.values() for c, _ in opts})
    idx = np.zeros(len(state), dtype=np.int16)
    for name, opts in EXIT_CODES.items():
        m = state == S[name]
        cdf = np.cumsum([w for _, w in opts])
        cdf /= cdf[-1]
        pick = np.minimum(np.searchsorted(cdf, u[m], side="right"), len(opts) - 1)
        idx[m] = np.array([codes.index(c) for c, _ in opts])[pick]
    return _take(codes, idx)


def _format(m: dict, lo: int, hi: int) -> pa.Table:
    """Rows [lo, hi) of the model as the dump's string columns."""
    c = {k: (v[lo:hi] if isinstance(v, np.ndarray) else v) for k, v in m.items()}
    n = hi - lo
    state = c["state"]
    pending = state == S["PENDING"]
    running = state == S["RUNNING"]
    never = c["never_started"]
    no_alloc = never  # nothing allocated: no AllocTRES, no nodes

    raw = _s(c["raw_id"])
    job_id = pc.if_else(
        pa.array(c["in_array"]), _join(_s(c["array_id"]), _s(c["task"]), sep="_"), raw
    )

    state_text = _take(STATE_NAMES, state)
    cancelled = state == S["CANCELLED"]
    state_text = pc.if_else(
        pa.array(cancelled), _join("CANCELLED by", _s(c["canceller"]), sep=" "), state_text
    )

    submit = _stamp(c["submit"])
    start = _when(pending, "Unknown", _stamp(c["start"]))
    start = _when(never & ~pending, "None", start)
    end = _when(pending | running, "Unknown", _stamp(c["end"]))

    nn = c["nnodes"].astype(np.int64)
    gpus = c["gpn"].astype(np.int64) * nn
    cpus = c["cpn"].astype(np.int64) * nn
    mem_g = c["mem_g"].astype(np.int64) * nn
    mem = pc.if_else(pa.array(c["mem_in_m"]), _join(_s(mem_g * 1024), "M"), _join(_s(mem_g), "G"))
    gtype = _take([t[0] for t in GPU_TYPES], c["gtype"])
    has_gpu = gpus > 0
    style = c["tres_style"]
    gpu_s = _s(gpus)
    null = pa.scalar(None, pa.string())
    typed = pc.if_else(
        pa.array(has_gpu & (style != 1)), _join("gres/gpu:", gtype, "=", gpu_s), null
    )
    untyped = pc.if_else(pa.array(has_gpu & (style != 2)), _join("gres/gpu=", gpu_s), null)
    tres = pc.binary_join_element_wise(
        _join("billing=", _s(cpus + 8 * gpus)),
        _join("cpu=", _s(cpus)),
        typed,
        untyped,
        _join("mem=", mem),
        _join("node=", _s(nn)),
        ",",
        null_handling="skip",
    )
    tres = _when(no_alloc, "", tres)

    parts = [t[1] for t in GPU_TYPES] + list(OTHER_PARTITIONS)
    prefix_of_part = [t[2] for t in GPU_TYPES] + ["gv", "gd", "c", "m"]
    prefix = _take(prefix_of_part, c["part"])
    node0 = c["node0"].astype(np.int64)
    first = pc.utf8_lpad(_s(node0), 3, "0")
    last = pc.utf8_lpad(_s(node0 + nn - 1), 3, "0")
    nodes = pc.if_else(
        pa.array(nn > 1), _join(prefix, "[", first, "-", last, "]"), _join(prefix, first)
    )
    nodes = _when(no_alloc, "None assigned", nodes)

    cols = {
        "JobID": job_id,
        "JobIDRaw": raw,
        "Cluster": pa.repeat(pa.scalar(CLUSTER), n),
        "Partition": _take(parts, c["part"]),
        "User": _take(c["users"], c["user"]),
        "Account": _take(c["accounts"], c["account"]),
        "JobName": _take(c["names"], c["name"]),
        "State": state_text,
        "ExitCode": _exit_codes(state, c["exit_u"]),
        "Submit": submit,
        "Start": start,
        "End": end,
        "Elapsed": _duration(c["elapsed"]),
        "ElapsedRaw": _s(c["elapsed"]),
        "Timelimit": _take([t[0] for t in TIMELIMITS], c["limit"]),
        "NNodes": _s(nn),
        "NCPUS": _s(cpus),
        "AllocTRES": tres,
        "NodeList": nodes,
    }
    return pa.table({k: cols[k] for k in FIELDS})


def write_dump(out: str | Path, rows: int, seed: int, chunk_rows: int = 1_000_000) -> Path:
    """Generate ``rows`` rows with ``seed`` into ``out`` (atomically)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    model = _model(rows, seed)
    opts = pcsv.WriteOptions(include_header=False, delimiter="|", quoting_style="none")
    try:
        with open(tmp, "wb") as fh:
            fh.write(("|".join(FIELDS) + "\n").encode())
            writer = None
            for lo in range(0, rows, chunk_rows):
                table = _format(model, lo, min(rows, lo + chunk_rows))
                if writer is None:
                    writer = pcsv.CSVWriter(fh, table.schema, write_options=opts)
                writer.write_table(table)
            if writer is not None:
                writer.close()
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def cached_dump(folder: str | Path, rows: int, seed: int) -> tuple[Path, bool]:
    """The dump for (rows, seed) under ``folder``, generated unless already there; (path, made)."""
    path = Path(folder) / f"sacct-r{rows}-s{seed}-g{GENERATOR_VERSION}.psv"
    if path.exists():
        return path, False
    return write_dump(path, rows, seed), True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output file (a sacct -P dump with header)")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.rows < 1:
        ap.error("--rows must be at least 1")
    t = time.perf_counter()
    path = write_dump(args.out, args.rows, args.seed)
    secs = time.perf_counter() - t
    size = path.stat().st_size
    print(
        f"wrote {args.rows:,} rows ({size / 2**20:,.0f} MiB) to {path} in {secs:.1f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
