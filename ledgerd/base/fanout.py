"""Bounded fan-out: one call per item, at most so many at once.

The metadata reads that serve one request (a cursor per partition, a record per
transactional id, an index node per topic) go to ZooKeeper side by side, but never
more than a few dozen in flight: one after another they took seconds over a few
hundred topics, all at once they would queue thousands of requests on one session.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import trio

__all__ = ["each_at_most"]

T = TypeVar("T")


async def each_at_most(limit: int, fn: Callable[[T], Awaitable[object]],
                       items: Iterable[T]) -> None:
    """Await ``fn(item)`` for every item, at most ``limit`` at once; returns when all
    are done. A failure cancels the others and is raised, as from a nursery."""
    gate = trio.Semaphore(limit)

    async def one(item: T) -> None:
        async with gate:
            await fn(item)

    async with trio.open_nursery() as nursery:
        for item in items:
            nursery.start_soon(one, item)
