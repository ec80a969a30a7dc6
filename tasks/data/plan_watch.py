"""The plan's ``exit.watch`` and ``exit.allowed_changes``: what a node snapshot observes, and
what may differ after the way out without being a leftover (docs/design.md §1.8). Part of the plan
(tasks/data/plan.py re-exports every name), apart so the plan module stays readable."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    # As every plan model (tasks/data/plan.py): no unknown field, frozen, finite floats.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


SnapshotKind = Literal[
    "packages",  # Debian packages: name, version, status; conffiles changed from the package's
    "units",  # systemd units: enabled/active, drop-ins, dangling symlinks under *.wants
    "files",  # under the watched paths: sha256, mode, owner, file capabilities
    "modules",  # loaded kernel modules
    "sysctls",  # /proc/sys, volatile keys left out (and listed as left out)
    "sockets",  # listening sockets
    "processes",  # exe, argv, uid
    "mounts",
    "users",  # users and groups
    "cron",  # cron entries and systemd timers
    "ldconfig",  # the dynamic linker's paths
    "scheduler",  # Slurm: config plugins, /etc/slurm/**, node features/GRES/state; k8s: labels
]
SNAPSHOT_KINDS: tuple[str, ...] = get_args(SnapshotKind)
DEFAULT_WATCHED_PATHS = (
    "/etc",
    "/usr/local",
    "/opt",
    "/usr/lib/criu",
    "/var/lib",
    "/tmp",
    "/var/tmp",
    "/run",
    "/dev/shm",
    "/var/log",
)
# Busy folders: their entries' names are recorded, not their contents.
DEFAULT_NAMES_ONLY = ("/tmp", "/var/tmp", "/run", "/dev/shm", "/var/log")


class AllowedChange(_Strict):
    """What may differ after the way out without counting as a leftover (a log grew, the
    PoC's own data folder): a snapshot kind and a glob over its keys."""

    kind: SnapshotKind
    key: str = Field(min_length=1, description="fnmatch glob over the item's key")
    why: str = Field(min_length=1, description="why this change is expected")
    # A process's argv is stored only as a keyed hash: a glob over it is matched on the node,
    # while the snapshot reads it, and only the glob itself is stored with the item.
    argv: str | None = Field(
        default=None,
        min_length=1,
        description="processes only: fnmatch glob over the argv joined by spaces, matched "
        "on the node when the snapshot is taken (the argv itself is never stored)",
    )

    @model_validator(mode="after")
    def _argv_is_for_processes(self) -> AllowedChange:
        if self.argv is not None and self.kind != "processes":
            raise ValueError(f"argv: only a processes change has an argv (kind is {self.kind})")
        return self


class Watch(_Strict):
    """What a node snapshot observes (docs/design.md §1.8): defaults that suit a Debian node."""

    kinds: list[SnapshotKind] = Field(default_factory=lambda: list(SNAPSHOT_KINDS), min_length=1)
    paths: list[str] = Field(default_factory=lambda: list(DEFAULT_WATCHED_PATHS), min_length=1)
    names_only: list[str] = Field(default_factory=lambda: list(DEFAULT_NAMES_ONLY))

    @field_validator("paths", "names_only")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/") or "\0" in path:
                raise ValueError(f"{path!r} is not an absolute path")
        return value


def control_node_problems(control: str | None, nodes: list[str]) -> list[str]:
    """``exit.control_node`` against cluster.nodes: one of them, and not the first (where the
    PoC installs and runs its experiments), so it is never installed on."""
    if control is None:
        return []
    if control not in nodes:
        return [f"exit.control_node: {control!r} is not one of cluster.nodes {nodes}"]
    if control == nodes[0]:
        return [
            f"exit.control_node: {control!r} is cluster.nodes' first node, where the PoC "
            "installs and runs its experiments: name a node it never installs on"
        ]
    return []
