"""Issue 45's reproduction: entries whose journal record leaves fewer than 9 bytes before
the group's aligned end, acknowledged one at a time, kill -9, restart, read them all.

Before the padding rule (disk/journal_format.py, Groups) the writer left 1-8 zero bytes
there and replay stopped at the first such gap: 48 of 50 acknowledged entries answered
NO_SUCH_ENTRY (an 8-byte gap), or the bookie refused to start (a 1-byte gap)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from ledgerd.bookie_client import open_bookie_client
from ledgerd.disk.journal_format import PREFIX_SIZE
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.wire.entry import decode_entry, encode_entry
from ledgerd.wire.messages import AddRequest, ReadRequest
from ledgerd.wire.status import Status
from tests.appliance.harness import KEY, D
from tests.cluster import metadata_store, wait_registered

Factory = Callable[..., BookieProcess]
LEDGER = 7
ENTRIES = 50


def _entry(eid: int, gap: int) -> bytes:
    """Entry ``eid`` sized so that its ENTRY record (prefix, ledger and entry ids, the
    entry) ends ``gap`` bytes before a 4096-byte boundary."""
    empty = encode_entry(D, LEDGER, eid, eid - 1, 0, b"")
    size = 4096 - gap - PREFIX_SIZE - 16 - len(empty)
    payload = bytes([eid % 251]) * size
    data = encode_entry(D, LEDGER, eid, eid - 1, 0, payload)
    assert PREFIX_SIZE + 16 + len(data) == 4096 - gap
    return data


@pytest.mark.parametrize("storage_class", ["interleaved", "db"])
@pytest.mark.parametrize("gap", [1, 8])
async def test_entries_ending_a_few_bytes_short_of_a_block_survive_kill9(
        bookie_factory: Factory, zk_chroot: str, gap: int, storage_class: str) -> None:
    async with metadata_store(zk_chroot) as store:
        # No checkpoint in the test's time: every entry comes back through replay.
        bookie = bookie_factory(flush_interval_ms=600_000, ledger_storage_class=storage_class)
        bookie.start()
        await wait_registered(store, bookie)
        async with open_bookie_client(bookie.address) as c:
            for eid in range(ENTRIES):  # one at a time: a group each
                status, _ = await c.call(AddRequest(
                    ledger_id=LEDGER, first_entry_id=eid, master_key=KEY,
                    entries=(_entry(eid, gap),)))
                assert status == Status.OK, eid
        await trio.to_thread.run_sync(bookie.kill9)
        bookie.start()
        await wait_registered(store, bookie)
        async with open_bookie_client(bookie.address) as c:
            reqs = [ReadRequest(ledger_id=LEDGER, entry_id=e) for e in range(ENTRIES)]
            replies = await c.call_many(reqs)
        missing = [r.entry_id for r, (s, _) in zip(reqs, replies, strict=True) if s != Status.OK]
        assert not missing, f"{len(missing)} of {ENTRIES} acknowledged entries lost: {missing}"
        for eid, (_, resp) in enumerate(replies):
            got = decode_entry(D, resp.entry)  # type: ignore[union-attr]
            assert got.payload == decode_entry(D, _entry(eid, gap)).payload
        assert await trio.to_thread.run_sync(bookie.terminate) == 0
