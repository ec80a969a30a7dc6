"""The GPU checkpointer: CRIU with cuda-checkpoint, every phase of a GPU process's dump and
restore timed apart.

Two ways to move a process's GPU state, found by the capability check
(tasks/data/gpu_capability.py) before anything runs:

- **the driver API** (no ``cuda-checkpoint`` binary on the node; driver 570+): the harness
  toggles each CUDA process of the copy itself, through libcuda (tasks/engine/gpu/driver.py),
  around a plugin-less CRIU: lock and checkpoint (GPU → host) before CRIU's dump; after it,
  restore and unlock again when the copy runs on; after CRIU's restore, restore (host → GPU)
  and unlock. Phases: ``lock``, ``gpu_to_host``, ``criu_dump`` | ``criu_restore``,
  ``host_to_gpu``, ``unlock``.
- **the binary**: CRIU's CUDA plugin calls ``cuda-checkpoint`` inside CRIU's dump and
  restore (scripts/install-criu builds the plugin); the GPU phases are inside CRIU's and are
  not timed apart (the event says so).

Each checkpoint keeps the capability it was taken under (``gpu.json``); a restore onto a node
whose GPU model, count or driver differs is refused with that reason before CRIU runs. A
process a failed step leaves locked or checkpointed is brought back (or, failing that,
killed), and the event says which: it never keeps holding the GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, TypedDict

from tasks.data.events import Ev
from tasks.data.gpu_capability import (
    Capability,
    process_gpu_bytes,
    read_capability,
    restore_refusal,
)
from tasks.engine.checkpointers.criu import Checkpoint, CriuCheckpointer, CriuError
from tasks.engine.clock import Event
from tasks.engine.clusters.process import ProcessSlots, WorkloadProcess
from tasks.engine.clusters.reaper import descendants
from tasks.engine.gpu.driver import CudaDriver, CudaDriverError, ToggleUnavailable

GPU_META = "gpu.json"


class _Toggle(TypedDict):
    toggle: str  # how the GPU's part ran (GpuCriuCheckpointer.how)


class ToggleSaid(_Toggle, total=False):
    """What a `gpu_phases` event says of the toggle; in CRIU's plugin, that its phases are
    inside CRIU's."""

    note: str


class GpuCriuCheckpointer:
    """A :class:`CriuCheckpointer` with the GPU's part (module docstring). ``driver`` None:
    CRIU's CUDA plugin toggles (the binary)."""

    def __init__(
        self, criu: CriuCheckpointer, capability: Capability, driver: CudaDriver | None
    ) -> None:
        self.criu, self.capability, self.driver = criu, capability, driver

    def __getattr__(self, name: str) -> Any:
        # What only CRIU's checkpointer has (its root, options, last restore's statistics).
        return getattr(self.criu, name)

    def record(self, event: str, **detail: object) -> Event:
        return self.criu.record(event, **detail)

    def complete(self) -> list[Checkpoint]:
        return self.criu.complete()

    def last_complete(self) -> Checkpoint | None:
        return self.criu.last_complete()

    def close(self) -> None:
        self.criu.close()

    def cuda_pids(self, root: int) -> list[int]:
        """The processes of the copy the driver knows as CUDA processes."""
        if self.driver is None:
            return []
        found = []
        for pid in [root, *descendants(root)]:
            try:
                self.driver.state(pid)
            except CudaDriverError:
                continue  # not a CUDA process
            found.append(pid)
        return found

    def _bring_back(self, pid: int, why: str) -> str:
        """After a failed step: the process running again on the GPU, or killed."""
        assert self.driver is not None
        try:
            done = self.driver.recover(pid)
        except CudaDriverError as exc:
            with_kill = f"could not be brought back ({exc}): killed"
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                with_kill = f"could not be brought back ({exc}) and was gone"
            self.record(Ev.GPU_RECOVERY, pid=pid, after=why, outcome=with_kill)
            return with_kill
        self.record(Ev.GPU_RECOVERY, pid=pid, after=why, outcome=done)
        return done

    def dump(
        self, proc: WorkloadProcess, *, leave_running: bool = True, timeout: float | None = None
    ) -> Checkpoint:
        if not self.capability.can_checkpoint:
            why = "; ".join(self.capability.problems)
            self.record(Ev.CHECKPOINT_FAILED, cause="gpu_capability", error=why)
            raise CriuError(f"GPU checkpoint refused by the capability check: {why}")
        phases: dict[str, float] = {}
        pids = self.cuda_pids(proc.pid)
        gpu_bytes = [process_gpu_bytes(pid) for pid in pids]  # NVML's, before the toggle
        toggled: list[int] = []
        for pid in pids:
            assert self.driver is not None
            try:
                out = self.driver.toggle_out(pid)
            except CudaDriverError as exc:
                for done in toggled:
                    self.driver.toggle_in(done)
                self.record(Ev.CHECKPOINT_FAILED, cause=exc.name, error=str(exc), pid=pid)
                message = f"the driver could not checkpoint pid {pid}: {exc}"
                raise CriuError(message, cause=exc.name) from exc
            toggled.append(pid)
            _add(phases, out.seconds)
        t0 = time.perf_counter()
        try:
            ckpt = self.criu.dump(proc, leave_running=leave_running, timeout=timeout)
        except CriuError:
            for pid in toggled:
                self._bring_back(pid, "a failed CRIU dump")
            raise
        phases["criu_dump"] = time.perf_counter() - t0
        meta = {"capability": self.capability.to_json(), "cuda_pids": pids, "toggle": self.how}
        (ckpt.path / GPU_META).write_text(json.dumps(meta))
        if leave_running:
            for pid in toggled:
                assert self.driver is not None
                _add(phases, self.driver.toggle_in(pid).seconds)
        moved = None if None in gpu_bytes else sum(b for b in gpu_bytes if b is not None)
        self.record(Ev.GPU_PHASES, step="dump", index=ckpt.index, phases=phases, gpu_bytes=moved,
                    image_bytes=ckpt.image_bytes, cuda_pids=pids, **self._said())  # fmt: skip
        return ckpt

    @property
    def how(self) -> str:
        return "driver-api" if self.driver is not None else "cuda-checkpoint in CRIU's plugin"

    def _said(self) -> ToggleSaid:
        """What a `gpu_phases` event says of the toggle (its fields, as kwargs)."""
        if self.driver is None:
            return {"toggle": self.how, "note": "the GPU phases are inside CRIU's"}
        return {"toggle": self.how}

    def restore(
        self, cluster: ProcessSlots, slot: str, checkpoint: Checkpoint | None = None
    ) -> WorkloadProcess:
        ckpt = checkpoint or self.criu.last_complete()
        if ckpt is None:
            raise CriuError(f"no complete checkpoint under {self.criu.root} to restore")
        self._refuse_another_gpu(ckpt)
        t0 = time.perf_counter()
        proc = self.criu.restore(cluster, slot, ckpt)
        self._back_onto_gpu(proc.pid, ckpt.index, time.perf_counter() - t0)
        return proc

    def restore_attached(
        self, checkpoint: Checkpoint, timeout: float = 120
    ) -> tuple[subprocess.Popen, int]:
        """CRIU's foreground restore (a Slurm job's), then the copy back onto its GPUs."""
        self._refuse_another_gpu(checkpoint)
        t0 = time.perf_counter()
        proc, pid = self.criu.restore_attached(checkpoint, timeout)
        self._back_onto_gpu(pid, checkpoint.index, time.perf_counter() - t0)
        return proc, pid

    def _refuse_another_gpu(self, ckpt: Checkpoint) -> None:
        """Before CRIU runs: a checkpoint of another GPU model, count or driver is refused."""
        try:
            meta = json.loads((ckpt.path / GPU_META).read_text())
        except (OSError, ValueError) as exc:
            where = ckpt.path / GPU_META
            raise CriuError(f"{where}: no GPU record of the checkpoint: {exc}") from exc
        refused = restore_refusal(meta["capability"], self.capability)
        if refused is not None:
            self.record(Ev.RESTORE_FAILED, index=ckpt.index, cause="gpu_mismatch", error=refused)
            raise CriuError(f"restore refused before CRIU ran: {refused}", cause="gpu_mismatch")

    def _back_onto_gpu(self, root: int, index: int, criu_s: float) -> None:
        """Restore and unlock each CUDA process of the restored tree; its phases recorded."""
        phases = {"criu_restore": criu_s}
        for pid in self.cuda_pids(root):
            assert self.driver is not None
            try:
                _add(phases, self.driver.toggle_in(pid).seconds)
            except CudaDriverError as exc:
                outcome = self._bring_back(pid, f"a failed toggle back in: {exc}")
                message = f"pid {pid} restored but not onto the GPU: {exc} ({outcome})"
                raise CriuError(message, cause=exc.name) from exc
        self.record(Ev.GPU_PHASES, step="restore", index=index, phases=phases, **self._said())


def gpu_checkpointer(criu: CriuCheckpointer) -> GpuCriuCheckpointer:
    """``criu`` with the GPU's part, as this node allows (the capability check, here): the
    ``cuda-checkpoint`` binary through CRIU's CUDA plugin (built beside CRIU by
    scripts/install-criu, loaded with ``--libdir``), else the driver API."""
    capability = read_capability()
    if capability.toggle is not None and capability.toggle.startswith("binary:"):
        plugins = Path(criu.binary).resolve().parent.parent / "lib" / "criu"
        if (plugins / "cuda_plugin.so").exists():
            criu.add_options(["--libdir", str(plugins)], ["--libdir", str(plugins)])
            return GpuCriuCheckpointer(criu, capability, None)
    try:
        driver: CudaDriver | None = CudaDriver()
    except ToggleUnavailable:
        driver = None  # dump() refuses with the capability check's problems
    return GpuCriuCheckpointer(criu, capability, driver)


def _add(phases: dict[str, float], more: dict[str, float]) -> None:
    for name, seconds in more.items():
        phases[name] = phases.get(name, 0.0) + seconds
