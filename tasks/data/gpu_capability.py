"""The capability check run before any GPU checkpoint or restore, as NVIDIA's own snapshot
tooling does it: the driver (version and branch), the CUDA version it supports, whether the
toggle is there (the ``cuda-checkpoint`` binary, or the driver's checkpoint API), each GPU's
model, memory, persistence and MIG mode, the kernel (a sandbox such as gVisor reports 4.4.0
and runs no CRIU) — and, for a process, what the driver tells of it (its state, its GPUs).

A restore onto a node whose GPU model, count or driver differs from the checkpoint's is
refused with that reason before CRIU runs (:func:`restore_refusal`).

Plain Python with pynvml (nvidia-ml-py) and ctypes only: ``plan check`` runs it for a plan
whose checkpointer moves GPU state, the GPU checkpointer before each checkpoint and restore,
and the GPU check (scripts/gpu-check) on a bare GPU node.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tasks.data.jsonform import JsonForm

LIBCUDA = "libcuda.so.1"
MIN_DRIVER_BRANCH = 570  # the driver's checkpoint API (the binary alone works from 550)
TOGGLE_SYMBOLS = (
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
    "cuCheckpointProcessGetState",
)
BINARY = "cuda-checkpoint"
BINARY_MIN_BRANCH = 550  # the binary's own minimum (the driver API needs 570)
# Where a driver's tools are kept besides PATH (a GPU container mounts the driver there).
BINARY_DIRS = ("/usr/local/nvidia/bin", "/usr/local/bin", "/usr/bin")
GVISOR_KERNEL = "4.4.0"  # what gVisor's sentry reports as the kernel release


@dataclass(frozen=True)
class Gpu(JsonForm):
    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    persistence: bool | None  # None: not readable
    mig: bool | None


@dataclass(frozen=True)
class Capability(JsonForm):
    """What this node can do for GPU checkpointing; ``problems`` say why it cannot (empty:
    it can)."""

    driver: str | None
    driver_branch: int | None
    cuda: str | None
    toggle: str | None  # "binary:PATH" or "driver-api"; None: neither
    gpus: tuple[Gpu, ...]
    kernel: str
    sandboxed: bool
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(g.model for g in self.gpus)

    @property
    def can_checkpoint(self) -> bool:
        return not self.problems


def find_binary(path: str | None = None) -> str | None:
    """The ``cuda-checkpoint`` binary on PATH or in the driver's folders, or None."""
    found = shutil.which(BINARY, path=path)
    if found or path is not None:
        return found
    return next((p for d in BINARY_DIRS if os.access(p := f"{d}/{BINARY}", os.X_OK)), None)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _gpus(nvml: Any) -> tuple[Gpu, ...]:
    out = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        try:
            persistence: bool | None = bool(nvml.nvmlDeviceGetPersistenceMode(handle))
        except nvml.NVMLError:
            persistence = None
        try:
            mig: bool | None = bool(nvml.nvmlDeviceGetMigMode(handle)[0])
        except nvml.NVMLError:  # NOT_SUPPORTED: a GPU without MIG
            mig = None
        out.append(
            Gpu(
                index=i,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                model=_text(nvml.nvmlDeviceGetName(handle)),
                memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                persistence=persistence,
                mig=mig,
            )
        )
    return tuple(out)


def read_capability(libcuda: str = LIBCUDA, binary_path: str | None = None) -> Capability:
    """This node's capability (module docstring); never raises for what the node lacks:
    that is a problem on the result."""
    kernel = platform.release()
    sandboxed = kernel == GVISOR_KERNEL
    problems: list[str] = []
    notes: list[str] = []
    if sandboxed:
        notes.append(
            f"kernel {kernel}: a gVisor sandbox; CRIU cannot run here, the toggle alone can"
        )
    driver = cuda = None
    gpus: tuple[Gpu, ...] = ()
    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except Exception as exc:  # no library, no driver: pynvml raises its own or OSError
        problems.append(f"NVML unavailable: {exc}")
    else:
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            version = nvml.nvmlSystemGetCudaDriverVersion_v2()
            cuda = f"{version // 1000}.{version % 1000 // 10}"
            gpus = _gpus(nvml)
        finally:
            nvml.nvmlShutdown()
    branch = int(driver.split(".")[0]) if driver and driver.split(".")[0].isdigit() else None
    if not gpus and not problems:
        problems.append("no GPU on this node")
    problems += [f"GPU {g.index} ({g.model}) is in MIG mode: not supported" for g in gpus if g.mig]
    toggle = _toggle(libcuda, binary_path, branch, problems)
    return Capability(
        driver, branch, cuda, toggle, gpus, kernel, sandboxed, tuple(problems), tuple(notes)
    )


def _toggle(
    libcuda: str, binary_path: str | None, branch: int | None, problems: list[str]
) -> str | None:
    """The toggle this node offers; a missing one, or a driver too old for it, a problem."""
    binary = find_binary(binary_path)
    if binary is not None:
        if branch is not None and branch < BINARY_MIN_BRANCH:
            problems.append(
                f"driver {branch} is older than {BINARY_MIN_BRANCH}: {binary} cannot run"
            )
            return None
        return f"binary:{binary}"
    missing = driver_api_missing(libcuda)
    if missing is not None:
        problems.append(f"no toggle: no {BINARY} binary, and {missing}")
        return None
    if branch is not None and branch < MIN_DRIVER_BRANCH:
        problems.append(f"driver {branch} is older than {MIN_DRIVER_BRANCH}: no checkpoint API")
        return None
    return "driver-api"


def process_gpu_bytes(pid: int) -> int | None:
    """The GPU memory NVML says ``pid`` uses (bytes), or None where it cannot tell."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except Exception:
        return None
    try:
        total = 0
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory:
                    total += int(proc.usedGpuMemory)
        return total
    except Exception:
        return None
    finally:
        nvml.nvmlShutdown()


def driver_api_missing(path: str = LIBCUDA) -> str | None:
    """Why ``path`` offers no checkpoint API (no library, or one older than the API), or
    None when it has every call."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        return f"no CUDA driver library ({path}): {exc}"
    missing = [s for s in TOGGLE_SYMBOLS if not hasattr(lib, s)]
    if missing:
        return (
            f"{path} has no {', '.join(missing)}: the driver is older than "
            f"{MIN_DRIVER_BRANCH} (the checkpoint API came with it)"
        )
    return None


def restore_refusal(checkpointed: Mapping[str, Any], here: Capability) -> str | None:
    """Why a checkpoint taken on ``checkpointed`` (a :meth:`Capability.to_json`, kept with
    the checkpoint) must not be restored here, or None: the GPU model or count, or the
    driver, differ (the driver restores onto the same chip type and GPU count only)."""
    then = [g["model"] for g in checkpointed.get("gpus", [])]
    now = list(here.models)
    if sorted(then) != sorted(now):
        return (
            f"GPU model or count differs: the checkpoint's {_gpus_said(then)}, "
            f"this node's {_gpus_said(now)}"
        )
    if checkpointed.get("driver") != here.driver:
        then_driver = checkpointed.get("driver")
        return f"driver differs: the checkpoint's {then_driver}, this node's {here.driver}"
    if not here.can_checkpoint:
        return "this node cannot restore a GPU process: " + "; ".join(here.problems)
    return None


def _gpus_said(models: list[str]) -> str:
    if not models:
        return "no GPU"
    return ", ".join(f"{models.count(m)} × {m}" for m in sorted(set(models)))
