"""What a Slurm copy's job runs and what it records: the spec every ckpt-poc job is
submitted with (its wrapper, tasks/engine/clusters/slurm/job.py, reads it), and the wait for
one of the events the job appends beside its log."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tasks.data.plan import Plan
from tasks.engine.clock import Event, EventRecorder, span_s
from tasks.engine.paths import checkpoint_folder


# a dict: the job's spec, a JSON file (cluster.py writes it, job.py reads it)
def copy_spec(
    plan: Plan, trial: str, arm: str, copy_dir: Path, *, checkpoint: bool, **mode: Any
) -> dict[str, Any]:
    """The spec a copy's job runs (tasks/engine/clusters/slurm/job.py): where it logs and records,
    where its checkpoints go, and what it does (``mode``: run an argv, or restore; any key
    given there wins). Every Slurm copy, recovery's and the timed runs' too, is specified so."""
    return {
        "trial_id": trial,
        "arm": arm,
        "node": plan.cluster.nodes[0],
        "log": str(copy_dir / "workload.log"),
        "events": str(copy_dir / "job-events.jsonl"),
        "ckpt_root": str(checkpoint_folder(plan, copy_dir)),
        "interval_s": plan.checkpointer.interval_s,
        "keep": plan.checkpointer.keep,
        "checkpoint": checkpoint,
        "gpu": plan.checkpointer.gpu,  # the job's checkpointer toggles the copy's GPU state
        **mode,
    }


def wait_job_event(
    rec: EventRecorder,
    events: Path,
    trial: str,
    arm: str,
    names: tuple[str, ...],
    after: Event | None,
    timeout: float,
) -> Event | None:
    """The first of ``names`` (after ``after``, when given) that the job appends to its
    events file for (trial, arm); None after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        rec.import_jsonl(events)
        for event in rec.events(trial, arm):
            if event.event in names and (after is None or span_s(after, event) >= 0):
                return event
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)
