"""What the GPU check (tasks/poc/gpu_check/check.py) sets up once and every measurement uses:
where it writes, the clock's recorder, the local slots, the checkpointer, the driver, and
how a row is kept. Plain Python: no Prefect, no Great Expectations, no pydantic."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.data import settings_bare
from tasks.data.events import Ev
from tasks.data.gpu_capability import Capability
from tasks.engine.checkpointers.criu import CriuCheckpointer
from tasks.engine.checkpointers.criu_gpu import GpuCriuCheckpointer
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.machine import process_slots
from tasks.engine.clusters.process import MachineSlots
from tasks.engine.gpu.driver import CudaDriver

REPO = Path(__file__).resolve().parents[3]  # this checkout (tasks/poc/gpu_check/…)
SLOT = "gpu-0"


@dataclass
class Bench:
    """The check's shared state; ``rows`` every measurement, failures included."""

    out: Path
    capability: Capability
    driver: CudaDriver | None
    criu: str | None  # CRIU's binary when it runs here; None: the toggle alone
    device: str  # "cuda" or, in the contract run on a CPU machine, "cpu"
    python: str = sys.executable
    rows: list[dict[str, Any]] = field(default_factory=list)
    recorder: EventRecorder = field(init=False)
    cluster: MachineSlots = field(init=False)
    _n: int = 0

    def __post_init__(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.recorder = EventRecorder(None, jsonl=self.out / "events.jsonl")
        self.cluster = process_slots([SLOT], self.out / "run", REPO)
        self.plugins_off = self.out / "no-criu-plugins"  # the toggle is ours, not a plugin's
        self.plugins_off.mkdir(exist_ok=True)

    # a dict: a row of gpu-check.parquet
    def row(self, step: str, ok: bool, **values: Any) -> dict[str, Any]:
        """Keep one measurement (every run, never only the best) and return it."""
        for key in ("phases", "detail"):
            if key in values and not isinstance(values[key], str):
                values[key] = json.dumps(values[key])
        row = {"step": step, "ok": ok, "at": time.time(), **values}
        self.rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "detail"}), flush=True)
        return row

    def checkpointer(self, name: str) -> GpuCriuCheckpointer:
        """A fresh GPU checkpointer writing under ``out/images/name``."""
        if self.criu is None:
            raise RuntimeError("CRIU does not run here")
        self._n += 1
        root = self.out / "images" / f"{name}-{self._n}"
        criu = CriuCheckpointer(
            root,
            keep=1,
            recorder=self.recorder,
            trial_id=name,
            binary=self.criu,
            dump_options=["--libdir", str(self.plugins_off)],
            restore_options=["--libdir", str(self.plugins_off)],
        )
        return GpuCriuCheckpointer(criu, self.capability, self.driver)

    def phases(self, trial: str, step: str) -> dict[str, float]:
        """The newest ``gpu_phases`` of ``trial`` for ``step`` (dump | restore)."""
        found = [
            e.detail["phases"]
            for e in self.recorder.events(event=Ev.GPU_PHASES)
            if e.trial_id == trial and e.detail.get("step") == step
        ]
        return dict(found[-1]) if found else {}

    def close(self) -> None:
        self.cluster.stop_all()
        self.cluster.close()


def workload(module: str, *args: str) -> list[str]:
    return [sys.executable, "-u", "-m", f"examples.gpu.{module}", *args]


# a dict: a JSON answer
def get_json(url: str, timeout: float = 5) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return dict(json.loads(resp.read()))


def wait_ready(port: int, alive: Any, timeout: float) -> float | None:
    """Seconds until ``/ready`` answers 200 (asked every 10 ms); None if never or the
    process ended."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        try:
            if get_json(f"http://127.0.0.1:{port}/ready", 1).get("ready"):
                return time.perf_counter() - t0
        except OSError:
            if not alive():
                return None
        time.sleep(0.01)
    return None


def free_disk(path: Path) -> int:
    return shutil.disk_usage(path).free


def criu_runs(binary: str | None) -> tuple[str | None, str]:
    """CRIU's binary when ``criu check`` passes here, and what was found."""
    if binary is None:
        return None, f"no CRIU binary ({settings_bare.env_name('criu')}, the project's build, PATH)"
    try:
        done = subprocess.run([binary, "check"], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return None, f"{binary}: {exc}"
    if done.returncode != 0:
        return None, f"criu check failed: {(done.stderr or done.stdout).strip()[-300:]}"
    return binary, (done.stdout or done.stderr).strip()[-200:]
