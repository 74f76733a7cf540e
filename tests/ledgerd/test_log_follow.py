"""Logs that applications consume: follow readers, dense offsets, cursors, unbounded
logs, and the writer races — against real bookies (in this process) and ZooKeeper."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import ledgerd
from ledgerd import LedgerdError
from ledgerd.errors import LeadershipLostError, LedgerFencedError
from ledgerd.ledgerlog import LogEntry
from ledgerd.metadata.logs import LogRecord
from tests.ledgerd.inproc import inprocess_cluster


async def _take(it: object, n: int) -> list[LogEntry]:
    out: list[LogEntry] = []
    with trio.fail_after(30):
        async for e in it:  # type: ignore[attr-defined]
            out.append(e)
            if len(out) == n:
                break
    return out


async def test_follow_across_rolls_with_stable_offsets_and_a_cursor(zk_chroot: str,
                                                                    tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot) as client:
        w = await client.logs.open_writer("ev", 3, 2, 2, roll_entries=40)
        positions = await w.append_many(b"e%d" % i for i in range(100))
        got = await _take(client.logs.follow("ev", poll_s=0.2), 100)
        assert [e.offset for e in got] == list(range(100))
        assert [e.payload for e in got] == [b"e%d" % i for i in range(100)]
        assert [e.position for e in got] == positions
        # Start anywhere: an offset, a position, the end (then only new entries).
        assert (await _take(client.logs.follow("ev", start=57), 1))[0].payload == b"e57"
        assert (await _take(client.logs.follow("ev", start=positions[41]), 1))[0].offset == 41

        async def later() -> None:
            await trio.lowlevel.checkpoint()  # after the reader has started
            await w.append(b"new")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(later)
            tail = await _take(client.logs.follow("ev", start="end", poll_s=0.2), 1)
        assert (tail[0].offset, tail[0].payload) == (100, b"new")
        # A cursor resumes after what was committed, across a new client.
        cur = await client.logs.open_cursor("ev", "billing")
        assert cur.offset is None
        await cur.commit(got[59])
        async with ledgerd.open_client(zk_chroot) as again:
            cur2 = await again.logs.open_cursor("ev", "billing")
            assert cur2.offset == 60
            resumed = await _take(again.logs.follow("ev", start=cur2), 2)
            assert [e.offset for e in resumed] == [60, 61]
            await cur2.commit(resumed[1])
        await cur.commit(got[61])  # never backwards: the other consumer went as far
        assert cur.offset == 62 and (await client.logs.open_cursor("ev", "billing")).offset == 62
        # Truncation by offset drops whole closed ledgers; offsets stay.
        dropped = await client.logs.truncate_before("ev", 85)
        assert dropped == {"ledgers": 2, "start": 80}
        assert (await _take(client.logs.follow("ev", start=85), 1))[0].payload == b"e85"
        with pytest.raises(LedgerdError, match="offset 10 was truncated"):
            await _take(client.logs.follow("ev", start=10), 1)
        # Rolling by age (checked after an append).
        before = len(await client.logs.ledgers("ev"))
        w.roll_interval, w.opened_at = 60.0, trio.current_time() - 61
        await w.append(b"old enough")
        assert len(await client.logs.ledgers("ev")) == before + 1
        await w.close()
        await client.logs.delete("ev")


async def test_unbounded_log_follows_across_terms(zk_chroot: str, tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot, throttle=0) as client, \
            ledgerd.open_client(zk_chroot, throttle=0) as other:
        w1 = await client.logs.open_writer("ub", 3, 3, 2, unbounded=True, password=b"p")
        await w1.append_many(b"a%d" % i for i in range(30))
        w2 = await other.logs.open_writer("ub", password=b"p")  # takes the ledger over
        assert w2.unbounded and w2.ledger_id == w1.ledger_id
        with pytest.raises(LeadershipLostError):
            await w1.append(b"lost")
        await w2.append_many(b"b%d" % i for i in range(20))
        got = await _take(client.logs.follow("ub", b"p", poll_s=0.2), 50)
        assert [e.payload for e in got] == [b"a%d" % i for i in range(30)] + \
            [b"b%d" % i for i in range(20)]
        assert [e.offset for e in got] == list(range(50))  # the no-op takes no offset
        assert got[30].position.entry_id == 31  # entry 30 is the term's no-op
        assert (await _take(client.logs.follow("ub", b"p", start=35), 1))[0].payload == b"b5"
        with pytest.raises(LedgerdError, match="backed by an unbounded ledger"):
            await client.logs.open_writer("ub", unbounded=False, password=b"p")
        await w2.close()
        assert not (await client.ledger_metadata(w2.ledger_id)).is_closed


async def test_writer_killed_between_roll_cas_and_close(zk_chroot: str,
                                                        tmp_path: Path) -> None:
    """The list ends with two open ledgers: the next writer fences (closes) both."""
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot) as client:
        async with ledgerd.open_client(zk_chroot) as dying:
            w = await dying.logs.open_writer("k", 3, 2, 2)
            await w.append_many(b"x%d" % i for i in range(10))
            new = await dying.create_ledger(3, 2, 2)
            await dying.logs.store.update("k", lambda r: LogRecord((*r.ledgers, new.ledger_id)))
            # ... and the process dies here: neither ledger is closed.
        first, second = await client.logs.ledgers("k")
        assert not (await client.ledger_metadata(first)).is_closed
        w2 = await client.logs.open_writer("k", 3, 2, 2)
        for lid in (first, second):
            assert (await client.ledger_metadata(lid)).is_closed
        await w2.append(b"y")
        got = await _take(client.logs.follow("k"), 11)
        assert [e.payload for e in got] == [b"x%d" % i for i in range(10)] + [b"y"]
        assert got[-1].offset == 10
        await w2.close()


async def test_two_writers_race_to_open_a_log(zk_chroot: str, tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot) as a, ledgerd.open_client(zk_chroot) as b:
        writers: dict[str, ledgerd.LogWriter] = {}

        async def open_as(name: str, client: ledgerd.Client) -> None:
            writers[name] = await client.logs.open_writer("race", 3, 2, 2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_as, "a", a)
            nursery.start_soon(open_as, "b", b)
        ledgers = await a.logs.ledgers("race")
        assert len(ledgers) == 2
        last = ledgers[-1]
        winner = next(w for w in writers.values() if w.ledger_id == last)
        loser = next(w for w in writers.values() if w.ledger_id != last)
        assert (await winner.append(b"mine")).ledger_id == last
        with pytest.raises(LedgerFencedError):
            await loser.append(b"too late")
        got = await _take(a.logs.follow("race"), 1)
        assert got[0].payload == b"mine" and got[0].offset == 0


async def test_a_ledger_ages_from_its_first_entry(zk_chroot: str, tmp_path: Path) -> None:
    """``roll_interval``: a ledger's age counts from its first entry (an empty ledger
    does not age, so a quiet log does not roll once per entry); checked after each
    append. The age is set back by hand, as in the test above, not waited for."""
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot, throttle=0) as client:
        w = await client.logs.open_writer("aged", 3, 3, 2, password=b"p",
                                          roll_interval=60.0)
        assert w.opened_at is None  # empty: no age
        first = await w.append(b"a")
        assert w.opened_at is not None
        assert len(await client.logs.ledgers("aged")) == 1
        w.opened_at -= 61  # its first entry is now 61 s old
        second = await w.append(b"b")  # goes in, then the ledger rolls
        assert second.ledger_id == first.ledger_id
        ledgers = await client.logs.ledgers("aged")
        assert len(ledgers) == 2 and ledgers[0] == first.ledger_id
        assert w.opened_at is None  # the new ledger is empty: no age yet
        third = await w.append(b"c")  # its first entry: the age starts here, no roll
        assert third.ledger_id == ledgers[1] and w.opened_at is not None
        assert len(await client.logs.ledgers("aged")) == 2
        await w.close()
