"""What an exit diff hands on (tasks/exit/exit_diff.py): the verdict, the items and each
node's counts; ``to_json`` is the form the flow returns and its helpers read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class NodeDiff:
    """One node's diff: its counts by class and the snapshots compared."""

    leftovers: int  # the PoC's and the unexplained items
    poc_items: int
    unexplained: int
    node_own: int
    from_run: str
    to_run: str
    recheck: bool
    from_taken_at: str
    to_taken_at: str
    items_compared: int

    @property
    def verdict(self) -> str:
        return "leftovers" if self.leftovers else "clean"

    def to_json(self) -> dict[str, Any]:
        return {
            "leftovers": self.leftovers,
            "poc_items": self.poc_items,
            "unexplained": self.unexplained,
            "node_own": self.node_own,
            "from_run": self.from_run,
            "to_run": self.to_run,
            "recheck": self.recheck,
            "from_taken_at": self.from_taken_at,
            "to_taken_at": self.to_taken_at,
            "items_compared": self.items_compared,
        }


@dataclass(frozen=True, slots=True)
class ExitDiff:
    """Every plan node's diff between two phases, attributed. The items are the
    ``exit_diff`` rows as written (node, kind, key, change, before, after, class, reason)."""

    verdict: str  # clean | leftovers
    leftovers: list[dict[str, Any]]
    node_own: list[dict[str, Any]]
    nodes: dict[str, NodeDiff]  # node → its diff
    control_node: str | None
    recheck_after_s: float
    from_phase: str
    to_phase: str

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "leftovers": self.leftovers,
            "node_own": self.node_own,
            "nodes": {node: info.to_json() for node, info in self.nodes.items()},
            "control_node": self.control_node,
            "recheck_after_s": self.recheck_after_s,
            "from_phase": self.from_phase,
            "to_phase": self.to_phase,
        }
