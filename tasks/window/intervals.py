"""Interval sets: sorted, disjoint, non-empty ``[a, b)`` lists of POSIX seconds.

The arithmetic tasks/window/utilization.py splits a chain's allocation with: ``union`` makes a
set of any intervals; ``intersect`` and ``subtract`` take two sets and give a set.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

Interval = tuple[float, float]  # [start, end) in POSIX seconds


def union(ivs: Iterable[Interval]) -> list[Interval]:
    """The intervals as a set: sorted, overlapping or touching ones merged, empty ones gone."""
    out: list[Interval] = []
    for a, b in sorted(iv for iv in ivs if iv[1] > iv[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def intersect(x: list[Interval], y: list[Interval]) -> list[Interval]:
    """What two interval sets share."""
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(x: list[Interval], y: list[Interval]) -> list[Interval]:
    """What of ``x`` is not in ``y``."""
    out: list[Interval] = []
    j = 0
    for a, b in x:
        while j < len(y) and y[j][1] <= a:
            j += 1
        k, cur = j, a
        while k < len(y) and y[k][0] < b:
            if y[k][0] > cur:
                out.append((cur, y[k][0]))
            cur = max(cur, y[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def length_s(ivs: Iterable[Interval]) -> float:
    """How many seconds the intervals hold together (they are assumed disjoint)."""
    return math.fsum(b - a for a, b in ivs)
