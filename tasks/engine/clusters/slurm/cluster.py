"""The Slurm cluster: this PoC's workload copies as batch jobs on the plan's nodes only.

Every job is submitted with `sbatch` as an argv list — a fixed batch script
(`scripts/slurm-job`) that runs `python -m tasks.engine.clusters.slurm.job SPEC.json`, where
the spec
(written by us, read by the job) carries the plan's argv; no plan value is ever pasted into
a shell string. Jobs are pinned to a plan node (`--nodelist`) in the plan's partition, never
requeued by Slurm (recovery submits a new, linked job instead) — but for a fault with a
notice, whose job is requeued under its id — and append their output to one log per
workload copy so that the progress probe follows every attempt.

Anything that kills or reconfigures checks first: a job must be one this run submitted and
be on a plan node; a node must be one the plan names. Nodes this run took down are returned
to service by `stop_all`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from tasks.baseline.accounting import parse_tres
from tasks.data.errors import BlastRadiusError, CkptPocError
from tasks.data.runctx import REPO_ROOT
from tasks.engine.clusters.copies import CopyNeverStarted

if TYPE_CHECKING:
    from tasks.data.plan import Plan

BATCH_SCRIPT = REPO_ROOT / "scripts" / "slurm-job"
# What a job may run besides the copy's wrapper (tasks.engine.clusters.slurm.job): a module of ours.
JOB_MODULE = re.compile(r"tasks(\.[a-z_][a-z0-9_]*)+")
ACTIVE_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"}
)


class SlurmError(CkptPocError):
    """A Slurm command failed or a job did not reach a state in time."""


class JobNeverStarted(SlurmError, CopyNeverStarted):
    """A job that did not start within its timeout: the stage ends with Slurm's reason,
    committing nothing (the run could not finish; it is no verdict on rows)."""


@dataclass
class SlurmJob:
    """One submitted attempt of a workload copy."""

    job_id: str
    node: str
    arm: str
    log: Path  # the copy's log (every attempt appends to it)
    spec: Path


@dataclass
class Observation:
    """A job state as seen by a poll, with when it was seen and when the poll before was."""

    state: str | None  # None: the job is no longer listed by squeue
    t_mono_ns: int
    previous_poll_ns: int
    reason: str = ""


@dataclass
class SlurmCluster:
    kind: ClassVar[str] = "slurm"
    nodes: list[str]
    partition: str
    run_dir: Path
    workdir: Path  # the jobs' working directory (relative paths in the workload resolve here)
    env: dict[str, str] | None = None  # SLURM_CONF and friends; default: this process's
    poll_s: float = 0.05
    tracked: dict[str, SlurmJob] = field(default_factory=dict)
    downed: set[str] = field(default_factory=set)

    @classmethod
    def for_plan(cls, plan: Plan, run_dir: Path, workdir: Path) -> SlurmCluster:
        return cls(list(plan.cluster.nodes), plan.cluster.queue, run_dir, workdir)

    # --- commands -------------------------------------------------------------------------

    def _run(self, argv: list[str], timeout: float = 30) -> str:
        try:
            done = subprocess.run(
                argv,
                env=self.env or dict(os.environ),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"{argv[0]} failed: {exc}") from exc
        if done.returncode != 0:
            detail = (done.stderr.strip() or done.stdout.strip())[-500:]
            raise SlurmError(f"{' '.join(argv[:3])} … exited {done.returncode}: {detail}")
        return done.stdout

    def _check_node(self, node: str) -> None:
        if node not in self.nodes:
            raise BlastRadiusError(f"node {node!r} is not one of the plan's nodes {self.nodes}")

    def check_job(self, job: SlurmJob) -> None:
        """Only a job this run submitted, and only while Slurm places it on a plan node."""
        if self.tracked.get(job.job_id) is not job:
            raise BlastRadiusError(f"job {job.job_id} is not a job this run submitted")
        listed = self._run(["squeue", "-h", "-j", job.job_id, "-o", "%N"]).strip()
        for node in filter(None, listed.split(",")):
            self._check_node(node)

    # --- jobs -----------------------------------------------------------------------------

    def submit(
        self,
        node: str,
        arm: str,
        spec: dict,
        *,
        name: str,
        log: Path,
        gpus: int = 0,
        linked_to: str | None = None,
        time_limit_min: int | None = None,
        notice_signal: str | None = None,
        exclusive: bool = False,
        module: str | None = None,
    ) -> SlurmJob:
        """Submit one attempt; ``linked_to`` names the interrupted job it recovers. With
        ``notice_signal`` (a fault with a notice: ``B:USR1@60``) the job may be requeued —
        the same job id comes back in a new allocation — and Slurm sends it that signal as the
        notice (``--signal``: before its time limit, and at preemption)."""
        self._check_node(node)
        if module is not None and not JOB_MODULE.fullmatch(module):
            raise BlastRadiusError(f"a job runs a ckpt-poc module (tasks.…), not {module!r}")
        jobs_dir = self.run_dir / "jobs"
        jobs_dir.mkdir(parents=True, exist_ok=True)
        n = len(list(jobs_dir.glob("*.json"))) + 1
        spec_path = jobs_dir / f"{n:04d}-{name}-{arm}.json"
        tmp = spec_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(spec, default=str, indent=1))
        os.replace(tmp, spec_path)
        argv = [
            "sbatch",
            "--parsable",
            f"--job-name=ckpt-poc-{name}-{arm}",
            f"--partition={self.partition}",
            f"--nodelist={node}",
            "--nodes=1",
            "--ntasks=1",
            # A timed run has the node to itself: nothing else's load falls on one arm.
            *(["--exclusive"] if exclusive else []),
            "--requeue" if notice_signal else "--no-requeue",
            *([f"--signal={notice_signal}"] if notice_signal else []),
            f"--chdir={self.workdir}",
            f"--output={log}",
            f"--error={jobs_dir / f'{n:04d}-{name}-{arm}-%j.err'}",
            "--open-mode=append",
            # Kept in the accounting record: which job this attempt recovers.
            f"--comment=ckpt-poc {arm}" + (f" recovers {linked_to}" if linked_to else ""),
        ]
        if gpus:
            argv.append(f"--gres=gpu:{gpus}")
        if time_limit_min:
            argv.append(f"--time={time_limit_min}")
        argv += [str(BATCH_SCRIPT), sys.executable, str(spec_path), *([module] if module else [])]
        job_id = self._run(argv).strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch printed {job_id!r}, not a job id")
        job = SlurmJob(job_id, node, arm, log, spec_path)
        self.tracked[job_id] = job
        return job

    def submit_preemptor(self, node: str, partition: str, name: str) -> SlurmJob:
        """The PoC's own higher-priority job, a sleep that needs the whole node (`--exclusive`):
        Slurm preempts what runs there in a lower tier. Tracked, so `stop_all` ends it."""
        self._check_node(node)
        argv = [
            "sbatch",
            "--parsable",
            f"--job-name=ckpt-poc-preemptor-{name}",
            f"--partition={partition}",
            f"--nodelist={node}",
            "--nodes=1",
            "--exclusive",
            "--no-requeue",
            "--output=/dev/null",
            "--comment=ckpt-poc preemptor",
            "--wrap=exec sleep 3600",
        ]
        job_id = self._run(argv).strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch printed {job_id!r}, not a job id")
        job = SlurmJob(job_id, node, "preemptor", Path("/dev/null"), Path("/dev/null"))
        self.tracked[job_id] = job
        return job

    def running_on(self, node: str) -> list[tuple[str, str, str]]:
        """(job id, name, partition) of every job running or suspended on ``node``."""
        self._check_node(node)
        out = self._run(
            ["squeue", "-h", "-a", "-t", "RUNNING,SUSPENDED", "-w", node, "-o", "%i|%j|%P"]
        )
        rows = [tuple(line.split("|", 2)) for line in out.splitlines() if line.count("|") == 2]
        return [(r[0], r[1], r[2]) for r in rows]

    def job_fields(self, job: SlurmJob) -> dict[str, str]:
        """``scontrol -o show job``'s key=value pairs (Restarts, EligibleTime, StartTime…)."""
        out = self._run(["scontrol", "-o", "show", "job", job.job_id])
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def attempt_states(self, job: SlurmJob) -> list[str]:
        """Every attempt's state in accounting, oldest first (``sacct -D``: a requeued job
        shows one row per attempt)."""
        out = self._run(["sacct", "-X", "-D", "-n", "-P", "-j", job.job_id, "-o", "State"])
        return [line.split()[0] for line in out.splitlines() if line.strip()]

    def observe(self, job: SlurmJob) -> tuple[str | None, str]:
        """(state, reason) from squeue; state None once the job is no longer listed."""
        try:
            out = self._run(["squeue", "-h", "-j", job.job_id, "-o", "%T|%r"]).strip()
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return None, ""
            raise
        if not out:
            return None, ""
        state, _, reason = out.partition("|")
        return state, reason

    def wait_until(
        self, job: SlurmJob, done: Callable[[str | None], bool], timeout: float
    ) -> Observation | None:
        """Poll every ``poll_s`` until ``done(state)``; None on timeout."""
        deadline = time.monotonic() + timeout
        previous = time.monotonic_ns()
        while True:
            state, reason = self.observe(job)
            seen = time.monotonic_ns()
            if done(state):
                return Observation(state, seen, previous, reason)
            if time.monotonic() >= deadline:
                return None
            previous = seen
            time.sleep(self.poll_s)

    def wait_started(self, job: SlurmJob, timeout: float) -> Observation:
        """The poll that saw ``job`` RUNNING; a job that never started (a partition down, a
        node drained by someone else, a reservation) is cancelled and raises SlurmError
        with Slurm's own Reason and the job id. A job already ended by the first poll that
        sees it (a short one) returns that poll: it ran."""
        running = self.wait_until(job, lambda s: s == "RUNNING" or s not in ACTIVE_STATES, timeout)
        if running is not None:
            return running
        state, reason = self.observe(job)
        if state in ACTIVE_STATES:
            with contextlib.suppress(SlurmError):
                self.cancel(job)
        raise JobNeverStarted(
            f"job {job.job_id} did not start on {job.node} within {timeout:.0f} s "
            f"(state {state or 'gone'}, reason {reason or 'none'})"
        )

    def final_state(self, job: SlurmJob, timeout: float = 30) -> str | None:
        """The job's state in accounting once it has ended (sacct lags by 1-5 s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self._run(["sacct", "-X", "-n", "-P", "-j", job.job_id, "-o", "State"])
            state = out.strip().splitlines()[-1].split()[0] if out.strip() else ""
            if state and state not in ACTIVE_STATES:
                return state
            time.sleep(0.5)
        return None

    def allocated_gpus(self, job: SlurmJob) -> int | None:
        out = self._run(["squeue", "-h", "-j", job.job_id, "-O", "tres-alloc:500"]).strip()
        return parse_tres(out).gpus if out else None

    def start_time_epoch(self, job: SlurmJob) -> float:
        out = self._run(["scontrol", "-o", "show", "job", job.job_id])
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return time.mktime(time.strptime(fields["StartTime"], "%Y-%m-%dT%H:%M:%S"))

    # --- what kills or reconfigures --------------------------------------------------------

    def cancel(self, job: SlurmJob, *, signal: str | None = None, batch: bool = False) -> None:
        self.check_job(job)
        argv = ["scancel"]
        if signal:
            argv.append(f"--signal={signal}")
        if batch:
            argv.append("--batch")
        self._run([*argv, job.job_id])

    def set_time_limit(self, job: SlurmJob, minutes: int | str) -> None:
        """Minutes, or ``UNLIMITED``."""
        self.check_job(job)
        self._run(["scontrol", "update", f"JobId={job.job_id}", f"TimeLimit={minutes}"])

    def requeue(self, job: SlurmJob) -> None:
        """Back to the queue under the same job id (``scontrol requeue``): Slurm ends the
        running attempt (SIGTERM, SIGKILL after KillWait) or takes a finished one."""
        self.check_job(job)
        self._run(["scontrol", "requeue", job.job_id])

    def node_drain(self, node: str, reason: str) -> None:
        """No new job starts on ``node``; running ones go on. `stop_all` resumes it."""
        self._check_node(node)
        self.downed.add(node)
        self._run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])

    def node_down(self, node: str, reason: str) -> None:
        self._check_node(node)
        self.downed.add(node)
        self._run(["scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={reason}"])

    def node_resume(self, node: str) -> None:
        self._check_node(node)
        self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        self.downed.discard(node)

    def stop_all(self) -> list[str]:
        """Cancel every tracked job still active and return downed nodes to service; return
        the ids of jobs still active afterwards (empty: nothing of this run is left)."""
        for node in sorted(self.downed):
            # A node that will not resume shows in its own state; the jobs go on regardless.
            with contextlib.suppress(SlurmError):
                self.node_resume(node)
        active = [j for j in self.tracked.values() if self.observe(j)[0] in ACTIVE_STATES]
        if active:
            self._run(["scancel", *[j.job_id for j in active]])
        left = []
        for job in active:
            gone = self.wait_until(job, lambda s: s not in ACTIVE_STATES, timeout=30)
            if gone is None:
                left.append(job.job_id)
        return left

    def close(self) -> None:
        """Nothing to release: Slurm holds the jobs, and ``stop_all`` ended them."""


def node_host(node: str) -> str | None:
    """The short host name Slurm runs ``node`` on (its NodeHostName; a NodeName is often
    not the host's own name); None when Slurm cannot say."""
    try:
        out = subprocess.run(
            ["scontrol", "-o", "show", "node", node],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    host = fields.get("NodeHostName")
    return host.split(".")[0] if host else None
