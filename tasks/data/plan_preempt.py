"""A preempt fault's preemptor partition, and a notice fault's grace, checked against Slurm.

A `preempt` fault submits the PoC's own sleep job to the plan's ``preemptor_partition``; Slurm
then preempts whatever runs in a lower-tier partition on those nodes. Plan check asks the
cluster (``scontrol show partition``, ``squeue``) before anything runs and refuses a preemptor
that does not exist, does not hold the plan's nodes, would not outrank the plan's partition, or
would preempt jobs that are not the PoC's (it names them). A grace period longer than the one
Slurm gives (the plan partition's ``GraceTime``) is refused too: the managed arm would plan on
time it does not have. When Slurm does not answer, the check is skipped (plan_cluster.py).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol

from tasks.data.plan_cluster import MAX_NAMES_QUOTED, SINFO_TIMEOUT_S

# Every job the PoC submits is named so (tasks/engine/clusters/slurm/cluster.py); nothing
# else is its.
POC_JOB_PREFIX = "ckpt-poc-"


class NoticeFaultItem(Protocol):
    kind: str
    grace_s: float | None
    preemptor_partition: str | None


def _slurm(argv: list[str], env: Mapping[str, str] | None) -> str | None:
    """stdout, or None when the command failed (a missing partition: scontrol exits 1)."""
    try:
        done = subprocess.run(
            argv,
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            timeout=SINFO_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def partition_info(name: str, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """``scontrol -a -o show partition NAME`` as key=value pairs; None when there is none
    (``-a``: hidden partitions too)."""
    out = _slurm(["scontrol", "-a", "-o", "show", "partition", name], env)
    if not out or not out.strip():
        return None
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    return fields if fields.get("PartitionName") == name else None


def expand_nodes(hostlist: str, env: Mapping[str, str] | None = None) -> set[str]:
    """A Slurm hostlist (``gpu-[01-03]``) as names (``scontrol show hostnames``)."""
    if hostlist in ("", "(null)"):
        return set()
    out = _slurm(["scontrol", "show", "hostnames", hostlist], env)
    return set(out.split()) if out else {hostlist}


def running_jobs(nodes: Sequence[str], env: Mapping[str, str] | None = None) -> list[dict]:
    """Jobs running (or suspended) on ``nodes``: id, name, partition, user."""
    out = _slurm(
        [
            "squeue",
            "-h",
            "-a",
            "-t",
            "RUNNING,SUSPENDED",
            "-w",
            ",".join(nodes),
            "-o",
            "%i|%j|%P|%u",
        ],
        env,
    )
    jobs = []
    for line in (out or "").splitlines():
        parts = line.split("|")
        if len(parts) == 4:
            jobs.append(dict(zip(("id", "name", "partition", "user"), parts, strict=True)))
    return jobs


def preemptor_problems(
    fault: NoticeFaultItem,
    i: int,
    queue: str | None,
    nodes: Sequence[str],
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """``faults.N.field: why`` for a notice fault that this Slurm cannot deliver safely."""
    problems: list[str] = []
    ours = partition_info(queue, env) if queue else None
    grace_time = int(ours.get("GraceTime", "0")) if ours else None
    short = grace_time is not None and fault.grace_s is not None and fault.grace_s > grace_time
    if fault.kind == "preempt" and short:
        problems.append(
            f"faults.{i}.grace_s: {fault.grace_s:g} s is longer than partition "
            f"{queue!r} gives a preempted job (GraceTime={grace_time})"
        )
    if fault.kind != "preempt" or not fault.preemptor_partition:
        return problems
    name = fault.preemptor_partition
    theirs = partition_info(name, env)
    if theirs is None:
        return [*problems, f"faults.{i}.preemptor_partition: partition {name!r} does not exist"]
    held = expand_nodes(theirs.get("Nodes", ""), env)
    missing = [n for n in nodes if n not in held]
    if missing:
        problems.append(
            f"faults.{i}.preemptor_partition: partition {name!r} does not hold the plan's "
            f"node(s) {', '.join(missing)}"
        )
    tier = int(theirs.get("PriorityTier", "1"))
    if ours is not None and tier <= int(ours.get("PriorityTier", "1")):
        problems.append(
            f"faults.{i}.preemptor_partition: partition {name!r} (PriorityTier={tier}) does "
            f"not outrank {queue!r} (PriorityTier={ours.get('PriorityTier')}): it preempts nothing"
        )
    # Anything not the PoC's that runs in a lower tier on these nodes would be preempted too.
    others = [
        j
        for j in running_jobs(nodes, env)
        if not j["name"].startswith(POC_JOB_PREFIX) and j["partition"] != name
    ]
    if others:
        named = ", ".join(
            f"{j['id']} ({j['name']}, {j['user']}, {j['partition']})"
            for j in others[:MAX_NAMES_QUOTED]
        )
        problems.append(
            f"faults.{i}.preemptor_partition: a preemptor in {name!r} would preempt jobs "
            f"that are not the PoC's: {named}"
        )
    return problems
