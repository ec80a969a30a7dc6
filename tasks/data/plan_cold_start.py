"""The plan's cold start: which workload it times, the page-cache conditions, the pairs."""

from __future__ import annotations

from pydantic import Field, field_validator

from tasks.data.page_cache import JUDGED_CONDITION, PageCacheCondition
from tasks.data.plan_workload import SafeName, Workload, _Strict

MAX_RUNS = 10_000  # repeats, cold-start pairs, same-node baseline runs (plan.py re-exports)


class ColdStart(_Strict):
    """The cold-start stage: the workload it times (the method times a server from launch
    to ready to serve), the page-cache conditions it times, each with its own rows (a
    warm native start flatters the native side, a warm image the restore), and the pairs
    per condition. The plan's cold_start_speedup is judged on `dropped`, so it is always
    one of them."""

    workload: SafeName | None = Field(
        default=None,
        description="which of the plan's workloads is timed (default: the first with a "
        "ready probe, else the first)",
    )
    page_cache: list[PageCacheCondition] = Field(
        default_factory=lambda: [JUDGED_CONDITION], min_length=1, max_length=2
    )
    repeats: int | None = Field(
        default=None, ge=3, le=MAX_RUNS, description="pairs per condition (default: repeats)"
    )

    @field_validator("page_cache")
    @classmethod
    def _judged_one_first(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("names a condition twice")
        if JUDGED_CONDITION not in value:
            raise ValueError(
                f"must include {JUDGED_CONDITION!r}: the cold_start_speedup verdict is judged on it"
            )
        return value


def cold_start_warnings(timed: Workload) -> list[str]:
    """Cold start on a workload without a ready probe is timed to its first progress line:
    allowed (a training job's start-up is a cold start too), said, as it is not the method's
    "launch to ready to serve"."""
    if timed.ready_probe is not None:
        return []
    return [
        f"cold_start.workload: {timed.name} has no ready_probe, so cold start is timed to its "
        "first progress line, not to ready to serve as the method defines it; give a serving "
        "workload a ready_probe (url, tcp, exec or log) to time that"
    ]
