"""The gateway's request budget (``request_budget.py``): FIFO waiters, bytes given
back by a cancelled wait, never more given than taken."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from ledgerd.kafka.request_budget import ByteBudget


def test_waiters_are_served_in_order_and_a_cancelled_one_gives_its_place_back() -> None:
    async def main() -> None:
        b = ByteBudget(100)
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
        b = ByteBudget(100)
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


def test_take_up_to_takes_what_is_free_and_waits_in_turn_only_for_its_floor() -> None:
    """The response budget's way: a fetch reads what is free (less than it asked, when
    others hold the rest), waits only while not even its floor is free, and in turn;
    what a response came to beyond its room is held past the limit, and all of it
    comes back."""
    async def main() -> None:
        b = ByteBudget(100)
        assert await b.take_up_to(70, 10) == 70
        assert await b.take_up_to(50, 10) == 30  # only 30 free: it reads less
        got: list[int] = []

        async def take(want: int, floor: int) -> None:
            got.append(await b.take_up_to(want, floor))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(take, 50, 20)  # nothing free: waits for 20
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(take, 5, 20)  # its floor is what it asks: 5, behind
            await trio.testing.wait_all_tasks_blocked()
            assert got == [] and b.waits == 2
            b.release(30)  # 30 free: both floors in turn, then the first the rest
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(got) == [5, 25] and b.used == 100 and b.waiting == 0
        b.hold(40)  # a first batch larger than the room: past the limit for a while
        assert b.used == 140
        for n in (70, 5, 25, 40):
            b.release(n)
        assert b.used == 0  # every byte back
        with pytest.raises(RuntimeError):
            b.release(1)
        assert await b.take_up_to(1000, 10) == 100  # at most the whole budget

    trio.run(main)


def test_a_response_budget_smaller_than_one_batch_is_refused() -> None:
    from ledgerd.base.settings import ConfigError
    from ledgerd.kafka.config import GatewayConfig

    with pytest.raises(ConfigError, match=r"max_held_response_bytes.*one whole batch"):
        GatewayConfig(max_held_response_bytes=1 << 20, max_batch_bytes=2 << 20)
    assert GatewayConfig(max_held_response_bytes=1 << 20).max_held_response_bytes == 1 << 20


def test_a_take_cancelled_when_it_would_fit_takes_nothing() -> None:
    """A cancel raised by the take itself comes before the bytes are taken: the
    caller, which never learned of them, has nothing to give back."""
    async def main() -> None:
        b = ByteBudget(100)
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await b.take(10)
            with pytest.raises(trio.Cancelled):
                await b.take_up_to(50, 10)
        assert b.used == 0
        assert await b.take_up_to(50, 10) == 50 and b.used == 50

    trio.run(main)


def test_take_up_to_waits_no_longer_than_it_was_told() -> None:
    """Past ``until`` with no room: 0 taken, its place in the queue given up, and the
    one behind it served when room comes."""
    async def main() -> None:
        b = ByteBudget(100)
        assert await b.take_up_to(100, 10) == 100
        got: list[int] = []

        async def take() -> None:
            got.append(await b.take_up_to(50, 10))

        with trio.fail_after(10):  # (a wait past ``until`` would go on for good)
            assert await b.take_up_to(50, 10, until=trio.current_time() + 1) == 0
        async with trio.open_nursery() as nursery:
            assert b.waiting == 0 and b.used == 100
            nursery.start_soon(take)
            await trio.testing.wait_all_tasks_blocked()
            b.release(30)
        assert got == [30] and b.used == 100

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
