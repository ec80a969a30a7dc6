"""Running the writer recorder (tasks/exit/writers/recorder.py) around the way out, and
reading what it recorded.

It runs from right after the ``before_install`` snapshot to after the ``after_uninstall``
recheck, on every install node, its log under ``DATA_DIR/POC/writers/HOST/``:

- **locally** a process of the harness's, one per machine (a local plan's nodes are this
  one machine), in its own session so that a stage that ends does not end it;
- **on Slurm** a root service on each install node, started and stopped through the
  install's path (a job step pinned to the node runs tasks/exit/writers/daemon.py, which
  leaves the step: a transient systemd unit, or its own session out of the job's cgroup),
  so it never holds the node against the comparisons' ``--exclusive`` jobs; its log is
  written to the shared data folder.

A recorder found dead at the stop turns the span since its last flush into a gap.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tasks.data.errors import CkptPocError
from tasks.data.plan import AllowedChange, Plan
from tasks.exit.install import install_targets, manifest_path, on_node
from tasks.exit.writers import daemon
from tasks.exit.writers.recorder import LOG_NAME

# The recorder's own process and unit, its known footprint: listed as allowed, never
# residue (it runs from the before_install snapshot to the recheck; stop checks it is gone).
RECORDER_ALLOWED = (
    AllowedChange(
        kind="processes",
        key="*",
        argv="* -m tasks.exit.writers.recorder *",
        why="the writer recorder's own process, stopped after the recheck",
    ),
    AllowedChange(
        kind="units",
        key=f"active:{daemon.UNIT_PREFIX}*",
        why="the writer recorder's transient unit, stopped after the recheck",
    ),
)
log = logging.getLogger(__name__)
LOCAL_HOST = "local"  # a local plan's nodes' one machine
REPO = daemon.REPO


def recorder_folder(plan: Plan, host: str = LOCAL_HOST) -> Path:
    return Path(plan.data_dir).resolve() / plan.poc / "writers" / host


def recorder_hosts(plan: Plan) -> list[str]:
    """Where recorders run: this machine for a local plan, else each install node."""
    return [LOCAL_HOST] if plan.cluster.kind == "local" else install_targets(plan)


def host_of(plan: Plan, node: str) -> str | None:
    """The recorder whose log tells ``node``'s writes (None: none watches it)."""
    if plan.cluster.kind == "local":
        return LOCAL_HOST
    return node if node in install_targets(plan) else None


@dataclass(frozen=True)
class WriterLog:
    """What one recorder recorded: its rows, its gaps (the recorder's own end one included
    when it died), the file systems it marked, and whether it ran at all."""

    host: str
    rows: list[dict[str, Any]]
    gaps: list[dict[str, Any]]
    marked: list[str]
    started_at: str | None

    @classmethod
    def read(cls, folder: Path, host: str) -> WriterLog | None:
        try:
            log = json.loads((folder / LOG_NAME).read_text())
        except (OSError, ValueError):
            return None
        gaps = list(log.get("gaps", []))
        if not log.get("stopped"):
            gaps.append(
                {
                    "t_from": log.get("flushed_at"),
                    "t_to": None,
                    "reason": "the recorder was not running: its log ends at its last flush",
                }
            )
        return cls(host, log.get("rows", []), gaps, log.get("marked", []), log.get("started_at"))

    @property
    def fanotify_unavailable(self) -> str | None:
        return next((g["reason"] for g in self.gaps if "fanotify unavailable" in g["reason"]), None)


def read_writer_log(plan: Plan, host: str) -> WriterLog | None:
    return WriterLog.read(recorder_folder(plan, host), host)


def _manifests(plan: Plan) -> list[str]:
    """Where each install node's manifest will be (read by the recorder while it runs)."""
    try:
        return [str(manifest_path(plan, node)) for node in install_targets(plan)]
    except CkptPocError:
        return []  # no install of this kind here (Kubernetes, another checkpointer)


# a dict: the recorder's spec.json document
def _spec(
    plan: Plan, host: str, skip: list[str], poc_folders: list[str], globs: list[str]
) -> dict[str, Any]:
    return {
        "node": host,
        "out": str(recorder_folder(plan, host)),
        "paths": list(plan.exit.watch.paths),
        "skip": skip,
        "poc_folders": poc_folders,
        "poc_pids": [os.getpid()],
        "harness_host": socket.gethostname(),  # the pids hold only on this host
        "installed_globs": globs,
        "manifests": _manifests(plan),
        "unit": daemon.unit_name(plan.poc),
    }


# a dict: the daemon's JSON answer, from another host too
def _on_host(plan: Plan, host: str, action: str, arg: Path) -> dict[str, Any]:
    """Run the daemon's ``action`` for ``host``: here locally, on the node through the
    install's path on Slurm; its JSON answer."""
    if plan.cluster.kind == "local":
        return (daemon.start(arg) if action == "start" else daemon.stop(arg)).to_json()
    argv = [sys.executable, "-m", "tasks.exit.writers.daemon", action, str(arg)]
    done = on_node(plan, host, argv, {"PYTHONPATH": str(REPO)})
    try:
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError) as exc:
        raise CkptPocError(
            f"writer recorder {action} on {host}: exited {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-800:]}"
        ) from exc


def start_recorders(
    plan: Plan, skip: list[str], poc_folders: list[str], globs: list[str]
) -> dict[str, daemon.RecorderStarted]:
    """Start a recorder per host (:func:`recorder_hosts`): ``skip`` the folders it never
    records (the PoC's own, /proc, /sys), ``poc_folders`` where an executable is the PoC's,
    ``globs`` the install's known executables and units. Per host: its pid and how it runs."""
    started: dict[str, daemon.RecorderStarted] = {}
    for host in recorder_hosts(plan):
        folder = recorder_folder(plan, host)
        folder.mkdir(parents=True, exist_ok=True)
        spec_path = folder / "spec.json"
        spec_path.write_text(json.dumps(_spec(plan, host, skip, poc_folders, globs)))
        started[host] = daemon.RecorderStarted.from_json(_on_host(plan, host, "start", spec_path))
        written = read_writer_log(plan, host)
        if written is None:
            errors = folder / "recorder.log"
            tail = errors.read_text()[-500:].strip() if errors.exists() else ""
            shown = tail or started[host].to_json()
            log.warning("writer recorder on %s did not start: %s", host, shown)
        elif why := written.fanotify_unavailable:
            # Said once, here; the whole span is a gap and the exit attributes as before.
            log.warning("writer recorder on %s: %s; attributed without writers", host, why)
            started[host] = replace(started[host], unavailable=why)
    return started


def stop_recorders(plan: Plan) -> dict[str, WriterLog | None]:
    """Stop each host's recorder (it flushes and ends) and read its log; a recorder whose
    process or unit is still there after the stop is an error naming it."""
    logs, left = {}, []
    for host in recorder_hosts(plan):
        folder = recorder_folder(plan, host)
        if folder.exists():
            answer = daemon.RecorderStopped.from_json(_on_host(plan, host, "stop", folder))
            left += [f"{host}: {what}" for what in answer.left]
        logs[host] = read_writer_log(plan, host)
    if left:
        raise CkptPocError(f"the writer recorder is still there after its stop: {left}")
    return logs
