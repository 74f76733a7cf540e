"""DeadlineSleep: a deadline passes, an idle sleep wakes, an interrupt ends any sleep.

A mock clock that moves only when the test jumps it, so every assertion is exact.
"""

from __future__ import annotations

import trio
import trio.testing

from ledgerd.deadlines import DeadlineSleep


async def test_sleep_ends_at_its_deadline_and_wake_does_not_cut_it_short(
        mock_clock: trio.testing.MockClock) -> None:
    sleep = DeadlineSleep()
    results: list[bool] = []

    async def sleeper(deadline: float) -> None:
        results.append(await sleep.until(deadline))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sleeper, trio.current_time() + 5)
        await trio.testing.wait_all_tasks_blocked()
        sleep.wake()  # a deadline stands: wake() is for idle sleeps only
        await trio.testing.wait_all_tasks_blocked()
        assert results == []
        mock_clock.jump(4.9)
        await trio.testing.wait_all_tasks_blocked()
        assert results == []
        mock_clock.jump(0.1)
    assert results == [True]


async def test_wake_ends_an_idle_sleep_and_interrupt_ends_any(
        mock_clock: trio.testing.MockClock) -> None:
    sleep = DeadlineSleep()
    sleep.wake()
    sleep.interrupt()  # nobody sleeping: both are no-ops
    results: list[bool] = []

    async def sleeper(deadline: float | None) -> None:
        results.append(await sleep.until(deadline))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sleeper, None)
        await trio.testing.wait_all_tasks_blocked()
        sleep.wake()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sleeper, trio.current_time() + 60)
        await trio.testing.wait_all_tasks_blocked()
        sleep.interrupt()
    assert results == [False, False]  # neither waited for a deadline (the clock never moved)
