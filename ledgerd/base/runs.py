"""Runs of consecutive entry ids: the shape a SPARSE add is stored (and, to a bookie
without ADD v1, sent) in."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["consecutive_runs"]


def consecutive_runs(ids: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, stop)`` index ranges of the runs of consecutive values in ascending
    ``ids``: ``[3, 4, 6, 7, 9]`` gives ``[(0, 2), (2, 4), (4, 5)]``."""
    out = []
    start = 0
    for i in range(1, len(ids)):
        if ids[i] != ids[i - 1] + 1:
            out.append((start, i))
            start = i
    if ids:
        out.append((start, len(ids)))
    return out
