"""``scheduler``: the view the node's scheduler holds of it. Slurm: the settings a
checkpointer hooks into, /etc/slurm/**, the plugstack and plugins, the node's features,
GRES and state; Kubernetes: the node's labels and taints, containerd's and kubelet's config.
A local plan has none (an ``excluded`` row)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from tasks.data.errors import CkptPocError
from tasks.exit.collectors.base import Collector, Observation, run_command
from tasks.exit.collectors.fs import hash_files, sha256_file

# scontrol show config: the settings through which a checkpointer hooks into Slurm.
_SLURM_CONFIG_KEYS = re.compile(
    r"(Plugin|Plugins|PlugStack|Prolog|Epilog|Type$|Parameters$|GresTypes|Features|"
    r"Include|TaskAffinity|LaunchParameters|JobContainer)",
)
# Node states that only say how busy the node is (our own snapshot job makes it MIXED).
_ALLOC_STATES = {"IDLE", "MIXED", "ALLOCATED", "COMPLETING", "ALLOC", "MIX"}


def _kv_config(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def _plugstack_files(col: Collector, conf: Path, seen: set[Path]) -> None:
    """The PlugStackConfig file and every file its `include` lines pull in."""
    if conf in seen or not conf.is_file():
        return
    seen.add(conf)
    try:
        lines = conf.read_text().splitlines()
    except OSError as exc:
        col.error(f"scheduler:file:{conf}", exc.strerror or exc)
        return
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] == "include":
            for inc in sorted(Path("/").glob(words[1].lstrip("/"))):
                _plugstack_files(col, inc, seen)


def _slurm_files(col: Collector, config: dict[str, str], env: Mapping[str, str]) -> set[Path]:
    """/etc/slurm/**, the running cluster's own config folder (SLURM_CONF's), the plugstack
    file and its includes, and the plugins in PluginDir (where Cedana copies its .so files,
    outside any watched path)."""
    files: set[Path] = set()
    folders = [Path("/etc/slurm")]
    if env.get("SLURM_CONF"):
        folders.append(Path(env["SLURM_CONF"]).parent)
    for folder in folders:
        files.update(p for p in folder.rglob("*") if p.is_file() or p.is_symlink())
    stack: set[Path] = set()
    if config.get("PlugStackConfig"):
        _plugstack_files(col, Path(config["PlugStackConfig"]), stack)
    files.update(stack)
    for plugin_dir in config.get("PluginDir", "").split(":"):
        if plugin_dir and Path(plugin_dir).is_dir():
            files.update(Path(plugin_dir).glob("*.so"))
    return files


def collect_slurm(col: Collector, node: str, env: Mapping[str, str] | None = None) -> None:
    env = env if env is not None else os.environ
    try:
        config = _kv_config(run_command(["scontrol", "show", "config"], env))
    except CkptPocError as exc:
        col.error("scheduler:slurm config", exc)
        config = {}
    for key, value in sorted(config.items()):
        if _SLURM_CONFIG_KEYS.search(key):
            col.add("scheduler", f"config:{key}", value)
    for path in sorted(_slurm_files(col, config, env)):
        try:
            value = (
                {"link": os.readlink(path)}
                if path.is_symlink()
                else {"sha256": sha256_file(path), "mode": oct(path.stat().st_mode & 0o7777)}
            )
        except OSError as exc:
            col.error(f"scheduler:file:{path}", exc.strerror or exc)
            continue
        col.add("scheduler", f"file:{path}", value)
    try:
        shown = run_command(["scontrol", "show", "node", node, "--oneliner"], env)
    except CkptPocError as exc:
        col.error(f"scheduler:node {node}", exc)
        return
    fields = dict(re.findall(r"(\w+)=(\S*)", shown))
    for key in ("AvailableFeatures", "ActiveFeatures", "Gres", "Partitions", "Reason"):
        col.add("scheduler", f"node:{key}", fields.get(key, ""))
    # Busy-ness (IDLE/MIXED…) follows the jobs, the snapshot's own included; the rest of the
    # state (DRAIN, DOWN, flags) is what an install or its removal could leave.
    states = fields.get("State", "").split("+")
    col.add("scheduler", "node:alloc", "+".join(s for s in states if s in _ALLOC_STATES))
    col.add("scheduler", "node:State", "+".join(s for s in states if s not in _ALLOC_STATES))


def collect_kubernetes(col: Collector, node: str) -> None:
    try:
        shown = json.loads(run_command(["kubectl", "get", "node", node, "-o", "json"]))
    except (CkptPocError, ValueError) as exc:
        col.error(f"scheduler:kubernetes node {node}", exc)
    else:
        meta, spec = shown.get("metadata", {}), shown.get("spec", {})
        for key, value in sorted(meta.get("labels", {}).items()):
            col.add("scheduler", f"label:{key}", value)
        for taint in spec.get("taints", []):
            col.add("scheduler", f"taint:{taint.get('key')}:{taint.get('effect')}", taint)
    files = [p for p in col.root.glob("etc/containerd/**/*") if p.is_file() or p.is_symlink()]
    hash_files(col, "scheduler", [*sorted(files), col.path("/var/lib/kubelet/config.yaml")])


# The view each scheduler holds, by the scheduler the observation names.
_VIEWS: dict[str, Callable[[Collector, Observation], None]] = {
    "slurm": lambda col, obs: collect_slurm(col, obs.node, obs.env),
    "kubernetes": lambda col, obs: collect_kubernetes(col, obs.node),
}


def collect_scheduler(col: Collector, obs: Observation) -> None:
    view = _VIEWS.get(obs.scheduler) if obs.scheduler else None
    if view is None:
        col.excluded("scheduler", "a local plan: no scheduler holds a view of the node")
        return
    view(col, obs)
