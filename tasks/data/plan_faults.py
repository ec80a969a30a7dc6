"""The plan's fault kinds, per cluster kind, and what a fault item must say of itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

FAULTS_BY_CLUSTER: dict[str, tuple[str, ...]] = {
    "local": ("sigkill", "sigkill-group", "sigterm-grace"),
    "slurm": ("scancel", "node-down", "kill-step", "time-limit", "preempt", "drain"),
    "kubernetes": ("pod-delete", "node-drain"),
}
ALL_FAULTS = tuple(sorted({f for kinds in FAULTS_BY_CLUSTER.values() for f in kinds}))
# Faults that come with a notice: the grace between the notice and the kill (grace_s). A
# time limit's notice is its warning instead (warn_s: `sbatch --signal=B:USR1@warn_s`).
NOTICE_FAULTS = ("sigterm-grace", "preempt", "drain")
MAX_GRACE_S = 3600.0
# sbatch --signal's seconds are at most 65535; a warning longer than an hour is not a notice.
MAX_WARN_S = 3600


class FaultItem(Protocol):
    kind: str
    down_s: float | None
    grace_s: float | None
    warn_s: int | None
    preemptor_partition: str | None


def fault_problems(faults: Sequence[FaultItem], cluster_kind: str) -> list[str]:
    """``faults.N.field: why`` for each fault item that does not fit the cluster or itself."""
    problems: list[str] = []
    allowed = FAULTS_BY_CLUSTER[cluster_kind]
    for i, fault in enumerate(faults):
        if fault.kind not in allowed:
            problems.append(
                f"faults.{i}.kind: {fault.kind!r} does not apply to a {cluster_kind} "
                f"cluster; use one of {', '.join(allowed)}"
            )
        if fault.kind != "node-down" and fault.down_s != 0:
            problems.append(f"faults.{i}.down_s: only a node-down fault has a down time")
        if fault.kind in NOTICE_FAULTS and fault.grace_s is None:
            problems.append(
                f"faults.{i}.grace_s: a {fault.kind} fault needs its grace period "
                "(seconds from the notice to the kill)"
            )
        if fault.kind not in NOTICE_FAULTS and fault.grace_s is not None:
            problems.append(
                f"faults.{i}.grace_s: only a fault with a notice has a grace period "
                f"({', '.join(NOTICE_FAULTS)})"
            )
        if fault.kind != "time-limit" and fault.warn_s is not None:
            problems.append(f"faults.{i}.warn_s: only a time-limit fault has a warning")
        if fault.kind == "preempt" and not fault.preemptor_partition:
            problems.append(
                f"faults.{i}.preemptor_partition: a preempt fault names the higher-priority "
                "partition its preemptor job (the PoC's own sleep) is submitted to"
            )
        if fault.kind != "preempt" and fault.preemptor_partition is not None:
            problems.append(f"faults.{i}.preemptor_partition: only a preempt fault has a preemptor")
    return problems
