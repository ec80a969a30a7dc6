"""The GPU check's measurements (tasks/poc/gpu_check/check.py runs them in order). Each keeps
its rows on the bench, failures included, with the bytes and the phases; none raises for what
the node cannot do: that is a row saying so."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.gpu_capability import process_gpu_bytes
from tasks.engine.checkpointers.criu import Checkpoint, CriuError
from tasks.engine.gpu.driver import CudaDriverError
from tasks.engine.page_cache import drop_page_cache, raw_read
from tasks.engine.ports import free_port
from tasks.poc.gpu_check.bench import SLOT, Bench, wait_ready, workload

STEP = re.compile(r"^step=(\d+) loss=(\S+)$", re.M)
TRAIN = ["--layers", "4", "--d-model", "256", "--heads", "4", "--context", "128", "--batch", "16"]


def losses(text: str) -> dict[int, str]:
    return {int(s): loss for s, loss in STEP.findall(text)}


def _train_argv(bench: Bench, steps: int, sleep: float = 0.0) -> list[str]:
    small = bench.device == "cpu"  # the contract run on a CPU machine: its smallest size
    sizes = (
        [
            "--layers",
            "1",
            "--d-model",
            "32",
            "--heads",
            "2",
            "--context",
            "16",
            "--batch",
            "4",
            "--vocab",
            "64",
        ]
        if small
        else TRAIN
    )
    return workload(
        "train_lm",
        *sizes,
        "--steps",
        str(steps),
        "--step-sleep",
        str(sleep),
        "--device",
        bench.device,
    )


def _wait_steps(log: Path, at_least: int, timeout: float = 300) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = losses(log.read_text())
        if len(seen) >= at_least:
            return max(seen)
        time.sleep(0.05)
    raise TimeoutError(f"{log}: fewer than {at_least} steps in {timeout:.0f} s")


def uninterrupted_with_nvml(bench: Bench, steps: int) -> dict[int, str]:
    """The training job run through, uninterrupted (its losses are what every interrupted
    run is held to), with NVML sampled every 0.5 s meanwhile: what the product's sampler saw
    of the GPUs and of the job's own process."""
    from tasks.window.sampling import UNATTRIBUTED
    from tasks.window.sampling.nvml import NvmlSampler, NvmlUnavailable

    log = bench.out / "uninterrupted.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(_train_argv(bench, steps), stdout=out)
    try:
        sampler: NvmlSampler | None = NvmlSampler("gpu-check", lambda pid: UNATTRIBUTED)
    except NvmlUnavailable as exc:
        bench.row("nvml", False, error=str(exc))
        sampler = None
    samples: list[dict[str, Any]] = []
    gaps: list[dict[str, Any]] = []
    reads = 0
    while proc.poll() is None:
        if sampler is not None:
            got, missed = sampler.read()
            samples, gaps, reads = samples + got, gaps + missed, reads + 1
        time.sleep(0.5)
    if proc.returncode != 0:
        raise RuntimeError(f"the uninterrupted training run exited {proc.returncode}: {log}")
    if sampler is not None:
        sampler.close()
        mine = any(str(r.get("entity", "")).endswith(f"pid:{proc.pid}") for r in samples)
        detail = {
            "reads": reads,
            "samples": len(samples),
            "metrics": sorted({str(r["metric"]) for r in samples}),
            "gaps": sorted({str(g["reason"]) for g in gaps})[:10],
            "training_process_seen": mine,
        }
        bench.row("nvml", bool(samples), detail=detail)
    return losses(log.read_text())


def train_restore(bench: Bench, steps: int, whole: dict[int, str]) -> Path | None:
    """The training job dumped (a fault's dump: it ends) and restored through CRIU and the
    toggle; its losses against the uninterrupted run's. Returns the checkpoint's folder."""
    gpu = bench.checkpointer("train")
    proc = bench.cluster.start(SLOT, MANAGED, _train_argv(bench, steps, 0.02))
    try:
        _wait_steps(proc.log, steps // 3)
        gpu_bytes = process_gpu_bytes(proc.pid)
        ckpt = gpu.dump(proc, leave_running=False)
        bench.cluster.wait_gone(proc)
        dump = bench.phases("train", "dump")
        restored = gpu.restore(bench.cluster, SLOT, ckpt)
        restore = bench.phases("train", "restore")
        deadline = time.monotonic() + 300
        while restored.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        seen = losses(proc.log.read_text())
    except (CriuError, CudaDriverError, TimeoutError) as exc:
        bench.row("train_restore", False, error=str(exc), phases=bench.phases("train", "dump"))
        return None
    match = seen == whole
    bench.row(
        "train_restore",
        match,
        gpu_bytes=gpu_bytes,
        image_bytes=ckpt.image_bytes,
        phases={"dump": dump, "restore": restore},
        detail={
            "steps": len(seen),
            "losses_match_uninterrupted": match,
            "last_step": max(seen, default=None),
        },
    )
    return ckpt.path


def toggle_only(bench: Bench, steps: int, whole: dict[int, str]) -> None:
    """Where CRIU cannot run (a sandboxed kernel): the toggle of a live training process —
    lock + checkpoint (GPU memory to host), then restore + unlock — and its losses after."""
    assert bench.driver is not None
    proc = subprocess.Popen(_train_argv(bench, steps, 0.02), stdout=subprocess.PIPE, text=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout or []), daemon=True)
    reader.start()
    time.sleep(2)
    gpu_bytes = process_gpu_bytes(proc.pid)
    try:
        phases = bench.driver.toggle_out(proc.pid).seconds
        time.sleep(1)  # checkpointed: its CPU side waits on the GPU
        phases |= bench.driver.toggle_in(proc.pid).seconds
    except CudaDriverError as exc:
        bench.row("toggle_only", False, error=str(exc))
        proc.kill()
        return
    proc.wait(600)
    reader.join(10)
    match = losses("".join(out)) == whole
    bench.row(
        "toggle_only",
        match,
        gpu_bytes=gpu_bytes,
        phases=phases,
        detail={"losses_match_uninterrupted": match},
    )


def cold_start(bench: Bench, size_mb: float, runs: int) -> None:
    """The serving engine at ``size_mb``: native launch → ready against restore → ready,
    ``runs`` times each, the page cache dropped before every start."""
    weights = bench.out / "weights" / f"{size_mb:g}"
    prep = subprocess.run(
        workload("weights_lm", str(weights), "--mb", str(size_mb)), capture_output=True, text=True
    )
    if prep.returncode != 0:
        bench.row("cold_start", False, size_mb=size_mb, error=prep.stderr[-500:])
        return
    files = sorted(weights.glob("*.safetensors"))
    for run in range(runs):
        port = free_port()
        argv = workload(
            "serve_lm", "--weights", str(weights), "--port", str(port), "--device", bench.device
        )
        cache = drop_page_cache(files).state
        t0 = time.perf_counter()
        proc = bench.cluster.start(SLOT, UNMANAGED, argv, tag=f"native{run}")
        ready = wait_ready(port, proc.alive, 600)
        native_s = None if ready is None else time.perf_counter() - t0
        bench.row(
            "cold_native",
            native_s is not None,
            size_mb=size_mb,
            run=run,
            seconds=native_s,
            detail={"cache": cache},
        )
        if native_s is None:
            bench.cluster.stop_all()
            continue
        if bench.criu is not None:
            _restore_side(bench, proc, size_mb, run, port, files)
        bench.cluster.stop_all()


def _restore_side(
    bench: Bench, proc: Any, size_mb: float, run: int, port: int, files: list[Path]
) -> None:
    gpu = bench.checkpointer(f"serve{size_mb:g}")
    gpu_bytes = process_gpu_bytes(proc.pid)
    try:
        ckpt = gpu.dump(proc, leave_running=False)
        bench.cluster.wait_gone(proc)
        images = sorted(ckpt.path.glob("*.img"))
        cache = drop_page_cache([*files, *images]).state
        t0 = time.perf_counter()
        back = gpu.restore(bench.cluster, SLOT, ckpt)
        ready = wait_ready(port, back.alive, 600)
    except (CriuError, CudaDriverError) as exc:
        bench.row("cold_restore", False, size_mb=size_mb, run=run, error=str(exc))
        return
    seconds = None if ready is None else time.perf_counter() - t0
    name = f"serve{size_mb:g}"
    bench.row(
        "cold_restore",
        seconds is not None,
        size_mb=size_mb,
        run=run,
        seconds=seconds,
        gpu_bytes=gpu_bytes,
        image_bytes=ckpt.image_bytes,
        phases={"dump": bench.phases(name, "dump"), "restore": bench.phases(name, "restore")},
        detail={"cache": cache, "images": str(ckpt.path)},
    )


def limits(bench: Bench, images: Path | None) -> None:
    """The physical limits, measured here: pinned host → device copy bandwidth, and the
    read bandwidth of the disk holding the images (page cache dropped)."""
    if bench.device == "cuda":
        import torch

        n = 1 << 30
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        gbps = 5 * n / (time.perf_counter() - t0) / 1e9
        bench.row("limit_h2d", True, detail={"gbps": gbps, "bytes": n})
    if images is not None and images.exists():
        files = sorted(images.glob("*.img"))
        seconds, nbytes = raw_read(files, "dropped")
        bench.row(
            "limit_disk_read",
            True,
            seconds=seconds,
            detail={
                "bytes": nbytes,
                "gbps": nbytes / seconds / 1e9 if seconds else None,
                "folder": str(images),
            },
        )


def overhead(bench: Bench, steps: int, pairs: int) -> None:
    """The managed arm's cost: A B B A pairs of the same training, B with a GPU checkpoint
    (left running) every 5 s; each row the run's seconds per step."""
    for pair in range(pairs):
        for arm in (UNMANAGED, MANAGED, MANAGED, UNMANAGED):
            t0 = time.perf_counter()
            proc = bench.cluster.start(SLOT, arm, _train_argv(bench, steps), tag=f"o{pair}")
            dumps = 0
            gpu = bench.checkpointer("overhead") if arm == MANAGED else None
            while proc.alive():
                time.sleep(0.2 if gpu is None else 5)
                if gpu is not None and proc.alive():
                    try:
                        gpu.dump(proc)
                        dumps += 1
                    except (CriuError, CudaDriverError):
                        break  # the job ended during the dump: its end is the measure
            bench.cluster.wait_gone(proc, 600)
            seconds = time.perf_counter() - t0
            bench.row(
                "overhead",
                True,
                run=pair,
                seconds=seconds,
                detail={"arm": arm, "steps": steps, "dumps": dumps},
            )


UVM_PROGRAM = """
import ctypes, sys, time
cuda = ctypes.CDLL(sys.argv[1])
ctx, ptr = ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0 and cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
assert cuda.cuMemAllocManaged(ctypes.byref(ptr), 1 << 20, 1) == 0  # 1 MiB, CU_MEM_ATTACH_GLOBAL
print("ready", flush=True)
time.sleep(120)
"""


def uvm(bench: Bench, libcuda: str) -> None:
    """A process holding managed (UVM) memory, which the driver cannot checkpoint: the
    driver's own error is the result, and the process is left running."""
    assert bench.driver is not None
    argv = [sys.executable, "-c", UVM_PROGRAM, libcuda]  # the stand-in libcuda's too
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    try:
        if line.strip() != "ready":
            bench.row("uvm", False, error=f"the UVM program did not start: {line!r}")
            return
        try:
            bench.driver.toggle_out(proc.pid)
        except CudaDriverError as exc:
            state = bench.driver.state(proc.pid)
            bench.row(
                "uvm",
                True,
                error=str(exc),
                detail={
                    "driver_error": exc.name,
                    "state_after": state,
                    "alive_after": proc.poll() is None,
                },
            )
            return
        bench.driver.toggle_in(proc.pid)
        bench.row("uvm", False, error="the driver checkpointed managed memory: not expected")
    finally:
        proc.kill()
        proc.wait()


def refused(bench: Bench, ckpt_path: Path | None) -> None:
    """A restore refused by the capability check: a copy of a checkpoint whose metadata is
    edited to name another GPU model."""
    if ckpt_path is None:
        bench.row("refused_restore", False, error="no checkpoint to copy")
        return
    copy = bench.out / "images" / "refused" / ckpt_path.name
    shutil.copytree(ckpt_path, copy, dirs_exist_ok=True)
    meta = json.loads((copy / "gpu.json").read_text())
    for gpu in meta["capability"]["gpus"]:
        gpu["model"] = "NVIDIA A10 (edited)"
    (copy / "gpu.json").write_text(json.dumps(meta))
    loaded = Checkpoint.load(copy)
    if loaded is None:
        bench.row("refused_restore", False, error=f"{copy}: not a complete checkpoint")
        return
    try:
        bench.checkpointer("refused").restore(bench.cluster, SLOT, replace(loaded, path=copy))
    except CriuError as exc:
        bench.row("refused_restore", "restore refused before CRIU ran" in str(exc), error=str(exc))
        return
    bench.row("refused_restore", False, error="restored onto a GPU the checkpoint did not name")
    bench.cluster.stop_all()
