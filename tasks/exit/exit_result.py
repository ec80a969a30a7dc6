"""What an exit diff hands on (tasks/exit/exit_diff.py): the verdict, the items and each
node's counts; ``to_json`` is the form the flow returns and its helpers read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.data.jsonform import JsonForm


@dataclass(frozen=True, slots=True)
class NodeDiff(JsonForm):
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


@dataclass(frozen=True, slots=True)
class ExitDiff(JsonForm):
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
