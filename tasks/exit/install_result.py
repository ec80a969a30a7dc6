"""What install, opt-in and uninstall (tasks/exit/install.py) write and hand on, per node;
``to_json`` is the form the flows return."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

from tasks.data.jsonform import JsonForm


@dataclass(frozen=True, slots=True)
class NodeInstall(JsonForm):
    """What install put on one node; a node already installed was skipped (no lists: their
    keys are absent from its JSON form)."""

    _OMIT_NONE = ("hooks", "dirs", "files")

    prefix: str
    manifest: str
    hooks: list[str] | None = None
    dirs: list[str] | None = None
    files: list[str] | None = None
    skipped: bool = field(kw_only=True)  # declared last: its key comes last in the JSON form


@dataclass(frozen=True, slots=True)
class InstallResult:
    """Per node (in the order installed), what install put there."""

    nodes: dict[str, NodeInstall]

    # a dict: the JSON form is the nodes' mapping itself, no key of its own
    def to_json(self) -> dict[str, Any]:
        return {node: info.to_json() for node, info in self.nodes.items()}


@dataclass(frozen=True, slots=True)
class NodeUninstall(JsonForm):
    """The plan's exit.uninstall on one node: its exit status and its output's tail."""

    rc: int
    manifest: str
    output: str


@dataclass(frozen=True, slots=True)
class UninstallResult:
    """Per node (last installed first), how its uninstall went."""

    nodes: dict[str, NodeUninstall]

    # a dict: the JSON form is the nodes' mapping itself, no key of its own
    def to_json(self) -> dict[str, Any]:
        return {node: info.to_json() for node, info in self.nodes.items()}


class ManifestFile(TypedDict):
    """A file install copied: where to, its sha256 and mode, and where from."""

    path: str
    sha256: str
    mode: str
    source: str


class InstallManifest(TypedDict):
    """A node's manifest.json: every folder install created and every file it copied (what
    uninstall removes, exactly), and who installed them when."""

    poc: str
    node: str
    checkpointer: str
    prefix: str
    hooks: list[str]
    dirs: list[str]
    files: list[ManifestFile]
    processes: list[str]
    reconfigure: bool
    installed_by: str
    run_id: str
    installed_at: str


class OptInHow(TypedDict, total=False):
    """How a plan's nodes mark a workload managed, each kind its way: locally the managed
    arm; on Slurm the sbatch flag, or the variable the hook reads, and the wrapper."""

    managed_arm: bool
    sbatch_args: list[str]
    or_sbatch_args: list[str]
    env: dict[str, str]
    wrapper: str


class OptInWhat(OptInHow):
    """What was opted in, where, by whom and how: the `opted_in` event's fields."""

    poc: str
    workload: str
    nodes: list[str]
    who: str


class OptInRecord(OptInWhat):
    """The opt-in record, written and handed on: the event's fields and when it was."""

    when: str
