"""The GPU check: the product's GPU path measured on one bare GPU node, in one command.

    scripts/gpu-check OUT [--sizes-mb 1024] [--runs 2] [--pairs 1] [--steps 200]

It needs Python with PyTorch, nvidia-ml-py, pandas and pyarrow (what a GPU node's ML image
has), this checkout, and CRIU (``CKPT_POC_CRIU``; with its libraries beside it); no Prefect,
no Great Expectations, no pydantic. In order:

1. the capability check (driver, CUDA, the toggle, GPUs, persistence, MIG, the kernel);
   whether CRIU runs here (a sandboxed kernel does not run it: then only the toggle of a
   live process is measured, and the summary says so);
2. NVML sampled while the training job runs through, uninterrupted (the losses every
   interrupted run is held to);
3. the training job dumped and restored through CRIU and the toggle, its losses against an
   uninterrupted run's (or, without CRIU, the toggle of the live job);
4. the serving engine's cold start at each size (native launch → ready against restore →
   ready, page cache dropped, bytes and phases on every row), sizes the disk cannot hold
   twice (weights and image) skipped and said;
5. the physical limits (pinned host → device copy; the images' disk read);
6. the managed arm's overhead (A B B A pairs);
7. a process holding managed (UVM) memory, with the driver's own error;
8. a restore refused by the capability check (a checkpoint's metadata edited).

Rows go to ``OUT/gpu-check.parquet`` (every run, failures too) and ``OUT/summary.json``.
``--libcuda`` another libcuda (the contract test's stand-in); ``--device cpu`` runs the same
steps on the CPU with that stand-in (what CI runs).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tasks.data import settings_bare
from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.fingerprint import collect_gpu_metadata
from tasks.data.gpu_capability import read_capability
from tasks.engine.gpu.driver import CudaDriver, ToggleUnavailable
from tasks.poc.gpu_check import steps
from tasks.poc.gpu_check.bench import Bench, criu_runs, free_disk

DEFAULT_SIZES_MB = (1024.0,)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder for the rows and the summary")
    ap.add_argument("--sizes-mb", default=",".join(f"{s:g}" for s in DEFAULT_SIZES_MB))
    ap.add_argument("--runs", type=int, default=2, help="cold starts per size and side")
    ap.add_argument("--pairs", type=int, default=1, help="A B B A overhead pairs")
    ap.add_argument("--steps", type=int, default=200, help="training steps per run")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--libcuda", default=settings_bare.libcuda())
    ap.add_argument("--criu", default=settings_bare.criu())
    args = ap.parse_args(argv)
    try:
        args.sizes = [float(s) for s in args.sizes_mb.split(",") if s]
    except ValueError:
        ap.error(f"--sizes-mb {args.sizes_mb!r}: MiB as numbers, comma-separated")
    if not args.sizes or min(args.sizes) <= 0 or args.runs < 1 or args.steps < 10:
        ap.error("--sizes-mb above 0, --runs 1 or more, --steps 10 or more")
    return args


def _bench(args: argparse.Namespace) -> tuple[Bench, str]:
    capability = read_capability(args.libcuda)
    try:
        driver: CudaDriver | None = CudaDriver(args.libcuda)
    except ToggleUnavailable:
        driver = None
    criu, said = criu_runs(None if capability.sandboxed else args.criu)
    if capability.sandboxed:
        said = f"kernel {capability.kernel}: a sandbox; CRIU not tried"
    return Bench(args.out, capability, driver, criu, args.device), said


# a dict: the summary.json document
def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.time()
    bench, criu_said = _bench(args)
    cap = bench.capability
    bench.row("capability", cap.can_checkpoint, detail={**cap.to_json(), "criu": criu_said})
    _fingerprint(bench)
    try:
        if bench.driver is None:
            return _summary(bench, args, started, criu_said, "no toggle: nothing to measure")
        whole = steps.uninterrupted_with_nvml(bench, args.steps)
        ckpt = None
        if bench.criu is not None:
            ckpt = steps.train_restore(bench, args.steps, whole)
        else:
            steps.toggle_only(bench, args.steps, whole)
        for size in args.sizes:
            need = 2 * size * (1 << 20)  # the weights and their image live on the same disk
            if need > free_disk(args.out):
                bench.row("cold_start", False, size_mb=size, error=f"needs {need} bytes free")
                continue
            steps.cold_start(bench, size, args.runs)
        steps.limits(bench, ckpt)
        if bench.criu is not None:
            steps.overhead(bench, args.steps, args.pairs)
        steps.uvm(bench, args.libcuda)
        if bench.criu is not None:
            steps.refused(bench, ckpt)
    finally:
        bench.close()
    return _summary(bench, args, started, criu_said, None)


def _fingerprint(bench: Bench) -> None:
    """The run fingerprint's GPU fields (tasks/data/fingerprint.py, from NVML) against what
    the capability check read: the same on a real GPU node, or a row saying what differs."""
    fp: dict[str, Any] = {}
    collect_gpu_metadata(fp)
    cap = bench.capability
    expected = {
        "fp_gpu_model": ",".join(sorted(set(cap.models))) or fp["fp_gpu_model"],
        "fp_gpu_count": len(cap.gpus),
        "fp_driver": cap.driver or fp["fp_driver"],
        "fp_cuda": cap.cuda or fp["fp_cuda"],
    }
    differ = {k: (fp[k], v) for k, v in expected.items() if fp[k] != v}
    bench.row("fingerprint", not differ, detail={"fingerprint": fp, "differ": differ})


def _median(rows: list[dict[str, Any]], step: str, **match: Any) -> float | None:
    vals = [
        r["seconds"]
        for r in rows
        if r["step"] == step
        and r.get("seconds") is not None
        and all(json.loads(r.get("detail") or "{}").get(k) == v for k, v in match.items())
    ]
    return statistics.median(vals) if vals else None


# a dict: the summary.json document
def _summary(
    bench: Bench, args: argparse.Namespace, started: float, criu: str, stopped: str | None
) -> dict[str, Any]:
    rows = bench.rows
    a = _median(rows, "overhead", arm=UNMANAGED)
    b = _median(rows, "overhead", arm=MANAGED)
    summary = {
        "at": dt.datetime.now(dt.UTC).isoformat(),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "capability": bench.capability.to_json(),
        "criu": criu,
        "mode": "criu+toggle" if bench.criu else "toggle only (CRIU does not run here)",
        "stopped": stopped,
        "arguments": {k: str(v) for k, v in vars(args).items()},
        "seconds": time.time() - started,
        "cold_start_median_s": {
            f"{s:g}": {
                "native": _median([r for r in rows if r.get("size_mb") == s], "cold_native"),
                "restore": _median([r for r in rows if r.get("size_mb") == s], "cold_restore"),
            }
            for s in args.sizes
        },
        "overhead_pct": None if a is None or b is None else 100 * (b - a) / a,
        "failed_steps": sorted({r["step"] for r in rows if not r["ok"]}),
        "rows": rows,
    }
    _write(bench.out, rows, summary)
    return summary


def _write(out: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows)
    tmp = out / ".gpu-check.parquet.tmp"
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, out / "gpu-check.parquet")
    tmp = out / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=str))
    os.replace(tmp, out / "summary.json")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    summary = run(args)
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, default=str))
    return 0 if not summary["failed_steps"] else 1


if __name__ == "__main__":
    sys.exit(main())
