"""The page cache before a timed start, declared once: what a plan's cold start may ask for
and what a row may say (tasks/engine/page_cache.py does it; the trials schema checks it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    import pandas as pd

# Asked for by cold_start.page_cache: the cache dropped before each timed start, or left warm.
PageCacheCondition = Literal["dropped", "warm"]
PAGE_CACHE_CONDITIONS: tuple[str, ...] = get_args(PageCacheCondition)
# What a row says: `not_allowed` when a drop was asked for and could not be made.
PAGE_CACHE_STATES: tuple[str, ...] = (*PAGE_CACHE_CONDITIONS, "not_allowed")
# How a `dropped` cache was dropped: all of it, or the files the start reads.
PAGE_CACHE_DROPS: tuple[str, ...] = ("global", "files")
# The condition the plan's cold_start_speedup verdict is judged on.
JUDGED_CONDITION = "dropped"


def judged(rows: pd.DataFrame) -> pd.DataFrame:
    """The cold-start rows a verdict is judged on: those timed with the cache dropped (or
    asked to be, where the host did not allow it), never the warm condition's."""
    warm = rows["page_cache"].eq("warm").fillna(False).astype(bool)  # a null: not warm
    return rows[~warm]
