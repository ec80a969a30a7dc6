"""The CUDA driver's checkpoint API through ctypes on libcuda (driver 570 and later): what
the ``cuda-checkpoint`` binary does, with each phase timed apart.

Toggling a process out of its GPU is ``lock`` (no new work accepted; submitted work drains)
then ``checkpoint`` (GPU memory copied into the process's host memory, the GPU released);
back in is ``restore`` (memory copied back onto a GPU) then ``unlock``. The process keeps
running on the CPU throughout; CRIU dumps it between the two toggles (the toggle out before
the dump, the toggle back in after CRIU's restore).

Functions and structures as declared in cuda.h (CUDA 12.8+; the four argument structures are
64 bytes, reserved fields zeroed): ``cuCheckpointProcessLock(int pid, CUcheckpointLockArgs*)``,
``…Checkpoint(int, CUcheckpointCheckpointArgs*)``, ``…Restore(int, CUcheckpointRestoreArgs*)``,
``…Unlock(int, CUcheckpointUnlockArgs*)``, ``…GetState(int, CUprocessState*)``.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tasks.data.gpu_capability import LIBCUDA, driver_api_missing

CUDA_SUCCESS = 0
# CUprocessState
STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}


class _LockArgs(ctypes.Structure):
    _fields_ = [
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


class _Reserved64(ctypes.Structure):  # CUcheckpointCheckpointArgs, CUcheckpointUnlockArgs
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class _RestoreArgs(ctypes.Structure):
    _fields_ = [
        ("gpuPairs", ctypes.c_void_p),
        ("gpuPairsCount", ctypes.c_uint),
        ("reserved", ctypes.c_char * (52 - ctypes.sizeof(ctypes.c_void_p))),
        ("reserved1", ctypes.c_uint64),
    ]


class CudaDriverError(Exception):
    """A driver call failed; ``code`` is its CUresult and the message the driver's name and
    description of it (e.g. CUDA_ERROR_NOT_SUPPORTED for managed memory)."""

    def __init__(self, call: str, code: int, name: str, text: str) -> None:
        super().__init__(f"{call}: {name} ({code}): {text}")
        self.call, self.code, self.name = call, code, name


class ToggleUnavailable(Exception):
    """No driver checkpoint API here: no libcuda, or one without the toggle (before 570)."""


@dataclass
class Phases:
    """Seconds each driver phase took, in the order run."""

    seconds: dict[str, float] = field(default_factory=dict)

    def timed(self, name: str, call: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        call()
        self.seconds[name] = time.perf_counter() - t0


class CudaDriver:
    """libcuda's checkpoint calls (module docstring); ``path`` another libcuda (a test's
    stand-in, or the one a node keeps outside the loader's path)."""

    def __init__(self, path: str = LIBCUDA) -> None:
        missing = driver_api_missing(path)
        if missing is not None:
            raise ToggleUnavailable(missing)
        self.lib = ctypes.CDLL(path)
        self._call("cuInit", ctypes.c_uint(0))

    def _error_text(self, code: int) -> tuple[str, str]:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(name))
        self.lib.cuGetErrorString(code, ctypes.byref(text))
        decode = lambda v: (v.value or b"?").decode(errors="replace")  # noqa: E731
        return decode(name), decode(text)

    def _call(self, name: str, *args: object) -> None:
        code = getattr(self.lib, name)(*args)
        if code != CUDA_SUCCESS:
            raise CudaDriverError(name, code, *self._error_text(code))

    def driver_version(self) -> int:
        """cuDriverGetVersion: the CUDA version the driver supports, e.g. 13000 for 13.0."""
        version = ctypes.c_int()
        self._call("cuDriverGetVersion", ctypes.byref(version))
        return version.value

    def state(self, pid: int) -> str:
        value = ctypes.c_int()
        self._call("cuCheckpointProcessGetState", ctypes.c_int(pid), ctypes.byref(value))
        return STATES.get(value.value, f"unknown({value.value})")

    def lock(self, pid: int, timeout_ms: int = 0) -> None:
        args = _LockArgs(timeoutMs=timeout_ms)
        self._call("cuCheckpointProcessLock", ctypes.c_int(pid), ctypes.byref(args))

    def checkpoint(self, pid: int) -> None:
        args = _Reserved64()
        self._call("cuCheckpointProcessCheckpoint", ctypes.c_int(pid), ctypes.byref(args))

    def restore(self, pid: int) -> None:
        args = _RestoreArgs()
        self._call("cuCheckpointProcessRestore", ctypes.c_int(pid), ctypes.byref(args))

    def unlock(self, pid: int) -> None:
        args = _Reserved64()
        self._call("cuCheckpointProcessUnlock", ctypes.c_int(pid), ctypes.byref(args))

    def toggle_out(self, pid: int, lock_timeout_ms: int = 10_000) -> Phases:
        """Lock, then checkpoint: the process's GPU memory is in its host memory and the GPU
        released (ready for CRIU's dump). A failure after the lock unlocks it again."""
        phases = Phases()
        phases.timed("lock", lambda: self.lock(pid, lock_timeout_ms))
        try:
            phases.timed("gpu_to_host", lambda: self.checkpoint(pid))
        except CudaDriverError:
            self.recover(pid)
            raise
        return phases

    def toggle_in(self, pid: int) -> Phases:
        """Restore, then unlock: the process runs on the GPU again (after CRIU's restore)."""
        phases = Phases()
        phases.timed("host_to_gpu", lambda: self.restore(pid))
        phases.timed("unlock", lambda: self.unlock(pid))
        return phases

    def recover(self, pid: int) -> str:
        """Bring a process a failed step left locked or checkpointed back to running; what
        was done ("running" when nothing was needed). Raises when it cannot: the caller
        kills the process then, so that it never holds the GPU."""
        state = self.state(pid)
        if state == "checkpointed":
            self.restore(pid)
            state = self.state(pid)
        if state == "locked":
            self.unlock(pid)
            return "unlocked"
        return state
