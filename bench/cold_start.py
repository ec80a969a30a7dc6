"""Cold start benchmark: the serving example's native start against a restore of it, through
the product's own cold-start stage, at three weight sizes, with the page cache dropped and
warm, each restore set beside a raw read of the same image bytes.

    uv run python bench/cold_start.py                         # 256, 1024, 2048 MiB; 3 pairs
    uv run python bench/cold_start.py --sizes 64 --repeats 3  # ~30 s

Per size: a plan (plans/demo.yaml's, its first workload the serving example on a fixed
port, its weights written by `prepare` at that size; `cold_start: {page_cache: [dropped,
warm]}`) run by ``tasks.experiments.cold_start.run_cold_start`` on the local cluster with the
CRIU of ``scripts/install-criu``: per pair a native launch timed to `/ready` 200, a dump of
the ready server, and a restore timed to `/ready` 200. Then, per restore, the stage itself
reads the image files back as the restore found them (its rows' `raw_read_gbps`: the page
cache dropped first for the `dropped` rows, read once untimed first for the `warm` rows), so

    restore efficiency = restore GB/s / raw read GB/s (= raw read s / criu restore s)

(1.0: the restore moved the bytes as fast as reading them does; below: the restore's own
work — forking, mapping, the page-by-page copy — is what costs). Every row is printed and
written to ``.run/bench/cold-start-<time>.json``; nothing is dropped. Images are deleted
after each size.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, code_version, self_peak_mib, write_record

sys.path.insert(0, str(REPO))
from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tasks.engine.prepared import free_port
from tasks.experiments.cold_start import run_cold_start

MIB = 1 << 20


def bench_plan(folder: Path, size_mb: int, repeats: int) -> Path:
    """plans/demo.yaml with the serving example first, its weights ``size_mb`` MiB."""
    plan = yaml.safe_load((REPO / "plans" / "demo.yaml").read_text())
    port = str(free_port())
    weights = "{prepared}/weights.safetensors"
    serve = {
        "name": f"serve-{size_mb}m",
        "prepare": [
            [
                "python",
                "-m",
                "examples.weights",
                weights,
                "--mb",
                str(size_mb),
                "--train-steps",
                "300",
            ]
        ],
        "command": [
            "python",
            "-m",
            "examples.serve_digits",
            "--port",
            port,
            "--weights",
            weights,
        ],
        "gpus": 0,
        "ready_probe": {"url": f"http://127.0.0.1:{port}/ready"},
    }
    plan.pop("workloads", None)
    plan["workload"] = serve
    plan["poc"] = f"bench-cold-{size_mb}m"
    plan["repeats"] = repeats
    plan["cold_start"] = {"page_cache": ["dropped", "warm"]}
    plan["data_dir"] = str(folder / "data")
    path = folder / f"plan-{size_mb}m.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return path


def one_size(folder: Path, size_mb: int, repeats: int) -> list[dict[str, Any]]:
    path = bench_plan(folder, size_mb, repeats)
    plan = load_plan(path, check_cluster=False)
    ctx = make_run_context(plan, path)
    run = run_cold_start(plan, ctx, timeout_s=600)
    rows = run.trials[run.trials["measure"] == "cold_start"]
    out = []
    for trial, pair in rows.groupby("trial_id", sort=False):
        native = pair[pair["arm"] == "unmanaged"].iloc[0]
        restore = pair[pair["arm"] == "managed"]
        row: dict[str, Any] = {
            "size_mb": size_mb,
            "trial": trial,
            "page_cache": native["page_cache"],
            "native_ready_s": native["ready_s"],
            "status": "ok" if (pair["status"] == "ok").all() else "failed",
            "reason": "; ".join(str(r) for r in pair["reason"].dropna()),
        }
        if len(restore) and restore.iloc[0]["status"] == "ok":
            r = restore.iloc[0]
            row.update(
                restore_ready_s=r["ready_s"],
                restore_s=r["restore_s"],
                restore_warmup_s=r["restore_warmup_s"],
                checkpoint_bytes=int(r["checkpoint_bytes"]),
                restore_gbps=r["restore_gbps"],
                raw_read_gbps=r["raw_read_gbps"],  # the stage's own read of the same images
                efficiency=r["restore_gbps"] / r["raw_read_gbps"] if r["raw_read_gbps"] else None,
                speedup=native["ready_s"] / r["ready_s"],
            )
        out.append(row)
    shutil.rmtree(run.run_dir, ignore_errors=True)  # the images: GBs per size
    return out


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def _f(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 2048], help="MiB")
    ap.add_argument("--repeats", type=int, default=3, help="pairs per condition (>= 3)")
    args = ap.parse_args(argv)
    stamp = dt.datetime.now(dt.UTC)
    folder = REPO / ".run" / "bench" / f"cold-start-{stamp:%Y%m%dT%H%M%S}"
    folder.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for size in args.sizes:
        rows += one_size(folder, size, args.repeats)
    print(
        "size MiB | cache   | native→ready s | restore→ready s | speed-up | criu restore s | "
        "image MB | restore GB/s | raw read GB/s | efficiency"
    )
    summary = []
    for size in args.sizes:
        for cache in ("dropped", "warm"):
            group = [r for r in rows if r["size_mb"] == size and r["page_cache"] == cache]
            ok = [r for r in group if r["status"] == "ok"]
            line = {
                "size_mb": size,
                "page_cache": cache,
                "n": len(ok),
                "failed": len(group) - len(ok),
                **{
                    k: _median(ok, k)
                    for k in (
                        "native_ready_s",
                        "restore_ready_s",
                        "speedup",
                        "restore_s",
                        "checkpoint_bytes",
                        "restore_gbps",
                        "raw_read_gbps",
                        "efficiency",
                    )
                },
            }
            summary.append(line)
            mb = line["checkpoint_bytes"] / 1e6 if line["checkpoint_bytes"] else None
            print(
                f"{size:8d} | {cache:7s} | {_f(line['native_ready_s']):>14} | "
                f"{_f(line['restore_ready_s']):>15} | {_f(line['speedup'], 2):>7}× | "
                f"{_f(line['restore_s']):>14} | {_f(mb, 0):>8} | "
                f"{_f(line['restore_gbps'], 2):>12} | {_f(line['raw_read_gbps'], 2):>13} | "
                f"{_f(line['efficiency'], 2):>10}"
            )
    peak = self_peak_mib()
    print(f"bench process peak RSS {peak:.0f} MiB; every row (medians above) in the record")
    record = {
        "bench": "cold_start",
        "started_at": stamp.isoformat(),
        "code": code_version("tasks", "examples", "bench/cold_start.py"),
        "host": os.uname().nodename,
        "cpus": os.cpu_count(),
        "sizes_mb": args.sizes,
        "repeats": args.repeats,
        "summary": summary,
        "rows": rows,
        "bench_peak_rss_mib": peak,
    }
    print(f"record: {write_record(REPO / '.run' / 'bench', 'cold-start', stamp, record)}")
    shutil.rmtree(folder / "data", ignore_errors=True)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
