"""Baseline ingest benchmark: ours (``tasks.baseline.run.run_baseline``) against naive pandas and
DuckDB on the same synthetic ``sacct -P`` dump, each in a fresh subprocess.

    uv run python bench/baseline_ingest.py                 # 5 M rows, then 20 M through Dask
    uv run python bench/baseline_ingest.py --rows 200000 --skip-20m

Contenders (every one computes the same exposure numbers from the same file):

* ours: ``run_baseline(..., use_dask=False)`` end to end: parse, pseudonymise, stamp, exposure
  (with chains and candidates), GX gates, parquet writes. Its phases are timed by wrapping
  the module functions ``_run_in_memory`` calls, so the GX gate time is reported apart.
* pandas: ``pd.read_csv(sep='|')``, a per-row Python AllocTRES parser (``Series.apply``),
  drop duplicate captures, groupby state.
* duckdb: ``read_csv`` and one SQL query (read and aggregate: the by-state numbers only).
* duckdb-equal: DuckDB doing ours' work (bench/baseline_ingest_duckdb.py): every field parsed
  and checked in SQL, users and accounts pseudonymised, the jobs and exposure (and quarantine
  and gates) datasets written as parquet in the declared schema, the gate's checks; what it
  wrote is compared with what ours wrote, column by column.
* ours-dask: ``run_baseline(..., use_dask=True)`` on a 20 M-row dump (``--skip-20m`` skips it).

The by-state results must agree (allocations exactly; node/GPU-hours and exposed
GPU-hours to 1e-6 relative), or the benchmark exits 1. Peak RSS is the child's own
``VmHWM`` (the kernel's high-water mark of its address space: not ru_maxrss, which Linux
carries over from the parent that generated the dump), cross-checked by polling the child's
process tree with psutil. Dumps are cached under ``.run/bench/`` by rows, seed and generator
version.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import os
import resource
import shutil
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from baseline_ingest_duckdb import (  # noqa: E402
    DIFFERENCES,
    EXPOSED_STATES,
    child_duckdb_equal,
    compare_digests,
    dataset_digest,
    restated_drift,
)
from benchlib import code_version, run_polled, self_peak_mib, tree_cpu_s, verdict  # noqa: E402
from synth_sacct import cached_dump  # noqa: E402

CACHE = REPO / ".run" / "bench"
PLAN = REPO / "plans" / "demo.yaml"
KEY_ENV = "CKPT_POC_PSEUDONYM_KEY"
BENCH_KEY = "bench-only-key-0123456789abcdef!"  # 32 characters, not a secret
DUPLICATE_KEY = ("Cluster", "JobID", "Submit", "Start", "End", "State")
REL_TOL = 1e-6
TARGET_ROWS_PER_S = 1_000_000
TARGET_PEAK_MIB = 2048
TARGET_DASK_PEAK_MIB = 4096
MIB = 1 << 20


# --- children ---------------------------------------------------------------------------------


class _PhaseClock:
    """Wall time and peak RSS per named phase, by wrapping module functions.

    Memory two ways: a sampler thread records the process RSS every 10 ms against every
    running phase (a lower bound: it cannot sample while another thread holds the GIL), and
    each call notes how far it raised the process's ``VmHWM`` high-water mark, which is
    exact: the phases that raise it are where the peak was reached. Seconds of phases that
    run in Dask's worker threads are summed over the threads.
    """

    def __init__(self) -> None:
        import psutil

        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.peak: dict[str, float] = defaultdict(float)
        self.hwm_raise: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self.order: list[str] = []
        self.missing: list[str] = []
        self._wrappers: dict[int, Any] = {}
        self._stack: list[str] = []
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            rss = self._proc.memory_info().rss / MIB
            with self._lock:
                running = list(self._stack)
            for name in running:
                if rss > self.peak[name]:
                    self.peak[name] = rss

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @contextlib.contextmanager
    def phase(self, name: str):
        with self._lock:
            if name not in self.order:
                self.order.append(name)
            self._stack.append(name)
        hwm = self_peak_mib()
        t = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self.seconds[name] += time.perf_counter() - t
                self.calls[name] += 1
                self.hwm_raise[name] += self_peak_mib() - hwm
                self._stack.remove(name)

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        """Time ``owner.attr`` as ``name``; a function the code no longer has is skipped."""
        orig = getattr(owner, attr, None)
        if orig is None:
            self.missing.append(f"{getattr(owner, '__name__', owner)}.{attr}")
            return
        if id(orig) in self._wrappers:  # imported by name elsewhere: the same wrapper
            setattr(owner, attr, self._wrappers[id(orig)])
            return

        # functools.wraps keeps the original's module and qualified name, which then resolve
        # to this wrapper, so cloudpickle (Dask tokenizing a task) pickles it by reference.
        @functools.wraps(orig)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return orig(*args, **kwargs)

        self._wrappers[id(orig)] = wrapped
        setattr(owner, attr, wrapped)

    def wrap_generator(self, owner: Any, attr: str, name: str) -> None:
        """Time each step of a generator function (the Dask path parses block by block)."""
        orig = getattr(owner, attr)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            it = orig(*args, **kwargs)
            while True:
                with self.phase(name):
                    try:
                        item = next(it)
                    except StopIteration:
                        return
                yield item

        setattr(owner, attr, wrapped)

    def report(self) -> list[dict[str, Any]]:
        return [
            {
                "phase": n,
                "seconds": self.seconds[n],
                "calls": self.calls[n],
                "peak_rss_mib": self.peak[n],
                "hwm_raise_mib": self.hwm_raise[n],
            }
            for n in self.order
        ]


class _CsvProxy:
    """Stands in for ``pyarrow.csv`` inside tasks.baseline.blocks so read_csv can be timed."""

    def __init__(self, module: Any, clock: _PhaseClock) -> None:
        self._module = module
        self._clock = clock

    def read_csv(self, *args: Any, **kwargs: Any) -> Any:
        with self._clock.phase("  . pyarrow read_csv"):
            return self._module.read_csv(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def child_ours(path: Path, use_dask: bool, workdir: Path, profile: bool) -> dict[str, Any]:
    os.environ.setdefault(KEY_ENV, BENCH_KEY)
    t0 = time.perf_counter()
    import dask

    import tasks.baseline.accounting as ta
    import tasks.baseline.blocks as tbk
    import tasks.baseline.exposure as te
    import tasks.baseline.run as tb
    import tasks.data.gates as tg
    import tasks.data.store as td
    from tasks.data.plan import load_plan
    from tasks.data.runctx import make_run_context

    t_import = time.perf_counter() - t0
    version = code_version("tasks")
    data_dir = workdir / "data"
    plan = load_plan(PLAN).model_copy(update={"data_dir": str(data_dir)})
    ctx = make_run_context(plan, PLAN)
    t_setup = time.perf_counter() - t0 - t_import

    hwm_before = self_peak_mib()
    clock = _PhaseClock()
    # Top-level phases, in the order _run_in_memory / _run_dask call them.
    if use_dask:  # _run_dask iterates acct.parse_sacct_stream itself
        clock.wrap_generator(ta, "parse_sacct_stream", "parse + pseudonymise (parse_sacct_stream)")
    else:
        clock.wrap(tb, "ingest_stream", "parse + pseudonymise (ingest_stream)")
    clock.wrap(ta, "parse_block", "  . parse_block")
    tbk.pcsv = _CsvProxy(tbk.pcsv, clock)
    clock.wrap(tbk, "_parse_fields", "  . _parse_fields (vectorised field parsing)")
    clock.wrap(ta.Pseudonymiser, "column", "  . Pseudonymiser.column (HMAC per distinct)")
    clock.wrap(tb, "stamp_jobs", "stamp_jobs")
    clock.wrap(tb, "compute_exposure", "compute_exposure (memory path)")
    clock.wrap(tb, "exposure_with_dask", "exposure_with_dask (dask path)")
    clock.wrap(dask, "compute", "  . dask.compute (read, shuffle, per partition)")
    # Exposure internals (tasks.baseline.run imports some by name: both get the same wrapper).
    for owner in (te, tb):
        clock.wrap(owner, "exposure_part", "  . exposure_part")
        clock.wrap(owner, "combine_parts", "  . combine_parts")
    clock.wrap(te, "allocations_only", "  . allocations_only (dedup)")
    clock.wrap(te, "exposure_by_state", "  . exposure_by_state")
    clock.wrap(te, "find_chains", "  . find_chains")
    clock.wrap(te, "rank_candidates", "  . rank_candidates")
    clock.wrap(tb, "quarantine_frame", "quarantine_frame")
    clock.wrap(tb, "exposure_frame", "exposure_frame")
    clock.wrap(tb, "validate_dataset", "GX gates (validate_dataset)")
    clock.wrap(tg, "_context", "  . GX import + context")
    clock.wrap(tg, "_sample", "  . _sample (rows handed to GX)")
    clock.wrap(tg, "_worker_checks", "  . GX worker (waits out its import, runs the suite)")
    clock.wrap(tg, "exact_checks", "  . exact_checks (pyarrow, every row)")
    clock.wrap(tb, "record_and_enforce", "record_and_enforce (gates dataset write)")
    clock.wrap(tb, "write_dataset", "write_dataset (jobs, quarantine, exposure)")
    clock.wrap(td, "conform", "  . conform (cast to the declared schema)")
    clock.wrap(td, "arrow_week_labels", "  . arrow_week_labels")
    clock.wrap(td, "_write_temp", "  . _write_temp (parquet zstd + fsync; jobs beside the gates)")

    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t, cpu = time.perf_counter(), tree_cpu_s()
    with clock.phase("run_baseline (total)"):
        result = tb.run_baseline(plan, ctx, sacct_file=str(path), use_dask=use_dask)
    seconds = time.perf_counter() - t
    cpu = tree_cpu_s() - cpu
    if profiler is not None:
        import io
        import pstats

        profiler.disable()
        profiler.dump_stats(str(workdir.parent / f"ours-{'dask' if use_dask else 'memory'}.prof"))
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("cumulative").print_stats(40)
        prof_text = buf.getvalue()
    else:
        prof_text = ""
    clock.stop()
    phases = clock.report()
    accounted = sum(
        p["seconds"]
        for p in phases
        if not p["phase"].startswith(" ") and p["phase"] != "run_baseline (total)"
    )
    phases.append(
        {
            "phase": "other (open, key, glue: untimed)",
            "seconds": seconds - accounted,
            "calls": 1,
            "peak_rss_mib": float("nan"),
            "hwm_raise_mib": float("nan"),
        }
    )
    written = [p for ps in result.written.values() for p in ps]
    out_bytes = sum(p.stat().st_size for p in written)
    s = result.summary
    if not isinstance(s, dict):  # a JsonForm (the --json summary's dataclass): its JSON form
        s = s.to_json()
    return {
        "seconds": seconds,
        "cpu_s": cpu,
        "import_s": t_import,
        "setup_s": t_setup,
        "hwm_before_mib": hwm_before,
        "unwrapped": clock.missing,
        "code_version": version,
        "rows": s["rows_read"],
        "rows_quarantined": s["rows_quarantined"],
        "path": result.path,
        "allocations_by_state": s["allocations_by_state"],
        "node_hours_by_state": s["node_hours_by_state"],
        "gpu_hours_by_state": s["gpu_hours_by_state"],
        "exposed_gpu_hours": s["exposed_gpu_hours"],
        "timeout_gpu_hours": s["timeout_gpu_hours"],
        "chains": len(s["chains"]),
        "files_written": len(written),
        "bytes_written": out_bytes,
        "phases": phases,
        "profile": prof_text,
    }


def _parse_gpus(tres: Any) -> int:
    """The naive way: one Python call per row."""
    if not isinstance(tres, str) or not tres:
        return 0
    untyped, typed = None, 0
    for item in tres.split(","):
        name, _, value = item.partition("=")
        if name == "gres/gpu":
            untyped = int(value)
        elif name.startswith("gres/gpu:"):
            typed += int(value)
    return untyped if untyped is not None else typed


def _by_state_result(frame: Any) -> dict[str, Any]:
    gpu = {str(k): float(v) for k, v in frame["gpu_hours"].items()}
    return {
        "allocations_by_state": {str(k): int(v) for k, v in frame["allocations"].items()},
        "node_hours_by_state": {str(k): float(v) for k, v in frame["node_hours"].items()},
        "gpu_hours_by_state": gpu,
        "exposed_gpu_hours": sum(v for k, v in gpu.items() if k in EXPOSED_STATES),
        "timeout_gpu_hours": gpu.get("TIMEOUT", 0.0),
    }


def child_pandas(path: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    import pandas as pd

    t_import = time.perf_counter() - t0
    t, cpu = time.perf_counter(), tree_cpu_s()
    df = pd.read_csv(path, sep="|")
    rows = len(df)
    alloc = df[~df["JobID"].astype(str).str.contains(".", regex=False)]
    alloc = alloc.drop_duplicates(subset=list(DUPLICATE_KEY), keep="first")
    state = alloc["State"].str.split(" ").str[0].str.rstrip("+")
    gpus = alloc["AllocTRES"].apply(_parse_gpus)
    elapsed = alloc["ElapsedRaw"].fillna(0).astype("int64")
    hours = pd.DataFrame(
        {
            "state": state,
            "node_hours": elapsed * alloc["NNodes"].astype("int64") / 3600.0,
            "gpu_hours": elapsed * gpus.astype("int64") / 3600.0,
        }
    )
    by_state = hours.groupby("state", sort=True).agg(
        allocations=("state", "size"),
        node_hours=("node_hours", "sum"),
        gpu_hours=("gpu_hours", "sum"),
    )
    out = _by_state_result(by_state)
    seconds, cpu = time.perf_counter() - t, tree_cpu_s() - cpu
    return {"seconds": seconds, "cpu_s": cpu, "import_s": t_import, "rows": rows, **out}


DUCKDB_SQL = r"""
WITH raw AS (
    SELECT * FROM read_csv(
        $path, delim = '|', header = true, quote = '', escape = '',
        types = {'JobID': 'VARCHAR', 'State': 'VARCHAR', 'AllocTRES': 'VARCHAR',
                 'Submit': 'VARCHAR', 'Start': 'VARCHAR', 'End': 'VARCHAR',
                 'ElapsedRaw': 'BIGINT', 'NNodes': 'BIGINT'}
    )
),
alloc AS (
    SELECT DISTINCT ON (Cluster, JobID, Submit, "Start", "End", State)
        State, ElapsedRaw, NNodes, AllocTRES
    FROM raw
    WHERE NOT contains(JobID, '.')
),
g AS (
    SELECT
        rtrim(split_part(State, ' ', 1), '+') AS state,
        coalesce(ElapsedRaw, 0) AS elapsed,
        NNodes AS nnodes,
        CASE
            WHEN regexp_matches(AllocTRES, '(^|,)gres/gpu=')
                THEN regexp_extract(AllocTRES, '(^|,)gres/gpu=(\d+)', 2)::BIGINT
            ELSE coalesce(list_sum(list_transform(
                regexp_extract_all(AllocTRES, 'gres/gpu:[^=,]+=(\d+)', 1), lambda x: x::BIGINT)), 0)
        END AS gpus
    FROM alloc
)
SELECT
    state,
    count(*) AS allocations,
    sum(elapsed * nnodes) / 3600.0 AS node_hours,
    sum(elapsed * gpus) / 3600.0 AS gpu_hours
FROM g
GROUP BY state
ORDER BY state
"""


def child_duckdb(path: Path, workdir: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    import duckdb

    t_import = time.perf_counter() - t0
    t = time.perf_counter()
    con = duckdb.connect()
    rows = con.execute(
        "SELECT count(*) FROM read_csv($path, delim='|', header=true, quote='', escape='', "
        "all_varchar=true)",
        {"path": str(path)},
    ).fetchone()[0]
    t_count = time.perf_counter() - t
    t, cpu = time.perf_counter(), tree_cpu_s()
    res = con.execute(DUCKDB_SQL, {"path": str(path)}).fetchall()
    seconds, cpu = time.perf_counter() - t, tree_cpu_s() - cpu
    # Not part of its seconds: the dump's rows written to parquet (zstd) as well, the one
    # piece of ours' work DuckDB can do as is, for a like-with-like reading of the ratio.
    t = time.perf_counter()
    con.execute(
        "COPY (SELECT * FROM read_csv($path, delim='|', header=true, quote='', escape='', "
        "types={'Submit': 'VARCHAR', 'Start': 'VARCHAR', 'End': 'VARCHAR'}))"
        f" TO '{workdir / 'duckdb-rows.parquet'}' (FORMAT parquet, COMPRESSION zstd)",
        {"path": str(path)},
    )
    write_s = time.perf_counter() - t
    (workdir / "duckdb-rows.parquet").unlink(missing_ok=True)
    frame = {
        "allocations": {r[0]: r[1] for r in res},
        "node_hours": {r[0]: r[2] for r in res},
        "gpu_hours": {r[0]: r[3] for r in res},
    }
    out = _by_state_result(frame)
    return {
        "seconds": seconds,
        "cpu_s": cpu,
        "import_s": t_import,
        "count_s": t_count,
        "write_s": write_s,
        "rows": int(rows),
        "threads": int(con.execute("SELECT current_setting('threads')").fetchone()[0]),
        **out,
    }


def run_child(args: argparse.Namespace) -> int:
    path = Path(args.file)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    # What a contender wrote stays for the parent to compare (spawn removes the folder).
    if args.child == "ours":
        result = child_ours(path, False, workdir, args.profile)
    elif args.child == "ours-dask":
        result = child_ours(path, True, workdir, args.profile)
    elif args.child == "pandas":
        result = child_pandas(path)
    elif args.child == "duckdb":
        result = child_duckdb(path, workdir)
    elif args.child == "duckdb-equal":
        result = child_duckdb_equal(path, workdir)
    else:
        raise SystemExit(f"unknown contender {args.child}")
    result["peak_rss_mib"] = self_peak_mib()
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    result["children_peak_rss_mib"] = children
    Path(args.result).write_text(json.dumps(result, default=str))
    return 0


# --- parent -----------------------------------------------------------------------------------


def spawn(contender: str, path: Path, profile: bool = False) -> dict[str, Any]:
    """Run one contender in a fresh interpreter; its result plus wall time and polled RSS."""
    run_dir = CACHE / f"run-{contender}-{os.getpid()}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    result_file = run_dir / "result.json"
    log_file = CACHE / f"{contender}.log"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        contender,
        "--file",
        str(path),
        "--workdir",
        str(run_dir),
        "--result",
        str(result_file),
    ]
    if profile:
        cmd.append("--profile")
    env = {**os.environ}
    env.setdefault(KEY_ENV, BENCH_KEY)
    print(f"  running {contender} ...", end="", flush=True)
    returncode, wall, polled = run_polled(cmd, log_file, env)
    if returncode != 0 or not result_file.exists():
        tail = log_file.read_text(errors="replace")[-4000:]
        shutil.rmtree(run_dir, ignore_errors=True)
        raise SystemExit(
            f"\nFAIL: contender {contender} exited {returncode}; log {log_file}:\n{tail}"
        )
    result = json.loads(result_file.read_text())
    if contender in WRITERS:  # what it wrote, read back once its process has ended
        t = time.perf_counter()
        result["digest"] = {d: dataset_digest(run_dir / "data", d) for d in COMPARED_DATASETS}
        result["digest_s"] = time.perf_counter() - t
    shutil.rmtree(run_dir, ignore_errors=True)
    result["process_wall_s"] = wall
    result["polled_tree_peak_mib"] = polled / MIB
    print(f" {result['seconds']:.1f}s", flush=True)
    return result


# The contenders that write ours' datasets, and those compared between them.
WRITERS = ("ours", "duckdb-equal")
COMPARED_DATASETS = ("jobs", "exposure", "quarantine")


def check_equal_work(results: dict[str, dict[str, Any]]) -> list[str]:
    """What DuckDB's equal work wrote against what ours wrote: the same rows in every
    column (the quarantine's rebuilt raw text aside), the same chains found."""
    ours, duck = results["ours"], results["duckdb-equal"]
    problems = []
    if ours["chains"] != duck["chains"]:
        problems.append(f"duckdb-equal: {duck['chains']} chains, ours {ours['chains']}")
    for name in COMPARED_DATASETS:
        skip = ("raw",) if name == "quarantine" else ()
        a, b = ours["digest"][name], duck["digest"][name]
        problems += [f"duckdb-equal: {p}" for p in compare_digests(a, b, name, REL_TOL, skip)]
    return problems


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b)) or abs(a - b) < 1e-9


def check_agreement(results: dict[str, dict[str, Any]], ref: str = "ours") -> list[str]:
    """Differences between each contender and ``ref``; empty when all agree."""
    problems = []
    base = results[ref]
    for name, r in results.items():
        if name == ref:
            continue
        if r["rows"] != base["rows"]:
            problems.append(f"{name}: read {r['rows']} rows, {ref} {base['rows']}")
        if r["allocations_by_state"] != base["allocations_by_state"]:
            problems.append(
                f"{name}: allocations_by_state {r['allocations_by_state']} != "
                f"{ref} {base['allocations_by_state']}"
            )
        for key in ("gpu_hours_by_state", "node_hours_by_state"):
            a, b = r[key], base[key]
            if set(a) != set(b):
                problems.append(f"{name}: {key} states {sorted(a)} != {ref} {sorted(b)}")
                continue
            for state in sorted(a):
                if not _close(a[state], b[state]):
                    problems.append(f"{name}: {key}[{state}] {a[state]!r} != {ref} {b[state]!r}")
        for key in ("exposed_gpu_hours", "timeout_gpu_hours"):
            if not _close(r[key], base[key]):
                problems.append(f"{name}: {key} {r[key]!r} != {ref} {base[key]!r}")
    return problems


CONTENDERS = ("ours", "pandas", "duckdb", "duckdb-equal")


def run_rounds(path: Path, rounds: int, profile: bool) -> dict[str, list[dict[str, Any]]]:
    """Every contender ``rounds`` times, every other round in reverse order. On this VM a
    process that starts right after a big one has exited pays host page faults for the
    memory that one gave back (DuckDB took 8.0-11.2 s after pandas, 3.7 s on its own): in
    reverse, the one that followed pandas follows another (a rotation would keep it after
    pandas)."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
    for r in range(max(1, rounds)):
        order = CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]
        for name in order:
            first_ours = name == "ours" and not runs["ours"]
            runs[name].append(spawn(name, path, profile=profile and first_ours))
    return runs


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median time (of an even number, the slower of the middle two)."""
    ordered = sorted(runs, key=lambda r: r["seconds"])
    return ordered[len(ordered) // 2]


def print_runs(runs: dict[str, list[dict[str, Any]]]) -> None:
    for name, rs in runs.items():
        times = ", ".join(f"{r['seconds']:.2f}" for r in rs)
        peaks = ", ".join(f"{r['peak_rss_mib']:,.0f}" for r in rs)
        print(f"  every run of {name}: seconds {times}; peak MiB {peaks}")
    print("  (the table below: each contender's median run; of two, the slower)")
    print()


def _fmt_rate(rows: int, secs: float) -> str:
    return f"{rows / secs:,.0f}" if secs > 0 else "-"


def print_table(results: dict[str, dict[str, Any]], rows: int) -> None:
    ours = results["ours"]["seconds"]
    head = (
        f"{'contender':<12} {'seconds':>8} {'CPU s':>7} {'rows/s':>11} {'peak RSS MiB':>13} "
        f"{'vs ours':>8} {'process s':>10}"
    )
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        ratio = r["seconds"] / ours if ours else float("nan")
        print(
            f"{name:<12} {r['seconds']:>8.2f} {r['cpu_s']:>7.2f} "
            f"{_fmt_rate(rows, r['seconds']):>11} {r['peak_rss_mib']:>13,.0f} {ratio:>7.2f}x "
            f"{r['process_wall_s']:>10.2f}"
        )
    print(
        "  seconds: the work alone (from the first read to the result), in a fresh process;\n"
        "  CPU s: user + system seconds of the same work, threads and worker processes summed.\n"
        "  process s: that process's whole life (interpreter start, imports, plan/context).\n"
        "  vs ours: contender seconds / ours seconds (above 1: slower than ours).\n"
        "  peak RSS: the child's own VmHWM (high-water mark of the whole process)."
    )
    for name, r in results.items():
        if r["polled_tree_peak_mib"] > r["peak_rss_mib"] * 1.05:
            print(
                f"  note: {name}'s process tree (polled) peaked at "
                f"{r['polled_tree_peak_mib']:,.0f} MiB, above its own VmHWM"
            )


def print_dask_table(results: dict[str, dict[str, Any]]) -> None:
    head = (
        f"{'contender':<10} {'rows':>12} {'seconds':>8} {'rows/s':>11} {'peak RSS MiB':>13} "
        f"{'process s':>10}"
    )
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        print(
            f"{name:<10} {r['rows']:>12,} {r['seconds']:>8.2f} "
            f"{_fmt_rate(r['rows'], r['seconds']):>11} {r['peak_rss_mib']:>13,.0f} "
            f"{r['process_wall_s']:>10.2f}"
        )
    for name, r in results.items():
        if r["polled_tree_peak_mib"] > r["peak_rss_mib"] * 1.05:
            print(
                f"  note: {name}'s process tree (polled) peaked at "
                f"{r['polled_tree_peak_mib']:,.0f} MiB, above its own VmHWM"
            )


def print_phases(r: dict[str, Any]) -> None:
    print(f"{'  phase':<58} {'seconds':>8} {'calls':>6} {'sampled peak':>13} {'raised HWM':>11}")
    for p in r["phases"]:
        peak, raise_ = p["peak_rss_mib"], p["hwm_raise_mib"]
        peak_s = f"{peak:>13,.0f}" if peak == peak else f"{'':>13}"
        raise_s = f"{raise_:>+11,.0f}" if raise_ == raise_ else f"{'':>11}"
        print(f"  {p['phase']:<56} {p['seconds']:>8.2f} {p['calls']:>6} {peak_s} {raise_s}")
    print(
        f"  (code {r['code_version']}; before run_baseline: imports {r['import_s']:.2f}s, "
        f"plan + run context {r['setup_s']:.2f}s; wrote {r['files_written']} files, "
        f"{r['bytes_written'] / MIB:,.0f} MiB; {r['chains']:,} chains; "
        f"{r['rows_quarantined']:,} rows quarantined)"
    )
    if r.get("unwrapped"):
        print(f"  (not in this code, so not timed: {', '.join(r['unwrapped'])})")
    print(
        f"  memory in MiB: the process's high-water mark was {r['hwm_before_mib']:,.0f} before "
        f"run_baseline, {r['peak_rss_mib']:,.0f} at exit.\n"
        "  'raised HWM': how far the phase pushed that mark up (exact); 'sampled peak': RSS\n"
        "  polled every 10 ms while it ran (a lower bound). Indented phases run inside the\n"
        "  one above them; Dask's threads sum their seconds."
    )


def _peak(r: dict[str, Any]) -> float:
    """A contender's peak: its own VmHWM or its polled process tree, whichever is higher."""
    return max(r["peak_rss_mib"], r["polled_tree_peak_mib"])


def print_ratios(results: dict[str, dict[str, Any]]) -> None:
    """Ours against DuckDB twice: doing ours' work, and only reading and aggregating."""
    ours = results["ours"]
    print("target ours <= duckdb's seconds (same dump):")
    for name, what in (
        (
            "duckdb-equal",
            "equal work: parse + check every field, pseudonymise, jobs + exposure "
            "(+ quarantine, gates) parquet",
        ),
        ("duckdb", "read and aggregate: the by-state numbers only, nothing written"),
    ):
        r = results[name]
        print(
            f"  {what}:\n    ours / {name} = {ours['seconds']:.2f} / {r['seconds']:.2f} s = "
            f"{ours['seconds'] / r['seconds']:.2f}x -> {verdict(ours['seconds'] <= r['seconds'])}"
            f" (CPU s {ours['cpu_s']:.1f} / {r['cpu_s']:.1f} = {ours['cpu_s'] / r['cpu_s']:.2f}x)"
            f"; peak RSS ours {_peak(ours):,.0f} MiB, {name} {_peak(r):,.0f} MiB"
        )
    pand = results["pandas"]
    print(f"  ours / pandas = {ours['seconds'] / pand['seconds']:.2f}x")


def print_equal_work(r: dict[str, Any], problems: list[str]) -> None:
    """DuckDB's equal work by phase, whether it wrote what ours wrote, and what differs."""
    print(f"duckdb-equal, by phase ({r['threads']} threads; wall s, CPU s):")
    for name, (wall, cpu) in r["phases"].items():
        print(f"  {name:<62} {wall:>7.2f} {cpu:>7.2f}")
    print(
        f"  (imports {r['import_s']:.2f}s, fingerprint {r['setup_s']:.2f}s before its seconds; "
        f"wrote {r['files_written']} files, {r['bytes_written'] / MIB:,.0f} MiB; "
        f"{r['chains']:,} chains; {r['checks']} checks; {r['rows_quarantined']:,} rows "
        f"quarantined; what both wrote read back in {r['digest_s']:.1f}s, after)"
    )
    mine = [p for p in problems if "duckdb-equal" in p]
    d = r["digest"]
    print(
        "  same work, checked: "
        + (
            f"jobs {d['jobs']['rows']:,} rows in {d['jobs']['files']} week files, exposure "
            f"{d['exposure']['rows']} rows, quarantine {d['quarantine']['rows']} rows: every "
            "column the same as ours' (a hash of every value; floats to 1e-6), the same "
            "schema, weeks, ranked candidates and chains"
            if not mine
            else f"NO, {len(mine)} differences (listed at the end)"
        )
    )
    print("  not the same as ours:")
    for line in DIFFERENCES:
        print(f"  - {line}")


def _warm(path: Path) -> None:
    """Read the dump once so every contender starts from the page cache."""
    with open(path, "rb") as fh:
        while fh.read(64 << 20):
            pass


def _dump(rows: int, seed: int) -> Path:
    t = time.perf_counter()
    path, made = cached_dump(CACHE, rows, seed)
    size = path.stat().st_size / MIB
    how = f"generated in {time.perf_counter() - t:.1f}s" if made else "reused"
    print(f"dump: {path.relative_to(REPO)} ({rows:,} rows, {size:,.0f} MiB, {how})")
    _warm(path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dask-rows", type=int, default=20_000_000)
    ap.add_argument("--skip-20m", action="store_true", help="skip the Dask run on --dask-rows")
    ap.add_argument(
        "--profile", action="store_true", help="cProfile ours and print the top functions"
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="rounds of the four contenders, every other one in reverse order (default 2)",
    )
    # internal: one contender in this (fresh) process
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return run_child(args)

    drift = restated_drift(PLAN)  # EXPOSED_STATES here, the parse rules duckdb-equal restates
    if drift:
        raise SystemExit(
            "FAIL: the bench's restated rules differ from the product's: " + "; ".join(drift)
        )

    import psutil

    print(
        f"baseline ingest benchmark  {dt.datetime.now():%Y-%m-%d %H:%M}  "
        f"cpus={os.cpu_count()} mem={psutil.virtual_memory().total / 2**30:.0f} GiB "
        f"python={sys.version.split()[0]} code={code_version('tasks')}"
    )
    path = _dump(args.rows, args.seed)
    runs = run_rounds(path, args.rounds, args.profile)
    results = {name: median_run(rs) for name, rs in runs.items()}
    print()
    print_runs(runs)
    # Every round's runs must agree, not only the median ones the table shows.
    problems = [
        f"round {i + 1}: {problem}"
        for i in range(len(runs["ours"]))
        for problem in check_agreement({name: rs[i] for name, rs in runs.items()})
        + check_equal_work({name: rs[i] for name, rs in runs.items()})
    ]
    print_table(results, args.rows)
    print()
    print("ours, by phase (memory path):")
    print_phases(results["ours"])
    if results["ours"].get("profile"):
        print(results["ours"]["profile"])
    print()
    print_equal_work(results["duckdb-equal"], problems)
    ours = results["ours"]
    rate = args.rows / ours["seconds"]
    print()
    print(
        f"target ours >= {TARGET_ROWS_PER_S:,} rows/s end to end: {rate:,.0f} rows/s "
        f"-> {verdict(rate >= TARGET_ROWS_PER_S)}"
    )
    print_ratios(results)
    writes = ", ".join(f"{r['write_s']:.2f}" for r in runs["duckdb"])
    print(
        f"  (not a target) the read-and-aggregate DuckDB writing the dump's rows to parquet "
        f"(zstd), apart from its seconds: {writes} s; ours and duckdb-equal write their "
        f"datasets within theirs"
    )
    # The GX worker (tasks.data.gx_worker) is a second process: the target is the tree's.
    peak = max(ours["peak_rss_mib"], ours["polled_tree_peak_mib"])
    print(
        f"target ours peak RSS < {TARGET_PEAK_MIB:,} MiB (own VmHWM or polled process "
        f"tree, whichever is higher): {peak:,.0f} MiB -> {verdict(peak < TARGET_PEAK_MIB)}"
    )

    if problems:
        return _fail(problems)

    dask_results: dict[str, dict[str, Any]] = {}
    if not args.skip_20m:
        print()
        dpath = _dump(args.dask_rows, args.seed)
        # DuckDB again on the big dump, to check the Dask path's numbers.
        for contender in ("ours-dask", "duckdb"):
            dask_results[contender] = spawn(contender, dpath)
        print()
        print_dask_table(dask_results)
        print()
        print("ours, by phase (Dask path):")
        print_phases(dask_results["ours-dask"])
        d = dask_results["ours-dask"]
        rate = d["rows"] / d["seconds"]
        print()
        print(f"ours-dask: {rate:,.0f} rows/s end to end (no target; the memory path has one)")
        dpeak = max(d["peak_rss_mib"], d["polled_tree_peak_mib"])
        print(
            f"target ours-dask peak RSS < {TARGET_DASK_PEAK_MIB:,} MiB (own or tree): "
            f"{dpeak:,.0f} MiB -> {verdict(dpeak < TARGET_DASK_PEAK_MIB)}"
        )
        dduck = dask_results["duckdb"]["seconds"]
        ratio = d["seconds"] / dduck
        print(f"ours-dask / duckdb = {d['seconds']:.2f} / {dduck:.2f} s = {ratio:.2f}x")
        problems = check_agreement(dask_results, ref="ours-dask")
        if d["rows"] != args.dask_rows or d["rows_quarantined"]:
            problems.append(
                f"ours-dask: read {d['rows']} rows ({d['rows_quarantined']} quarantined) "
                f"of {args.dask_rows}"
            )

    record = CACHE / f"baseline-ingest-{dt.datetime.now():%Y%m%dT%H%M%S}.json"
    record.write_text(
        json.dumps(
            {
                "rows": args.rows,
                "dask_rows": None if args.skip_20m else args.dask_rows,
                "seed": args.seed,
                "code_version": code_version("tasks"),
                "results": results,
                "runs": runs,
                "dask": dask_results,
            },
            default=str,
            indent=1,
        )
    )
    print(f"\nrecord: {record.relative_to(REPO)}")
    if problems:
        return _fail(problems)
    print(
        "agreement: ours, pandas, duckdb and duckdb-equal give the same allocations_by_state, "
        "node/gpu_hours_by_state and exposed/timeout GPU-hours (rel tol 1e-6); duckdb-equal "
        "wrote what ours wrote"
        + ("" if args.skip_20m else "; so do ours-dask and duckdb on the Dask dump")
    )
    return 0


def _fail(problems: list[str]) -> int:
    print("\nFAIL: the contenders disagree:", file=sys.stderr)
    for p in problems:
        print(f"  {p}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
