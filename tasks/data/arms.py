"""The two copies of a workload every comparison runs, declared once."""

from __future__ import annotations

from typing import Literal

Arm = Literal["unmanaged", "managed"]
UNMANAGED: Arm = "unmanaged"
MANAGED: Arm = "managed"
# In the order the comparisons run them: the unmanaged copy is faulted first, on the same
# clocks, so a managed arm never benefits from going second.
ARMS: tuple[Arm, ...] = (UNMANAGED, MANAGED)
