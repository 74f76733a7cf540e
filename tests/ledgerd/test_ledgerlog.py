"""Logs of ledgers against real bookies (in this process) and the real ZooKeeper."""

from __future__ import annotations

from pathlib import Path

import pytest

import ledgerd
from ledgerd import LedgerdError, LedgerFencedError, LogFencedError, LogPosition, NoSuchLogError
from ledgerd.metadata.logheader import LogHeader, decode_log_header
from tests.ledgerd.inproc import inprocess_cluster


async def test_writer_rolls_and_the_log_reads_back_in_order(zk_chroot: str,
                                                            tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot) as client:
        with pytest.raises(NoSuchLogError, match="'events' does not exist"):
            await client.logs.ledgers("events")
        async with await client.logs.open_writer("events", 3, 2, 2, password=b"pw",
                                                 roll_entries=100) as writer:
            positions = await writer.append_many(f"e{i}".encode() for i in range(250))
        ledgers = await client.logs.ledgers("events")
        assert len(ledgers) == 3
        assert [p.ledger_id for p in positions] == [lid for lid in ledgers
                                                     for _ in range(100)][:250]
        # Entry 0 of each ledger is its log header: log entries start at entry 1.
        assert positions[100] == LogPosition(ledgers[1], 1)
        for i, (lid, last) in enumerate(zip(ledgers, (100, 100, 50), strict=True)):
            md = await client.ledger_metadata(lid)
            assert md.is_closed and md.last_entry_id == last
            rh = await client.open_ledger(lid, b"pw", recovery=False)
            header = decode_log_header((await rh.read_batch(0, 0))[0].payload)
            assert header == LogHeader(name="events", seq=i, first_offset=100 * i,
                                       prev_ledger_id=ledgers[i - 1] if i else -1,
                                       ensemble_size=3, write_quorum=2, ack_quorum=2,
                                       writers=1)  # one writer's term, across its rolls
        got = [e.payload async for e in client.logs.read("events", b"pw")]
        assert got == [f"e{i}".encode() for i in range(250)]
        seen = []
        async for e in client.logs.follow("events", b"pw", start=99):  # across a header
            seen.append((e.offset, e.position, e.payload))
            if len(seen) == 3:
                break
        assert seen == [(99, LogPosition(ledgers[0], 100), b"e99"),
                        (100, LogPosition(ledgers[1], 1), b"e100"),
                        (101, LogPosition(ledgers[1], 2), b"e101")]
        tail = [e.payload async for e in client.logs.read("events", b"pw",
                                                          start=LogPosition(ledgers[1], 99))]
        assert tail == [f"e{i}".encode() for i in range(198, 250)]


async def test_a_new_writer_fences_the_old_one(zk_chroot: str, tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot) as client:
        old = await client.logs.open_writer("orders", 3, 3, 2, password=b"pw")
        await old.append_many([b"a", b"b"])
        new = await client.logs.open_writer("orders", 3, 3, 2, password=b"pw")
        first, second = await client.logs.ledgers("orders")
        assert (first, second) == (old.ledger_id, new.ledger_id)
        assert (await client.ledger_metadata(first)).last_entry_id == 2  # header, a, b
        with pytest.raises(LedgerFencedError):
            await old.append(b"lost")
        with pytest.raises(LogFencedError, match="another writer took over"):
            await old.roll()
        await new.append(b"c")
        await new.close()
        assert [e.payload async for e in client.logs.read("orders", b"pw")] == [b"a", b"b", b"c"]
        # The new ledger's header continues the log from the fenced ledger's end.
        rh = await client.open_ledger(second, b"pw", recovery=False)
        assert decode_log_header((await rh.read_batch(0, 0))[0].payload) == LogHeader(
            name="orders", seq=1, prev_ledger_id=first, first_offset=2, ensemble_size=3,
            write_quorum=3, ack_quorum=2, writers=2)  # the second writer's term


async def test_append_closed_ledgers_fences_the_tail_then_truncate(zk_chroot: str,
                                                                   tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot) as client:
        writer = await client.logs.open_writer("batches", 3, 2, 2, password=b"pw")
        await writer.append(b"live")
        lh = await client.create_ledger(3, 2, 2, password=b"pw")
        await lh.append(b"batch")
        with pytest.raises(LedgerdError, match=f"ledger {lh.ledger_id} must be closed"):
            await client.logs.append_ledgers("batches", [lh.ledger_id], password=b"pw")
        await lh.close()
        with pytest.raises(NoSuchLogError):
            await client.logs.append_ledgers("nope", [lh.ledger_id], create=False)
        ledgers = await client.logs.append_ledgers("batches", [lh.ledger_id], password=b"pw")
        assert ledgers == (writer.ledger_id, lh.ledger_id)
        assert (await client.ledger_metadata(writer.ledger_id)).is_closed
        with pytest.raises(LedgerFencedError):
            await writer.append(b"behind the batch")
        assert [e.payload async for e in client.logs.read("batches", b"pw")] == [b"live",
                                                                                 b"batch"]
        assert await client.logs.truncate("batches", lh.ledger_id) == [writer.ledger_id]
        assert await client.logs.ledgers("batches") == (lh.ledger_id,)
        with pytest.raises(ledgerd.NoSuchLedgerError):
            await client.ledger_metadata(writer.ledger_id)
        assert await client.logs.names() == ["batches"]
        await client.logs.delete("batches")
        assert await client.logs.names() == []


async def test_replace_ledgers_swaps_in_place_with_one_cas_and_refuses_a_changed_list(
        zk_chroot: str, tmp_path: Path) -> None:
    """Compaction's swap (Logs.replace_ledgers): a replacement takes its old ledger's
    place (header place kept, custom metadata added), the old one is deleted; refused,
    nothing changed, once the old ledger is no longer listed."""
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot) as client:
        writer = await client.logs.open_writer("swap", 3, 2, 2, roll_entries=2)
        for i in range(5):
            await writer.append(b"e%d" % i)
        await writer.close()
        first, second, last = await client.logs.ledgers("swap")
        new = await client.logs.new_replacement("swap", first, -1, custom={"t": "1"})
        with pytest.raises(LedgerdError, match="must be closed"):
            await client.logs.replace_ledgers("swap", {first: new.ledger_id})
        await new.append_many([b"E0", b"E1"])
        await new.close()
        md = await client.ledger_metadata(new.ledger_id)
        assert dict(md.custom_metadata)["t"] == "1" and md.last_entry_id == 2  # header + 2
        assert await client.logs.replace_ledgers("swap", {first: new.ledger_id}) == (
            new.ledger_id, second, last)
        with pytest.raises(ledgerd.NoSuchLedgerError):
            await client.ledger_metadata(first)
        assert [e.payload async for e in client.logs.read("swap")] == [
            b"E0", b"E1", b"e2", b"e3", b"e4"]
        # the old ledger is gone from the list: a second swap of it is refused
        other = await client.logs.new_replacement("swap", second, new.ledger_id)
        await other.close()
        with pytest.raises(LogFencedError, match="no longer listed"):
            await client.logs.replace_ledgers("swap", {first: other.ledger_id})
        assert await client.logs.ledgers("swap") == (new.ledger_id, second, last)


async def test_roll_bytes_holds_whatever_the_group_and_entry_sizes(zk_chroot: str,
                                                                    tmp_path: Path) -> None:
    """Groups of entries from 1 B to 64 KiB (many near 4096 multiples) appended with
    one call each: a ledger never holds more than roll_bytes unless its one entry is
    larger than that (the entry that would overflow starts the next ledger, as Kafka
    rolls a segment before an append it cannot take), nothing is lost or reordered,
    and every ledger rolled after or before a group is closed at its end."""
    import random

    rng = random.Random(20261128)
    roll = 200_000

    def size() -> int:
        r = rng.random()
        if r < 0.5:
            return max(1, rng.randrange(1, 17) * 4096 + rng.randrange(-16, 17))
        return rng.randrange(1, 64 << 10) if r < 0.95 else roll + rng.randrange(1, 5000)

    groups = [[bytes([g % 251]) * size() for _ in range(rng.randrange(1, 12))]
              for g in range(40)]
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot) as client:
        async with await client.logs.open_writer("sized", 3, 2, 2, password=b"pw",
                                                 roll_bytes=roll) as writer:
            positions = [p for g in groups for p in await writer.append_many(g)]
        entries = [e for g in groups for e in g]
        ledgers = await client.logs.ledgers("sized")
        assert {p.ledger_id for p in positions} <= set(ledgers) and len(ledgers) > 5
        for lid in ledgers:
            md = await client.ledger_metadata(lid)
            assert md.is_closed
            held = [len(entries[i]) for i, p in enumerate(positions) if p.ledger_id == lid]
            assert md.length <= roll or len(held) == 1, (lid, md.length, held)
        got = [e.payload async for e in client.logs.read("sized", b"pw")]
        assert got == entries


async def test_a_delayed_drop_keeps_the_ledgers_on_the_record_until_reaped(
        zk_chroot: str, tmp_path: Path) -> None:
    """``truncate`` / ``replace_ledgers`` with ``delay_ms``: the ledgers leave the list in
    the same compare-and-set that puts them on the record's deferred deletions; they are
    readable until ``reap`` finds them due, and ``delete`` takes them with the log."""
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot) as client:
        writer = await client.logs.open_writer("late", 3, 2, 2, roll_entries=2)
        for i in range(7):
            await writer.append(b"e%d" % i)
        await writer.close()
        first, second, third, last = await client.logs.ledgers("late")
        assert await client.logs.truncate("late", second, delay_ms=60_000, mark=7) == [first]
        record, _ = await client.logs.store.get("late")
        assert record.ledgers == (second, third, last)
        assert record.mark == 7  # raised by the same compare-and-set
        [(lid, due)] = record.deferred
        assert lid == first
        assert (await client.ledger_metadata(first)).is_closed  # not deleted yet
        new = await client.logs.new_replacement("late", second, -1)
        await new.append_many([b"E2", b"E3"])
        await new.close()
        await client.logs.replace_ledgers("late", {second: new.ledger_id}, delay_ms=120_000)
        record, _ = await client.logs.store.get("late")
        assert record.ledgers == (new.ledger_id, third, last)
        assert [d[0] for d in record.deferred] == [first, second]
        assert record.mark == 7  # a replacement keeps it
        assert (await client.ledger_metadata(second)).is_closed
        assert await client.logs.reap("late", now_ms=due - 1) == []  # nothing due yet
        assert await client.logs.reap("late", now_ms=due) == [first]
        with pytest.raises(ledgerd.NoSuchLedgerError):
            await client.ledger_metadata(first)
        record, _ = await client.logs.store.get("late")
        assert [d[0] for d in record.deferred] == [second]
        assert [e.payload async for e in client.logs.read("late")] == [
            b"E2", b"E3", b"e4", b"e5", b"e6"]
        await client.logs.truncate("late", third, mark=3)
        record, _ = await client.logs.store.get("late")
        assert record.ledgers == (third, last) and record.mark == 7  # never lowered
        await client.logs.delete("late")  # the deferred one goes with the log
        with pytest.raises(ledgerd.NoSuchLedgerError):
            await client.ledger_metadata(second)


async def test_rolls_by_age_wait_while_the_list_is_full(zk_chroot: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         ) -> None:
    """A writer rolls by age only while the log lists fewer than AGE_ROLL_MAX_LEDGERS
    (it is one ZooKeeper record); rolls by size go on, and once retention shortens the
    list (read again after AGE_ROLL_RECHECK_S) rolls by age resume."""
    from ledgerd import ledgerlog
    monkeypatch.setattr(ledgerlog, "AGE_ROLL_MAX_LEDGERS", 3)
    monkeypatch.setattr(ledgerlog, "AGE_ROLL_RECHECK_S", 0.0)
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot) as client:
        writer = await client.logs.open_writer("aged", 3, 2, 2, roll_interval=0.001)
        for i in range(6):
            await writer.append(b"e%d" % i)
            writer.opened_at = -1e9  # the ledger is old at every append
        assert len(await client.logs.ledgers("aged")) == 3  # the limit: no roll past it
        writer.roll_entries = 2
        await writer.append_many([b"x", b"y"])  # full by count: rolls all the same
        ledgers = await client.logs.ledgers("aged")
        assert len(ledgers) == 4
        await client.logs.truncate("aged", ledgers[-1])
        writer.roll_entries = 0
        writer.opened_at = -1e9
        await writer.append(b"z")  # room again: rolls by age
        assert len(await client.logs.ledgers("aged")) == 2
        await writer.close()
        assert [e.payload async for e in client.logs.read("aged")][-1] == b"z"


async def test_the_deferred_deletions_a_record_keeps_are_bounded(
        zk_chroot: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drop that would keep more than MAX_DEFERRED deferred deletions deletes the
    earliest due at once, so a long delay cannot grow the record without bound."""
    from ledgerd import ledgerlog
    monkeypatch.setattr(ledgerlog, "MAX_DEFERRED", 2)
    async with inprocess_cluster(zk_chroot, tmp_path, 3), \
            ledgerd.open_client(zk_chroot) as client:
        writer = await client.logs.open_writer("bounded", 3, 2, 2, roll_entries=1)
        for i in range(5):
            await writer.append(b"e%d" % i)
        await writer.close()
        ledgers = await client.logs.ledgers("bounded")
        for i in range(1, 4):  # one ledger dropped at a time, each due later
            await client.logs.truncate("bounded", ledgers[i], delay_ms=60_000 + i)
        record, _ = await client.logs.store.get("bounded")
        assert [lid for lid, _ in record.deferred] == list(ledgers[1:3])
        with pytest.raises(ledgerd.NoSuchLedgerError):  # the earliest due went at once
            await client.ledger_metadata(ledgers[0])
        for lid in ledgers[1:3]:
            assert (await client.ledger_metadata(lid)).is_closed
