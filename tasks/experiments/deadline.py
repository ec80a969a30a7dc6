"""Deadline against size: the largest process this node checkpoints inside a notice's grace.

For each size of resident ballast (examples/serve_digits.py ``--state-mb``), ``repeats``
times, the example server is started on the plan's first slot, waited for until ready, and
dumped as on a notice (CRIU ends it once dumped). Those dumps are `checkpoint` rows of the
recovery run (trial ``deadline-<MiB>mb``). Dump seconds against the checkpoint's bytes fit
a line, a fixed cost plus bytes over a throughput; the largest process a grace period holds
is read from it: measured while within the largest size dumped, extrapolated beyond it,
labelled so, with its inputs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from tasks.data.arms import MANAGED
from tasks.data.datasets import TRIALS
from tasks.data.events import Ev
from tasks.data.plan import Plan, ReadyProbe, grace_of
from tasks.data.store import read_dataset
from tasks.engine.checkpointers.criu import CriuCheckpointer, CriuError
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.base import Cluster
from tasks.engine.clusters.process import slots_of
from tasks.engine.paths import checkpoint_folder
from tasks.engine.ports import free_port
from tasks.engine.ready import wait_ready
from tasks.experiments.trials import workload_hash

SIZES_MB = (0, 64, 256)
REPEATS = 3
TRIAL_PREFIX = "deadline-"
GIB = 2**30


def trial_of(size_mb: int) -> str:
    return f"{TRIAL_PREFIX}{size_mb}mb"


def run_deadline_sweep(
    plan: Plan,
    run_dir: Path,
    cluster: Cluster,
    recorder: EventRecorder,
    *,
    sizes_mb: tuple[int, ...] = SIZES_MB,
    repeats: int = REPEATS,
    timeout_s: float = 120,
) -> list[str]:
    """Dump the example server at each size, ``repeats`` times; the failures, as lines (each
    dump is already an event of ``recorder``, failed ones included, and each failure is
    recorded as `deadline_sweep_failed`)."""
    # Local only (recovery.needs_deadline_sweep): the server dumped by this machine's CRIU.
    slots = slots_of(cluster)
    slot = plan.cluster.nodes[0]
    failures: list[str] = []
    for size in sizes_mb:
        trial = trial_of(size)
        for repeat in range(repeats):
            folder = run_dir / f"{trial}-{repeat}"
            port = free_port()
            argv = [
                sys.executable, "-m", "examples.serve_digits", "--port", str(port),
                "--state-mb", str(size), "--init-steps", "10", "--warmup-rounds", "1",
            ]  # fmt: skip
            proc = slots.start(slot, MANAGED, argv, tag=f"{trial}-{repeat}")
            images = checkpoint_folder(plan, folder)
            criu = CriuCheckpointer(images, 1, recorder, trial, timeout_s=timeout_s)
            try:
                url = f"http://127.0.0.1:{port}/ready"
                if not wait_ready(
                    ReadyProbe(url=url), recorder, trial, MANAGED,
                    timeout=timeout_s, alive=proc.alive,
                ).ready:  # fmt: skip
                    failures.append(f"{trial}: the server was not ready within {timeout_s:.0f} s")
                    continue
                criu.dump(proc, leave_running=False)
            except CriuError as exc:
                failures.append(f"{trial}: {str(exc).splitlines()[0]}")
            finally:
                criu.close()
                cluster.stop_all()
    for line in failures:
        recorder.record("deadline", MANAGED, Ev.DEADLINE_SWEEP_FAILED, reason=line[:500])
    return failures


@dataclass(frozen=True)
class Holds:
    """What a grace period holds: bytes, and whether that is measured or extrapolated."""

    grace_s: float
    bytes: float
    basis: Literal["measured", "extrapolated"]
    line: str


@dataclass(frozen=True)
class DeadlineFit:
    """dump_s ≈ fixed_s + bytes / bytes_per_s, from ``n`` dumps of up to ``largest_bytes``."""

    fixed_s: float
    bytes_per_s: float
    n: int
    largest_bytes: int

    def holds(self, grace_s: float) -> Holds:
        room = max(0.0, grace_s - self.fixed_s)
        size = room * self.bytes_per_s
        basis: Literal["measured", "extrapolated"] = (
            "measured" if size <= self.largest_bytes else "extrapolated"
        )
        inputs = (
            f"fixed cost {self.fixed_s:.3f} s, {self.bytes_per_s / 1e9:.2f} GB/s, from "
            f"{self.n} dumps of up to {self.largest_bytes / 2**20:.0f} MiB"
        )
        how = "measured" if basis == "measured" else "extrapolated beyond the largest measured"
        line = (
            f"a grace of {grace_s:g} s holds a process of up to {size / GIB:.2f} GiB on these "
            f"nodes ({how}: {inputs})"
        )
        return Holds(grace_s, size, basis, line)


def deadline_fit(trials: pd.DataFrame) -> DeadlineFit | None:
    """The line through the sweep's ok dumps (None: fewer than two sizes dumped)."""
    rows = trials[
        (trials["measure"] == "checkpoint")
        & (trials["status"] == "ok")
        & trials["trial_id"].astype(str).str.startswith(TRIAL_PREFIX)
    ].dropna(subset=["dump_s", "checkpoint_bytes"])
    if rows["trial_id"].astype(str).str.split("/").str[0].nunique() < 2:
        return None
    x = rows["checkpoint_bytes"].astype(float).to_numpy()
    y = rows["dump_s"].astype(float).to_numpy()
    slope, intercept = np.polyfit(x, y, 1)
    if slope <= 0:  # bytes cost nothing measurable here: no throughput to read
        return None
    return DeadlineFit(max(0.0, float(intercept)), 1.0 / float(slope), len(rows), int(x.max()))


def grace_lines(plan: Plan, trials: pd.DataFrame) -> list[str]:
    """One line per notice fault's grace period, or why there is none."""
    graces = sorted({g for f in plan.faults if (g := grace_of(f)) is not None})
    if not graces:
        return []
    fit = deadline_fit(trials)
    if fit is None:
        return ["No deadline sweep to read what a grace period holds (under two sizes dumped)."]
    return [fit.holds(g).line for g in graces]


def grace_warnings(plan: Plan) -> list[str]:
    """``faults.N.grace_s: …`` for each notice fault whose grace period is shorter than the
    median CRIU dump of the plan's workload committed so far (a notice checkpoint would
    miss its deadline); nothing measured yet, nothing said."""
    graces = [(i, g) for i, f in enumerate(plan.faults) if (g := grace_of(f)) is not None]
    if not graces:
        return []
    trials = read_dataset(
        TRIALS,
        data_dir=plan.data_dir,
        poc=plan.poc,
        columns=["measure", "status", "trial_id", "dump_s", "workload_hash"],
    )
    dumps = trials[
        (trials["measure"] == "checkpoint")
        & (trials["status"] == "ok")
        & (trials["workload_hash"] == workload_hash(plan))
        & ~trials["trial_id"].astype(str).str.startswith(TRIAL_PREFIX)
    ]["dump_s"].dropna()
    if dumps.empty:
        return []
    median = float(dumps.astype(float).median())
    return [
        f"faults.{i}.grace_s: {grace:g} s is shorter than the median CRIU dump of "
        f"{plan.workload.name} measured here ({median:.3f} s over {len(dumps)} dumps): a "
        "checkpoint on the notice would miss its deadline"
        for i, grace in graces
        if grace < median
    ]
