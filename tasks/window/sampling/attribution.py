"""Whose is a process: a PoC job's (which arm, trial, workload) or nobody's we know.

From the same records the experiments write, in order of trust:
- ``env``: the copy's own environment. The local cluster starts every copy with
  ``CKPT_POC_NODE/ARM/JOB/TRIAL/WORKLOAD``
  (tasks.engine.clusters.local.cluster.LocalCluster.labels); CRIU
  restores the environment with the process, so a restored copy keeps its labels.
- ``cgroup``: a Slurm job's processes live under ``…/job_<id>/…``; the job id is looked up in
  the `trials` dataset (job_id / recovery_job_id), which names the arm and the trial.
A process that is none of these is attributed ``none`` and its samples are kept as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tasks.data import env_markers
from tasks.data.datasets import ARMS
from tasks.window.sampling import UNATTRIBUTED, Attribution

PROC = Path("/proc")
_SLURM_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")
LABEL_PREFIX = env_markers.PREFIX.encode()


def _environ(pid: int, proc: Path = PROC) -> dict[str, str]:
    """The process's CKPT_POC_* and SLURM_JOB_ID variables ({} if unreadable)."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if item.startswith(LABEL_PREFIX) or item.startswith(b"SLURM_JOB_ID="):
            key, _, value = item.partition(b"=")
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def slurm_job_of(pid: int, proc: Path = PROC) -> str | None:
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    match = _SLURM_CGROUP.search(text)
    return match.group(1) if match else None


@dataclass
class ProcessAttributor:
    """Attributes pids for one node; remembers each process (pid + start time) once."""

    node: str
    workload: str
    # Slurm job id -> (arm, trial_id), from the trials the experiments wrote.
    slurm_jobs: dict[str, tuple[str, str]] = field(default_factory=dict)
    proc: Path = PROC
    _seen: dict[tuple[int, str], Attribution] = field(default_factory=dict)

    def __call__(self, pid: int, start: str = "") -> Attribution:
        key = (pid, start)
        if key not in self._seen:
            self._seen[key] = self._attribute(pid)
        return self._seen[key]

    def forget_except(self, live: set[tuple[int, str]]) -> None:
        """Drop the processes that are gone (the cache would otherwise grow for months)."""
        for key in [k for k in self._seen if k not in live]:
            del self._seen[key]

    def _attribute(self, pid: int) -> Attribution:
        env = _environ(pid, self.proc)
        if env.get(env_markers.NODE) == self.node and env.get(env_markers.JOB):
            arm = env.get(env_markers.ARM)
            return Attribution(
                job_id=env[env_markers.JOB],
                # Only the two arms are arms; a preflight copy is a PoC job of neither.
                arm=arm if arm in ARMS else None,
                workload=env.get(env_markers.WORKLOAD) or self.workload,
                trial_id=env.get(env_markers.TRIAL) or None,
                attributed_by="env",
            )
        job = slurm_job_of(pid, self.proc) or env.get("SLURM_JOB_ID")
        if job and job in self.slurm_jobs:
            arm, trial = self.slurm_jobs[job]
            return Attribution(job, arm, self.workload, trial, "cgroup")
        return UNATTRIBUTED


def slurm_jobs_from_trials(trials: object) -> dict[str, tuple[str, str]]:
    """job id -> (arm, trial) for every job the experiments started (interrupted or not)."""
    import pandas as pd

    assert isinstance(trials, pd.DataFrame)
    out: dict[str, tuple[str, str]] = {}
    for column in ("job_id", "recovery_job_id"):
        if column not in trials:
            continue
        rows = trials[trials[column].notna()]
        for job, arm, trial in zip(rows[column], rows["arm"], rows["trial_id"], strict=True):
            out[str(job)] = (str(arm), str(trial))
    return out
