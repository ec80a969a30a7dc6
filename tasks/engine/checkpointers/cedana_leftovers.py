"""What Cedana's own removal is known to leave on a node, in the exit snapshot's kinds.

``cedana slurm destroy`` and ``cedana k8s destroy`` (../shared/notes/cedana.md) remove less
than setup wrote: a dangling unit link, sysctls written to /proc, apt packages, Slurm plugin
configuration. ``expected_leftovers`` lists each as a glob over tasks/exit/snapshots.py's keys
and ``exit_checklist`` puts it per plan node, so the exit diff names every one; the PoC checks
them and never deletes what it did not create. The install steps are tasks/engine/
checkpointers/cedana.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tasks.data.plan import Plan
from tasks.engine.checkpointers.cedana import NODE_LABEL, CedanaError, plan_nodes


@dataclass(frozen=True)
class _Leftover:
    kind: str
    key_glob: str
    why: str
    clusters: tuple[str, ...] = field(default=("slurm", "kubernetes"))


_S, _K = ("slurm",), ("kubernetes",)
# What `cedana slurm setup` / `cedana k8s setup` apt-install (the notes list these and "…").
SETUP_PACKAGES = (
    "libnet-dev",
    "libprotobuf-c-dev",
    "libnl-3-dev",
    "libbsd-dev",
    "libcap-dev",
    "libseccomp-dev",
    "libgpgme11-dev",
    "iptables",
    "psmisc",
)
_LEFTOVERS: tuple[_Leftover, ...] = (
    # Both: `cedana slurm destroy` / `cedana k8s destroy` remove the unit file, not its link.
    _Leftover(
        "units",
        "*multi-user.target.wants/cedana.service*",
        "destroy deletes the unit without `systemctl disable`: a dangling symlink stays",
    ),
    _Leftover("files", "/etc/profile.d/cedana.sh", "setup writes it; destroy does not remove it"),
    _Leftover("sysctls", "fs.pipe-user-pages-soft", "setup writes 0 to /proc; never restored"),
    _Leftover("sysctls", "fs.pipe-max-size", "setup writes 4194304 to /proc; never restored"),
    _Leftover(
        "sysctls",
        "kernel.io_uring_disabled",
        "set to 2 (by default on Kubernetes, with the /dev/shm option on Slurm); never restored",
    ),
    _Leftover("files", "/run/criu.kdat", "CRIU's kernel-feature cache; destroy's globs miss it"),
    _Leftover(
        "files",
        "/usr/local/bin/criu",
        "a plugin binary (with file capabilities in Slurm's unprivileged mode); destroy removes "
        "only *cedana*",
    ),
    _Leftover("files", "/usr/local/bin/cuda-checkpoint", "a plugin binary; not *cedana*"),
    _Leftover("files", "/usr/local/bin/yq", "setup may download it; not *cedana*"),
    _Leftover("files", "/usr/lib/criu/*.so", "CRIU's CUDA plugin; outside destroy's globs"),
    _Leftover("files", "/etc/fstab*", "the optional /dev/shm remount edits fstab (+ fstab.bak)"),
    _Leftover("mounts", "/dev/shm", "the optional /dev/shm remount is not undone"),
    _Leftover("files", "/tmp/dump-*", "checkpoint images dump-<type>-<jid>-<ts> (temp folder)"),
    *(
        _Leftover("packages", name, "setup apt-installs it (if absent); destroy removes none")
        for name in SETUP_PACKAGES
    ),
    _Leftover(
        "processes",
        "*cedana*",
        "a daemon started with `cedana daemon start` outside systemd survives the unit's removal",
    ),
    _Leftover(
        "sockets",
        "*cedana*",
        "a surviving daemon still listening (cedana.sock in the runtime folder, or TCP 8080)",
    ),
    _Leftover(
        "ldconfig",
        "*libcedana*",
        "inferred: if setup ran ldconfig, the cache keeps the removed libcedana-*.so entries",
    ),
    # Slurm wiring: left unless the closed-source `cedana-slurm cleanup` undoes it.
    _Leftover("scheduler", "file:*/*cedana*.so", "the .so copies in Slurm's PluginDir", _S),
    _Leftover(
        "scheduler", "file:*plugstack*", "the `required …/spank_cedana.so` plugstack line", _S
    ),
    _Leftover("scheduler", "config:TaskPlugin", "task/cedana added to TaskPlugin", _S),
    _Leftover("scheduler", "config:CliFilterPlugins", "Cedana's cli_filter plugin", _S),
    _Leftover("scheduler", "config:JobSubmitPlugins", "Cedana's job_submit plugin", _S),
    _Leftover("files", "/etc/default/slurmd", "setup's environment for slurmd", _S),
    _Leftover("units", "*slurmd.service.d/*", "systemd drop-in for slurmd", _S),
    _Leftover("units", "*slurmctld.service.d/*", "systemd drop-in for slurmctld", _S),
    _Leftover(
        "files",
        "/usr/*bin/cedana-slurm",
        "the Slurm helper, with file capabilities (setcap) in unprivileged mode",
        _S,
    ),
    # Kubernetes: `cedana k8s destroy` and helm uninstall leave the node-side runtime wiring.
    _Leftover(
        "files",
        "/etc/containerd/conf.d/999-cedana.toml",
        "containerd runtime `cedana` pointing at a deleted shim",
        _K,
    ),
    _Leftover(
        "files",
        "/etc/containerd/config.toml",
        "config v2: the cedana runtime stanza appended; v3: the imports line",
        _K,
    ),
    _Leftover("files", "*/99-cedana.conf", "kubelet runtimeRequestTimeout: 10m drop-in", _K),
    _Leftover(
        "scheduler",
        f"label:{NODE_LABEL}",
        "the node label the PoC put on; Helm does not remove it (our uninstall step does)",
        _K,
    ),
    _Leftover(
        "scheduler",
        "taint:cedana.ai/not-ready:*",
        "the helper's taint; removed by the pre-delete hook only if that hook ran",
        _K,
    ),
)


def expected_leftovers(cluster_kind: str) -> list[dict[str, str]]:
    """What Cedana's own removal is known (or, where said, inferred) to leave on a node, as
    ``{kind, key_glob, why}`` in the snapshot's kinds: the exit diff must name each one.

    ``key_glob`` is an fnmatch glob over tasks/exit/snapshots.py's keys: absolute paths for files
    and units, dotted names for sysctls, package names, ``config:KEY``, ``file:PATH``,
    ``label:KEY`` and ``taint:KEY:EFFECT`` for the scheduler."""
    if cluster_kind not in ("slurm", "kubernetes"):
        raise CedanaError(f"Cedana has no {cluster_kind!r} install in this PoC")
    return [
        {"kind": item.kind, "key_glob": item.key_glob, "why": item.why}
        for item in _LEFTOVERS
        if cluster_kind in item.clusters
    ]


def exit_checklist(plan: Plan, nodes: Iterable[str] | None = None) -> list[dict[str, str]]:
    """Per plan node, the leftovers the after_uninstall snapshot must show gone: checked, never
    deleted by us (the PoC does not remove what it did not create)."""
    chosen = plan_nodes(plan, plan.cluster.kind, nodes)
    return [
        {"node": node, **item} for node in chosen for item in expected_leftovers(plan.cluster.kind)
    ]
