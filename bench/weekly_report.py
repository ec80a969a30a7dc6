"""Weekly report benchmark: ``tasks.window.sample_summary`` against the same aggregation in
DuckDB SQL on the same long window, each in a fresh subprocess.

    uv run python bench/weekly_report.py                     # 120 days x 64 GPUs (~66 M rows)
    uv run python bench/weekly_report.py --days 7 --gpus 8   # a quick run (~0.5 M rows)

The window (bench/synth_samples.py) is generated once into the real dataset layout and
cached under ``--data`` (default ``.run/bench/weekly-d<days>-g<gpus>-s<seed>-v<version>``);
both contenders read the committed files that ``tasks.data.store.dataset_files`` lists.

* ours: ``weekly_sample_summary(files)`` over all weeks, then ``weekly_gap_summary``.
* duckdb: one SQL query over ``read_parquet([...files], hive_partitioning=true)`` per summary,
  exact ``quantile_cont``.

The rows must agree (keys, n and points exactly; floats to 1e-9 relative; timestamps
exactly) or it exits 1. Peak RSS is each child's own ``VmHWM``, cross-checked by polling
its process tree. Prints ours/DuckDB and PASS/MISS against: ratio <= 1.5, peak < 4 GiB.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

from benchlib import code_version, run_polled, self_peak_mib, verdict  # noqa: E402

CACHE = REPO / ".run" / "bench"
MIB = 1 << 20
REL_TOL = 1e-9
TARGET_RATIO = 1.5
TARGET_PEAK_MIB = 4096

DUCKDB_SAMPLES = """
SELECT week, node, arm, workload, device, metric, unit,
    count(*) AS n,
    sum(points) AS points,
    CASE WHEN sum(d_us) > 0 THEN sum(value * (d_us / 1e6)) / (sum(d_us) / 1e6) END AS mean,
    quantile_cont(value, 0.5) AS p50,
    quantile_cont(value, 0.95) AS p95,
    sum(d_us) / 1e6 AS covered_s,
    min(t_from) AS first_t_from,
    max(t_to) AS last_t_to
FROM (
    SELECT week, node, arm, workload, device, metric, unit, value, points, t_from, t_to,
        epoch_us(t_to) - epoch_us(t_from) AS d_us
    FROM read_parquet($files, hive_partitioning = true)
)
GROUP BY ALL
"""

DUCKDB_GAPS = """
SELECT week, node, source, reason, count(*) AS gaps, sum(gap_s) AS gap_s
FROM read_parquet($files, hive_partitioning = true)
GROUP BY ALL
"""


# --- children ---------------------------------------------------------------------------------


def child_ours(samples: list[str], gaps: list[str], out: Path) -> dict[str, Any]:
    from tasks.window.sample_summary import weekly_gap_summary, weekly_sample_summary

    t = time.perf_counter()
    summary = weekly_sample_summary(samples)
    seconds = time.perf_counter() - t
    t = time.perf_counter()
    gap = weekly_gap_summary(gaps)
    gap_seconds = time.perf_counter() - t
    summary.to_parquet(out / "samples.parquet")
    gap.to_parquet(out / "gaps.parquet")
    return {"seconds": seconds, "gap_seconds": gap_seconds}


def child_duckdb(samples: list[str], gaps: list[str], out: Path) -> dict[str, Any]:
    import duckdb
    import pyarrow.parquet as pq

    con = duckdb.connect()
    t = time.perf_counter()
    summary = con.execute(DUCKDB_SAMPLES, {"files": samples}).to_arrow_table()
    seconds = time.perf_counter() - t
    t = time.perf_counter()
    gap = con.execute(DUCKDB_GAPS, {"files": gaps}).to_arrow_table()
    gap_seconds = time.perf_counter() - t
    pq.write_table(summary, out / "samples.parquet")
    pq.write_table(gap, out / "gaps.parquet")
    threads = int(con.execute("SELECT current_setting('threads')").fetchone()[0])
    return {"seconds": seconds, "gap_seconds": gap_seconds, "threads": threads}


def run_child(args: argparse.Namespace) -> int:
    lists = json.loads(Path(args.files).read_text())
    out = Path(args.out)
    child = {"ours": child_ours, "duckdb": child_duckdb}[args.child]
    result = child(lists["samples"], lists["gaps"], out)
    result["peak_rss_mib"] = self_peak_mib()
    (out / "result.json").write_text(json.dumps(result))
    return 0


# --- parent -----------------------------------------------------------------------------------


def spawn(contender: str, files_json: Path, work: Path) -> dict[str, Any]:
    """One contender in a fresh interpreter: its result, wall time and polled tree RSS."""
    out = work / contender
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    log_file = work / f"{contender}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", contender]
    cmd += ["--files", str(files_json), "--out", str(out)]
    print(f"  running {contender} ...", end="", flush=True)
    returncode, wall, polled = run_polled(cmd, log_file)
    if returncode != 0 or not (out / "result.json").exists():
        tail = log_file.read_text(errors="replace")[-4000:]
        raise SystemExit(f"\nFAIL: {contender} exited {returncode}; {log_file}:\n{tail}")
    result = json.loads((out / "result.json").read_text())
    result.update(process_wall_s=wall, polled_tree_peak_mib=polled / MIB, out=str(out))
    print(f" {result['seconds']:.1f}s", flush=True)
    return result


def _normalise(path: Path, dtypes: dict[str, Any], keys: tuple[str, ...]) -> Any:
    import pandas as pd

    df = pd.read_parquet(path)
    df = df[list(dtypes)].astype(dtypes)
    return df.sort_values(list(keys), na_position="last", kind="stable").reset_index(drop=True)


def compare(ours_dir: Path, duck_dir: Path) -> list[str]:
    """What differs between the two contenders' rows; empty when they agree."""
    import pandas as pd

    from tasks.window.sample_summary import GAP_DTYPES, GAP_KEYS, GROUP_KEYS, SUMMARY_DTYPES

    problems = []
    for name, dtypes, keys in (
        ("samples", SUMMARY_DTYPES, GROUP_KEYS),
        ("gaps", GAP_DTYPES, GAP_KEYS),
    ):
        a = _normalise(ours_dir / f"{name}.parquet", dtypes, keys)
        b = _normalise(duck_dir / f"{name}.parquet", dtypes, keys)
        try:
            pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=REL_TOL, atol=0)
        except AssertionError as exc:
            problems.append(f"{name}: {exc}")
    return problems


def _warm(files: list[str]) -> int:
    """Read every file once so both contenders start from the page cache."""
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            while chunk := fh.read(16 << 20):
                total += len(chunk)
    return total


def _window(args: argparse.Namespace) -> Path:
    from synth_samples import GENERATOR_VERSION, generate

    data = (
        Path(args.data)
        if args.data
        else (CACHE / f"weekly-d{args.days}-g{args.gpus}-s{args.seed}-v{GENERATOR_VERSION}")
    )
    done = data / "complete.json"
    if done.exists():
        print(f"window: {data} (reused)")
        return data
    shutil.rmtree(data, ignore_errors=True)  # a half-written window is never reused
    print(f"window: generating {args.days} days x {args.gpus} GPUs into {data}")
    t = time.perf_counter()
    rows = generate(data, args.days, args.gpus, args.seed, progress=True)
    seconds = time.perf_counter() - t
    done.write_text(json.dumps({"rows": rows, "seconds": seconds, "args": vars(args)}))
    print(f"window: {rows:,} sample rows generated in {seconds:.0f}s")
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=120)
    ap.add_argument("--gpus", type=int, default=64, help="rounded up to whole 8-GPU nodes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", help="where the window is (cached); default under .run/bench/")
    # internal: one contender in this (fresh) process
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--files", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return run_child(args)

    import psutil
    import pyarrow.parquet as pq
    from synth_samples import POC

    from tasks.data.datasets import SAMPLE_GAPS, SAMPLES
    from tasks.data.store import dataset_files

    print(
        f"weekly report benchmark  {dt.datetime.now():%Y-%m-%d %H:%M}  "
        f"cpus={os.cpu_count()} mem={psutil.virtual_memory().total / 2**30:.0f} GiB "
        f"python={sys.version.split()[0]} code={code_version('tasks', 'bench')}"
    )
    data = _window(args)
    samples = dataset_files(data, POC, SAMPLES)
    gaps = dataset_files(data, POC, SAMPLE_GAPS)
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in samples)
    size = _warm(samples + gaps)
    weeks = len({Path(f).parent.name for f in samples})
    print(
        f"input: {rows:,} sample rows in {len(samples):,} files over {weeks} weeks, "
        f"{len(gaps):,} gap files, {size / MIB:,.0f} MiB on disk"
    )
    work = CACHE / f"weekly-run-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    files_json = work / "files.json"
    files_json.write_text(json.dumps({"samples": samples, "gaps": gaps}))
    results = {c: spawn(c, files_json, work) for c in ("ours", "duckdb")}
    problems = compare(Path(results["ours"]["out"]), Path(results["duckdb"]["out"]))

    print()
    head = (
        f"{'contender':<9} {'samples s':>10} {'rows/s':>12} {'gaps s':>7} "
        f"{'peak RSS MiB':>13} {'process s':>10}"
    )
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        print(
            f"{name:<9} {r['seconds']:>10.2f} {rows / r['seconds']:>12,.0f} "
            f"{r['gap_seconds']:>7.2f} {r['peak_rss_mib']:>13,.0f} {r['process_wall_s']:>10.2f}"
        )
        if r["polled_tree_peak_mib"] > r["peak_rss_mib"] * 1.05:
            print(f"  note: {name}'s process tree peaked at {r['polled_tree_peak_mib']:,.0f} MiB")
    ours, duck = results["ours"], results["duckdb"]
    ratio = ours["seconds"] / duck["seconds"]
    print(
        "  samples s: weekly_sample_summary / the DuckDB query alone, in a fresh process;\n"
        f"  duckdb threads={duck['threads']}; peak RSS: the child's own VmHWM."
    )
    print()
    print(
        f"ours / duckdb (samples): {ratio:.2f}x -> target <= {TARGET_RATIO}x: "
        f"{verdict(ratio <= TARGET_RATIO)}"
    )
    for name, r in results.items():
        print(
            f"peak RSS {name}: {r['peak_rss_mib']:,.0f} MiB -> target < {TARGET_PEAK_MIB:,} MiB: "
            f"{verdict(r['peak_rss_mib'] < TARGET_PEAK_MIB)}"
        )
    record = CACHE / f"weekly-report-{dt.datetime.now():%Y%m%dT%H%M%S}.json"
    record.write_text(
        json.dumps(
            {
                "rows": rows,
                "files": len(samples),
                "weeks": weeks,
                "args": vars(args),
                "code_version": code_version("tasks", "bench"),
                "results": results,
            },
            indent=1,
            default=str,
        )
    )
    shutil.rmtree(work, ignore_errors=True)
    print(f"record: {record.relative_to(REPO)}")
    if problems:
        print("\nFAIL: the contenders disagree:", file=sys.stderr)
        for p in problems:
            print(f"  {p[:2000]}", file=sys.stderr)
        return 1
    print("agreement: ours and duckdb give the same rows (samples and gaps; floats to 1e-9 rel)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
