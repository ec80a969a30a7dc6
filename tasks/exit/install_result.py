"""What install and uninstall (tasks/exit/install.py) hand on, per node; ``to_json`` is the
form the flows return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class NodeInstall:
    """What install put on one node; a node already installed was skipped (no lists)."""

    prefix: str
    manifest: str
    skipped: bool
    hooks: list[str] | None = None
    dirs: list[str] | None = None
    files: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        if self.skipped:
            return {"prefix": self.prefix, "manifest": self.manifest, "skipped": True}
        return {
            "prefix": self.prefix,
            "manifest": self.manifest,
            "hooks": self.hooks,
            "dirs": self.dirs,
            "files": self.files,
            "skipped": False,
        }


@dataclass(frozen=True, slots=True)
class InstallResult:
    """Per node (in the order installed), what install put there."""

    nodes: dict[str, NodeInstall]

    def to_json(self) -> dict[str, Any]:
        return {node: info.to_json() for node, info in self.nodes.items()}


@dataclass(frozen=True, slots=True)
class NodeUninstall:
    """The plan's exit.uninstall on one node: its exit status and its output's tail."""

    rc: int
    manifest: str
    output: str

    def to_json(self) -> dict[str, Any]:
        return {"rc": self.rc, "manifest": self.manifest, "output": self.output}


@dataclass(frozen=True, slots=True)
class UninstallResult:
    """Per node (last installed first), how its uninstall went."""

    nodes: dict[str, NodeUninstall]

    def to_json(self) -> dict[str, Any]:
        return {node: info.to_json() for node, info in self.nodes.items()}
