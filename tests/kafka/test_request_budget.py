"""The gateway's request budget (``request_budget.py``): FIFO waiters, bytes given
back by a cancelled wait, never more given than taken."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from ledgerd.kafka.request_budget import RequestBudget


def test_waiters_are_served_in_order_and_a_cancelled_one_gives_its_place_back() -> None:
    async def main() -> None:
        b = RequestBudget(100)
        await b.take(60)
        got: list[str] = []

        async def take(name: str, n: int) -> None:
            await b.take(n)
            got.append(name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(take, "big", 50)  # does not fit beside the 60
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(take, "small", 10)  # would fit, but comes after "big"
            await trio.testing.wait_all_tasks_blocked()
            assert got == [] and b.waiting == 2 and b.waits == 2
            with trio.CancelScope() as cancelled:
                cancelled.cancel()
                with pytest.raises(trio.Cancelled):
                    await b.take(5)  # fits, but the queue is not empty: waits, cancelled
            assert b.waiting == 2
            b.give(60)
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(got) == ["big", "small"] and b.used == 60
        b.give(50)
        b.give(10)
        assert b.used == 0
        with pytest.raises(RuntimeError):
            b.give(1)

    trio.run(main)


def test_a_waiter_cancelled_at_the_head_lets_the_next_one_in() -> None:
    async def main() -> None:
        b = RequestBudget(100)
        await b.take(90)
        got: list[int] = []
        head = trio.CancelScope()

        async def take(n: int, scope: trio.CancelScope | None = None) -> None:
            with scope or trio.CancelScope():
                await b.take(n)
                got.append(n)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(take, 50, head)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(take, 10)  # fits beside the 90, but waits behind the 50
            await trio.testing.wait_all_tasks_blocked()
            assert got == [] and b.waiting == 2
            head.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert got == [10] and b.waiting == 0 and b.used == 100

    trio.run(main)
