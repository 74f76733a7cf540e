"""The synchronous facade (its own trio thread) against real bookie processes."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import trio

import ledgerd
from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import metadata_store, wait_registered


def test_sync_client_round_trip(bookie_factory: Callable[..., BookieProcess],
                                zk_chroot: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bookies = [bookie_factory() for _ in range(3)]

    async def up() -> None:
        async with metadata_store(zk_chroot) as store:
            for b in bookies:
                b.start()
            for b in bookies:
                await wait_registered(store, b)
    trio.run(up)

    with ledgerd.SyncClient(zk_chroot) as client:
        with client.create_ledger(3, 2, 2, password=b"pw", compression="zstd") as lh:
            assert lh.append(b"x") == 0
            assert lh.append_many([b"y", b"z"]) == [1, 2]
        ledger_id = lh.ledger_id
        assert client.ledger_metadata(ledger_id).is_closed
        assert ledger_id in client.list_ledgers()

        results: list[list[bytes]] = []

        def reader() -> None:  # calls from any thread go to the client's trio thread
            rh = client.open_ledger(ledger_id, password=b"pw")
            results.append([e.payload for e in rh.read()])
        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [[b"x", b"y", b"z"]] * 3

        # submit pipelines: every future settles with its id, in order, durable; a
        # small hand-off queue makes the caller wait for room many times on the way.
        monkeypatch.setattr(ledgerd.SyncWriteHandle, "SUBMIT_QUEUE", 16)
        with client.create_ledger(3, 2, 2) as fast:
            futures = [fast.submit(b"p%d" % i) for i in range(2000)]
            assert [f.result(timeout=60) for f in futures] == list(range(2000))
            assert fast.last_add_confirmed == 1999
            with pytest.raises(ledgerd.MessageTooLargeError):  # that one fails, alone
                fast.submit(bytes(9 << 20)).result(timeout=60)
            assert fast.submit(b"p2000").result(timeout=60) == 2000
        with pytest.raises(ledgerd.LedgerdError):
            fast.submit(b"after close")
        assert [e.payload for e in client.open_ledger(fast.ledger_id).read(1999)] == \
            [b"p1999", b"p2000"]

        with pytest.raises(ledgerd.BadPasswordError):
            client.open_ledger(ledger_id, password=b"nope")
        client.delete_ledger(ledger_id)
        with pytest.raises(ledgerd.NoSuchLedgerError):
            client.open_ledger(ledger_id)

        # A log followed with a plain iterator, resumed from a cursor.
        with client.logs.open_writer("s", 3, 2, 2, roll_entries=3) as w:
            w.append_many([b"m%d" % i for i in range(7)])
        got = []
        for e in client.logs.follow("s", poll_s=0.2):
            got.append((e.offset, e.payload))
            if len(got) == 7:
                break
        assert got == [(i, b"m%d" % i) for i in range(7)]
        cursor = client.logs.open_cursor("s", "c")
        client.call(cursor.commit, next(iter(client.logs.follow("s", start=4))))
        assert next(iter(client.logs.follow("s", start=client.logs.open_cursor("s", "c")))
                    ).payload == b"m5"
    with pytest.raises(ledgerd.ClientClosedError, match="closed"):
        client.list_ledgers()
