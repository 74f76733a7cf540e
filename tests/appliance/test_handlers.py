"""Bookie semantics over in-memory connections, one rule per test (autojump clock)."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from ledgerd.appliance.server import ConnectionOptions
from ledgerd.appliance.session import UNMERGED_ADD_FLAGS
from ledgerd.disk.errors import EntryNotFoundError, StorageError
from ledgerd.disk.storage import StateRun
from ledgerd.wire.connection import AddRun
from ledgerd.wire.entry import decode_entry
from ledgerd.wire.frames import encode_request
from ledgerd.wire.messages import (
    AddFlags,
    AddRequest,
    AddResponse,
    AdminKind,
    AdminStatusRequest,
    AdminTriggerRequest,
    ApiKey,
    ApiVersionsRequest,
    ForceLedgerRequest,
    GetBookieInfoRequest,
    ReadFlags,
    ReadLacRequest,
    ReadRangeRequest,
    ReadRequest,
    ReadStrideRequest,
    ReadStrideResponse,
    WriteLacRequest,
)
from ledgerd.wire.status import Status
from tests.appliance import harness
from tests.appliance.harness import (
    KEY,
    OTHER_KEY,
    D,
    entry,
    gate_collection,
    running_bookie,
    small_journal,
)
from tests.disk.page_cache import evict, kernel_would_block

pytestmark = pytest.mark.usefixtures("autojump_clock")


@pytest.fixture(autouse=True, params=["tasks", "hub", "tls"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every rule holds over every way of serving connections: a task pair per
    connection over memory streams, the connection hub over real sockets, and a
    TLS-only bookie (START_TLS, then the same task pair over TLS)."""
    monkeypatch.setattr(harness, "TRANSPORT", request.param)
    return str(request.param)


def add(ledger: int, first: int, n: int = 1, *, key: bytes = KEY, flags: int = 0,
        term: int = 0, lac: int | None = None) -> AddRequest:
    return AddRequest(ledger_id=ledger, first_entry_id=first, flags=flags, master_key=key,
                      term=term, entries=tuple(entry(ledger, first + i, lac) for i in range(n)))


async def test_add_then_read_entry_last_entry_and_lac(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        replies = await c.call_many([add(1, e) for e in range(5)] + [add(1, 5, 3)])
        assert [s for s, _ in replies] == [Status.OK] * 6
        status, resp = await c.call(ReadRequest(ledger_id=1, entry_id=3))
        assert status == Status.OK and resp is not None
        got = decode_entry(D, resp.entry, ledger_id=1, entry_id=3)  # type: ignore[attr-defined]
        assert got.payload == b"entry 1/3"
        # The bookie's LAC is the highest LAC field among stored entries (entry 7 carries 6).
        assert resp.max_lac == 6  # type: ignore[attr-defined]
        status, resp = await c.call(ReadRequest(ledger_id=1, entry_id=-1))
        assert status == Status.OK and resp.entry_id == 7  # type: ignore[union-attr]
        assert b.storage.journal.durable.offset > 0


async def test_unknown_ledger_and_missing_entry(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        assert (await c.call(ReadRequest(ledger_id=9, entry_id=0)))[0] == Status.NO_SUCH_LEDGER
        assert (await c.call(ReadLacRequest(ledger_id=9)))[0] == Status.NO_SUCH_LEDGER
        assert (await c.call(add(1, 0)))[0] == Status.OK
        assert (await c.call(ReadRequest(ledger_id=1, entry_id=1)))[0] == Status.NO_SUCH_ENTRY


async def test_master_key_is_bound_at_first_add(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        assert (await c.call(add(1, 0)))[0] == Status.OK
        assert (await c.call(add(1, 1, key=OTHER_KEY)))[0] == Status.UNAUTHORIZED
        fence_other = ReadRequest(ledger_id=1, entry_id=-1, flags=ReadFlags.FENCE,
                                  master_key=OTHER_KEY)
        assert (await c.call(fence_other))[0] == Status.UNAUTHORIZED
        assert not b.storage.is_fenced(1)


async def test_fencing_read_is_durable_before_reply_and_blocks_plain_adds(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        await c.call_many([add(1, e) for e in range(3)])
        before = b.storage.journal.durable
        status, resp = await c.call(ReadRequest(ledger_id=1, entry_id=-1, flags=ReadFlags.FENCE,
                                                master_key=KEY))
        assert status == Status.OK and resp.entry_id == 2  # type: ignore[union-attr]
        assert b.storage.is_fenced(1)
        assert b.storage.journal.durable > before  # the FENCE record was synced first
        assert (await c.call(add(1, 3)))[0] == Status.FENCED
        assert (await c.call(add(1, 3, flags=AddFlags.RECOVERY_ADD)))[0] == Status.OK
        # A fence without a key is refused.
        nokey = ReadRequest(ledger_id=2, entry_id=-1, flags=ReadFlags.FENCE)
        assert (await c.call(nokey))[0] == Status.UNAUTHORIZED
        # Fencing a ledger this bookie never saw binds the key and finds nothing.
        fresh = ReadRequest(ledger_id=3, entry_id=-1, flags=ReadFlags.FENCE, master_key=KEY)
        assert (await c.call(fresh))[0] == Status.NO_SUCH_ENTRY
        assert b.storage.is_fenced(3)


async def test_a_fence_is_journaled_once_and_later_fencing_reads_answer_at_once(
        tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        await c.call_many([add(1, e) for e in range(3)])
        fence = ReadRequest(ledger_id=1, entry_id=-1, flags=ReadFlags.FENCE, master_key=KEY)
        # Two fences at once: both return only once the one FENCE record is durable.
        replies = await c.call_many([fence, fence])
        assert [s for s, _ in replies] == [Status.OK, Status.OK]
        assert b.storage.is_durably_fenced(1)
        records = b.storage.journal.records_written
        # Recovery's per-entry fencing reads now journal nothing and skip the slow path.
        reads = [ReadRequest(ledger_id=1, entry_id=e, flags=ReadFlags.FENCE, master_key=KEY)
                 for e in range(4)]
        for req in reads:
            assert b.handler.read_now(req) is not None
        replies = await c.call_many(reads)
        assert [s for s, _ in replies] == [Status.OK] * 3 + [Status.NO_SUCH_ENTRY]
        assert b.storage.journal.records_written == records
        # Still checked: a stranger's key, and a higher term (journaled, slow path).
        stranger = ReadRequest(ledger_id=1, entry_id=0, flags=ReadFlags.FENCE,
                               master_key=OTHER_KEY)
        assert b.handler.read_now(stranger) is None
        assert (await c.call(stranger))[0] == Status.UNAUTHORIZED
        termed = ReadRequest(ledger_id=1, entry_id=0, flags=ReadFlags.FENCE, master_key=KEY,
                             term=5)
        assert b.handler.read_now(termed) is None
        assert (await c.call(termed))[0] == Status.OK
        assert b.storage.journal.records_written == records + 1  # the TERM record


async def test_long_poll_waits_for_lac_and_piggybacks_next_entry(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as reader, b.connect() as writer:
        await writer.call_many([add(1, e) for e in range(3)])  # LAC here: 1
        poll = ReadRequest(ledger_id=1, entry_id=2, flags=ReadFlags.PIGGYBACK, previous_lac=1,
                           timeout_ms=10_000)
        result: list[tuple[int, object]] = []

        async def poller() -> None:
            result.append(await reader.call(poll))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poller)
            await trio.testing.wait_all_tasks_blocked()
            assert not result  # still waiting: LAC 1 is not past previous_lac 1
            start = trio.current_time()
            await writer.call(add(1, 3))  # carries LAC 2
        status, resp = result[0]
        assert status == Status.OK
        assert resp.max_lac == 2  # type: ignore[attr-defined]
        assert decode_entry(D, resp.entry).entry_id == 2  # type: ignore[attr-defined]
        assert trio.current_time() - start < 1.0


async def test_long_poll_times_out_with_current_lac_and_no_entry(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        await c.call_many([add(1, e) for e in range(3)])
        start = trio.current_time()
        status, resp = await c.call(ReadRequest(ledger_id=1, entry_id=2, previous_lac=5,
                                                flags=ReadFlags.PIGGYBACK, timeout_ms=3000))
        # The poll's own 3 s, and no more than a jump or two of the autojump clock: it
        # jumps to other services' deadlines whenever every task waits on real I/O or a
        # worker thread (the journal's zeroer), which under CI load can happen while the
        # request is in flight (seen: 3.016 and 3.019 s).
        assert 3.0 <= trio.current_time() - start < 3.5
        assert status == Status.OK and resp.max_lac == 1 and resp.entry == b""  # type: ignore[union-attr]


async def test_read_range_honours_count_and_bytes(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        await c.call(add(1, 0, 20))
        size = len(entry(1, 0))
        status, resp = await c.call(ReadRangeRequest(ledger_id=1, first_entry_id=5, max_count=4,
                                                     max_bytes=1 << 20))
        assert status == Status.OK
        assert [decode_entry(D, e).entry_id for e in resp.entries] == [5, 6, 7, 8]  # type: ignore[union-attr]
        status, resp = await c.call(ReadRangeRequest(ledger_id=1, first_entry_id=0, max_count=20,
                                                     max_bytes=3 * (size + 4) + 1))
        assert len(resp.entries) == 3  # type: ignore[union-attr]
        status, resp = await c.call(ReadRangeRequest(ledger_id=1, first_entry_id=18, max_count=9,
                                                     max_bytes=1 << 20))
        assert len(resp.entries) == 2  # type: ignore[union-attr]
        status, _ = await c.call(ReadRangeRequest(ledger_id=1, first_entry_id=30, max_count=9,
                                                  max_bytes=1 << 20))
        assert status == Status.NO_SUCH_ENTRY
        # A count above max_bytes / 4 ("as many as fit") still fills the byte budget: it
        # used to be charged 4 bytes per *requested* entry up front, leaving one entry.
        status, resp = await c.call(ReadRangeRequest(ledger_id=1, first_entry_id=0,
                                                     max_count=100_000,
                                                     max_bytes=sum(len(entry(1, e)) + 4
                                                                   for e in range(20))))
        assert len(resp.entries) == 20  # type: ignore[union-attr]


async def test_read_stride_returns_every_stride_th_entry(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        assert (await c.call(add(1, 0, 10)))[0] == Status.OK
        status, resp = await c.call(ReadStrideRequest(ledger_id=1, first_entry_id=1, stride=3,
                                                      max_count=10, max_bytes=1 << 20))
        assert status == Status.OK and isinstance(resp, ReadStrideResponse)
        assert [decode_entry(D, e).entry_id for e in resp.entries] == [1, 4, 7]  # 10: absent
        # The byte budget counts as for ReadRange: at least one entry comes back.
        status, resp = await c.call(ReadStrideRequest(ledger_id=1, first_entry_id=0, stride=2,
                                                      max_count=10, max_bytes=1))
        assert status == Status.OK and len(resp.entries) == 1
        status, _ = await c.call(ReadStrideRequest(ledger_id=1, first_entry_id=0, stride=0,
                                                   max_count=10, max_bytes=100))
        assert status == Status.BAD_REQUEST
        status, _ = await c.call(ReadStrideRequest(ledger_id=1, first_entry_id=20, stride=2,
                                                   max_count=10, max_bytes=100))
        assert status == Status.NO_SUCH_ENTRY


async def test_write_lac_read_lac_and_force_ledger(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        await c.call(add(1, 0, 3))
        body = struct.pack(">qq", 1, 2) + b"digest"
        status, _ = await c.call(WriteLacRequest(ledger_id=1, lac=2, master_key=KEY, lac_body=body))
        assert status == Status.OK
        status, resp = await c.call(ReadLacRequest(ledger_id=1))
        assert status == Status.OK and resp.explicit_lac == body  # type: ignore[union-attr]
        assert decode_entry(D, resp.last_entry).entry_id == 2  # type: ignore[union-attr]
        bad = WriteLacRequest(ledger_id=1, lac=2, master_key=OTHER_KEY, lac_body=body)
        assert (await c.call(bad))[0] == Status.UNAUTHORIZED
        before = b.storage.journal.groups_written
        status, _ = await c.call(ForceLedgerRequest(ledger_id=1, master_key=KEY))
        assert status == Status.OK and b.storage.journal.groups_written > before
        assert (await c.call(ForceLedgerRequest(ledger_id=1, master_key=OTHER_KEY)))[0] == \
            Status.UNAUTHORIZED


async def test_terms_reject_lower_and_raise_higher(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        assert (await c.call(add(1, 0, term=2)))[0] == Status.OK
        assert (await c.call(add(1, 1, term=1)))[0] == Status.INVALID_TERM
        # A recovery read with a higher term raises the stored term (journaled first);
        # it must carry the ledger's key (or anyone could stop the writer).
        assert (await c.call(ReadRequest(ledger_id=1, entry_id=0, term=3)))[0] == \
            Status.UNAUTHORIZED
        status, _ = await c.call(ReadRequest(ledger_id=1, entry_id=0, term=3, master_key=KEY))
        assert status == Status.OK and b.storage.term(1) == 3
        assert (await c.call(add(1, 1, term=2)))[0] == Status.INVALID_TERM
        assert (await c.call(add(1, 1, term=0)))[0] == Status.INVALID_TERM
        assert (await c.call(add(1, 1, term=3)))[0] == Status.OK
        assert (await c.call(ReadRequest(ledger_id=1, entry_id=0, term=2,
                                         master_key=KEY)))[0] == Status.INVALID_TERM
        # Plain reads do not care about terms.
        assert (await c.call(ReadRequest(ledger_id=1, entry_id=1)))[0] == Status.OK


async def test_truncate_add_drops_every_higher_entry(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        await c.call(add(1, 0, 10))
        flags = AddFlags.RECOVERY_ADD | AddFlags.TRUNCATE
        assert (await c.call(add(1, 5, flags=flags, term=1)))[0] == Status.OK
        assert (await c.call(ReadRequest(ledger_id=1, entry_id=6)))[0] == Status.NO_SUCH_ENTRY
        status, resp = await c.call(ReadRequest(ledger_id=1, entry_id=-1))
        assert status == Status.OK and resp.entry_id == 5  # type: ignore[union-attr]


async def test_read_only_refuses_writes_but_serves_reads(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        await c.call(add(1, 0))
        b.state.set(True, "disk full")
        assert (await c.call(add(1, 1)))[0] == Status.READ_ONLY
        assert (await c.call(ReadRequest(ledger_id=1, entry_id=0)))[0] == Status.OK
        body = struct.pack(">qq", 1, 0)
        wl = WriteLacRequest(ledger_id=1, lac=0, master_key=KEY, lac_body=body)
        assert (await c.call(wl))[0] == Status.READ_ONLY
        # Recovery writes are high priority and pass while only the disk is the reason.
        hp = AddFlags.RECOVERY_ADD | AddFlags.HIGH_PRIORITY
        assert (await c.call(add(1, 1, flags=hp)))[0] == Status.OK
        b.state.set(True, "journal failed", storage_failed=True)
        assert (await c.call(add(1, 2, flags=hp)))[0] == Status.READ_ONLY
        status, resp = await c.call(GetBookieInfoRequest())
        assert status == Status.OK and resp.is_read_only  # type: ignore[union-attr]


async def test_entries_must_match_the_request(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        wrong_id = AddRequest(ledger_id=1, first_entry_id=0, master_key=KEY,
                              entries=(entry(1, 7),))
        assert (await c.call(wrong_id))[0] == Status.BAD_REQUEST
        short = AddRequest(ledger_id=1, first_entry_id=0, master_key=KEY, entries=(b"tiny",))
        assert (await c.call(short))[0] == Status.BAD_REQUEST
        assert not b.storage.ledger_exists(1)


async def test_sparse_adds_store_a_striped_bookies_entries_in_one_request(
        tmp_path: Path) -> None:
    """ADD v1's SPARSE flag: one request carries entries with gaps (what a bookie of an
    E3/Qw2 ledger gets); a client that has not seen ADD v1 sends the same as runs."""
    ids = [0, 2, 3, 5, 6, 8]
    req = AddRequest(ledger_id=4, first_entry_id=0, flags=AddFlags.SPARSE, master_key=KEY,
                     entries=tuple(entry(4, e) for e in ids))
    async with running_bookie(tmp_path) as b:
        async with b.connect() as c:  # no ApiVersions: the client splits into runs
            status, resp = await c.call(req)
            assert status == Status.OK and resp == AddResponse(ledger_id=4, first_entry_id=0,
                                                               count=6)
            await b.settled()
            assert b.handler.metrics.requests[ApiKey.ADD, Status.OK] == 4  # runs
        async with b.connect() as c:
            await c.call(ApiVersionsRequest())
            assert c.conn.version_for(ApiKey.ADD) == 1
            more = dataclasses.replace(req, ledger_id=5, entries=tuple(
                entry(5, e) for e in ids))
            status, resp = await c.call(more)
            assert status == Status.OK and resp == AddResponse(ledger_id=5, first_entry_id=0,
                                                               count=6)
            await b.settled()
            assert b.handler.metrics.requests[ApiKey.ADD, Status.OK] == 5  # one request
            backwards = dataclasses.replace(more, entries=more.entries[::-1],
                                            first_entry_id=8)
            assert (await c.call(backwards))[0] == Status.BAD_REQUEST
            for lid in (4, 5):
                for e in range(9):
                    status, resp = await c.call(ReadRequest(ledger_id=lid, entry_id=e))
                    assert (status == Status.OK) == (e in ids), (lid, e, status)


def runs_of(requests: list[tuple[int, AddRequest]]) -> list[AddRun]:
    """Consecutive Add requests (correlation id, request) as runs: each continuing the
    one before (its ledger, the next ids, the same flags, key and term, no unmerged
    flag) joins its run."""
    runs: list[AddRun] = []
    for cid, req in requests:
        if not runs or not runs[-1].extend(cid, req, UNMERGED_ADD_FLAGS):
            runs.append(AddRun.of_request(cid, req))
    return runs



def store_requests(handler: Any, reqs: list[AddRequest]) -> list[tuple[int, Any]]:
    """``handler.store`` for Add requests read together: one outcome per request."""
    return [o for r in handler.store(runs_of(list(enumerate(reqs)))) for o in r]


async def test_add_batch_stores_a_run_as_one_and_answers_each_request(tmp_path: Path) -> None:
    """A connection's adds read together become runs (``runs_of``): a run that
    continues one ledger is stored as one add; a refused run is decided request by
    request, so one bad frame fails alone; other ledgers and flags break the run."""
    async with running_bookie(tmp_path) as b:
        bad = AddRequest(ledger_id=1, first_entry_id=6, master_key=KEY, entries=(entry(1, 9),))
        reqs = [add(1, 0, 2), add(1, 2), add(1, 3, 3), add(2, 0), add(1, 6), add(1, 7),
                add(1, 8, flags=AddFlags.RECOVERY_ADD), add(3, 0), bad, add(3, 1)]
        stored: list[tuple[int, int, int]] = []
        submit_runs = b.storage.submit_runs

        def spy_runs(batch: list[Any]) -> Any:
            stored.extend((r.ledger_id, r.first_entry_id, len(r.entries)) if type(r) is StateRun
                          else (r[0].ledger_id, r[1], len(r[2])) for r in batch)
            return submit_runs(batch)

        b.storage.submit_runs = spy_runs  # type: ignore[method-assign]
        results = store_requests(b.handler, reqs)
        assert [s for s, _ in results] == [Status.OK] * 8 + [Status.BAD_REQUEST, Status.OK]
        # The first run (entries 0-5 of ledger 1) and entries 6-7 were stored as one add
        # each; the recovery add, the other ledgers and the bad frame went alone.
        assert stored == [(1, 0, 6), (2, 0, 1), (1, 6, 2), (1, 8, 1), (3, 0, 1), (3, 1, 1)]
        b.storage.submit_runs = submit_runs  # type: ignore[method-assign]
        for _, group in results:
            if group is not None:
                await group.wait()
        # A run whose middle frame is bad: refused as a whole, then decided one by one.
        bad4 = AddRequest(ledger_id=4, first_entry_id=1, master_key=KEY, entries=(entry(4, 5),))
        results = store_requests(b.handler, [add(4, 0), bad4, add(4, 2)])
        assert [s for s, _ in results] == [Status.OK, Status.BAD_REQUEST, Status.OK]
        for _, group in results:
            if group is not None:
                await group.wait()
        with pytest.raises(EntryNotFoundError):
            b.storage.read_entry(4, 1)
        assert b.storage.read_entry(4, 2) == entry(4, 2)
        for lid, last in ((1, 8), (2, 0), (3, 1)):
            for e in range(last + 1):
                got = decode_entry(D, b.storage.read_entry(lid, e), ledger_id=lid, entry_id=e)
                assert got.payload == f"entry {lid}/{e}".encode()
        assert b.handler.metrics.entries_added == 14


async def test_add_runs_store_accepted_runs_together_and_decide_the_rest_in_order(
        tmp_path: Path) -> None:
    """The hub hands the one-entry add runs of all its connections to ``store``:
    runs the core accepts as they are go to storage together (one journal submission);
    any other is decided in its place, on the state the runs before it left (a key just
    bound, a term just raised), and a run storage fails fails alone."""
    async with running_bookie(tmp_path) as b:
        for req in (add(1, 0), add(2, 0, term=3)):
            [(status, group)] = store_requests(b.handler, [req])
            assert status == Status.OK and group is not None
            await group.wait()

        def run(lid: int, first: int, n: int = 1, *, key: bytes = KEY,
                term: int = 0) -> AddRun:
            return AddRun(lid, first, 0, key, term, list(range(first, first + n)),
                          [entry(lid, first + i) for i in range(n)])

        runs = [run(1, 1, 2), run(1, 3, key=OTHER_KEY), run(9, 0), run(9, 1, key=OTHER_KEY),
                run(9, 1), run(2, 1, term=5), run(2, 2, term=4), run(1, 3), run(3, 0),
                run(4, 0), run(1, 4, term=0)]
        batches: list[list[tuple[int, int, int]]] = []
        submit_runs = b.storage.submit_runs

        def spy(batch: list[Any]) -> Any:
            if not any(type(r) is StateRun for r in batch):  # runs decided apart: not batched
                batches.append([(idx.ledger_id, first, len(es)) for idx, first, es in batch])
            return submit_runs(batch)

        b.storage.submit_runs = spy  # type: ignore[method-assign]
        add_many = b.storage.entry_logger.add_many

        def failing(lid: int, entries: Any) -> list[int]:
            if lid == 3:
                raise StorageError("injected: ledger 3's entry log write")
            return add_many(lid, entries)

        b.storage.entry_logger.add_many = failing  # type: ignore[method-assign]
        for lid in (3, 4):  # held here already, so their runs take the batched path
            b.storage.cache.get_or_create(lid).master_key = KEY
        results = b.handler.store(runs)
        b.storage.entry_logger.add_many = add_many  # type: ignore[method-assign]
        assert [[s for s, _ in r] for r in results] == [
            [Status.OK] * 2, [Status.UNAUTHORIZED], [Status.OK],
            [Status.UNAUTHORIZED],  # ledger 9's key was bound by the run before
            [Status.OK], [Status.OK],
            [Status.INVALID_TERM],  # ledger 2's term was raised to 5 by the run before
            [Status.OK], [Status.IO_ERROR], [Status.OK], [Status.OK]]
        # Accepted runs are stored together up to the next run decided apart.
        assert batches == [[(1, 1, 2)], [(9, 1, 1)], [(1, 3, 1), (3, 0, 1), (4, 0, 1), (1, 4, 1)]]
        groups = {g for r in results for _, g in r if g is not None}
        assert len(groups) == 1  # one pass: one journal group
        await groups.pop().wait()
        for lid, last in ((1, 4), (9, 1), (2, 1), (4, 0)):
            for e in range(last + 1):
                got = decode_entry(D, b.storage.read_entry(lid, e), ledger_id=lid, entry_id=e)
                assert got.payload == f"entry {lid}/{e}".encode()
        with pytest.raises(EntryNotFoundError):
            b.storage.read_entry(2, 2)
        assert b.storage.term(2) == 5
        assert b.handler.metrics.entries_added == 2 + 8


async def test_pipelined_adds_and_reads_keep_their_order(tmp_path: Path) -> None:
    """Adds are held back to be stored together only until a request of another kind:
    a read pipelined behind adds sees them, and every reply keeps its request's order."""
    async with running_bookie(tmp_path) as b, b.connect() as c:
        replies = await c.call_many([add(1, 0), add(1, 1), ReadRequest(ledger_id=1, entry_id=1),
                                     add(1, 2), ReadRequest(ledger_id=1, entry_id=-1)])
        assert [s for s, _ in replies] == [Status.OK] * 5
        assert replies[1][1] == AddResponse(ledger_id=1, first_entry_id=1, count=1)
        assert decode_entry(D, replies[2][1].entry).entry_id == 1  # type: ignore[union-attr]
        assert replies[4][1].entry_id == 2  # type: ignore[union-attr]


async def test_journal_memory_cap_answers_too_many_requests(tmp_path: Path) -> None:
    async with running_bookie(tmp_path, journal=small_journal(4096)) as b, b.connect() as c:
        big = AddRequest(ledger_id=1, first_entry_id=0, master_key=KEY,
                         entries=(entry(1, 0, payload=b"x" * 8192),))
        assert (await c.call(big))[0] == Status.TOO_MANY_REQUESTS
        assert (await c.call(add(1, 0)))[0] == Status.OK


@pytest.mark.no_tls  # drives the raw stream byte by byte (a lockstep pair of its own)
async def test_backpressure_stops_reading_a_connection_at_its_cap(tmp_path: Path) -> None:
    options = ConnectionOptions(max_inflight=4)
    async with running_bookie(tmp_path, options=options) as b:
        client_end, server_end = trio.testing.lockstep_stream_pair()
        b.serve_stream(server_end)
        frames = [encode_request(add(1, e), e, 0) for e in range(6)]
        for f in frames[:4]:
            await client_end.send_all(f)
        # The server holds 4 unanswered requests and cannot write (we do not read): it
        # must not read the fifth.
        sent = False

        async def send_fifth() -> None:
            nonlocal sent
            await client_end.send_all(frames[4])
            sent = True

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_fifth)
            # Every task idle with the four adds durable (their replies wait on the
            # unread stream): what would read the fifth has had every chance to.
            journal = b.storage.journal
            while True:
                await trio.testing.wait_all_tasks_blocked()
                await journal.settle()  # the groups in flight collected
                await trio.testing.wait_all_tasks_blocked()
                if not journal.pending_records:
                    break
            assert not sent
            assert b.storage.last_entry_id(1) == 3
            # Reading the replies frees the connection; the fifth goes through.
            got = b""
            while not sent or _frames(got) < 5:
                got += await client_end.receive_some(1 << 16)
        assert b.storage.last_entry_id(1) == 4
        await client_end.aclose()


async def _read_to_eof(stream: trio.abc.ReceiveStream) -> bytes:
    out = b""
    while data := await stream.receive_some(1024):
        out += data
    return out


def _frames(data: bytes) -> int:
    n = pos = 0
    while pos + 4 <= len(data):
        pos += 4 + struct.unpack_from(">i", data, pos)[0]
        if pos <= len(data):
            n += 1
    return n


async def test_garbage_closes_only_that_connection(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as honest:
        # A known api with a body that does not parse: BAD_REQUEST, then the close.
        bad = b.raw_pair()
        await bad.send_all(struct.pack(">ihhi", 16, 2, 0, 41) + b"\xff" * 8)
        reply = await _read_to_eof(bad)
        assert struct.unpack_from(">iih", reply) == (6, 41, Status.BAD_REQUEST)
        assert (await honest.call(add(1, 0)))[0] == Status.OK

        # A negative size: no header to answer, just the close.
        negative = b.raw_pair()
        await negative.send_all(b"\xff" * 64)
        assert await _read_to_eof(negative) == b""

        oversized = b.raw_pair()
        await oversized.send_all(struct.pack(">ihhi", 64 << 20, 1, 0, 77))
        data = await oversized.receive_some(1024)
        assert struct.unpack_from(">iih", data) == (6, 77, Status.BAD_REQUEST)
        assert await oversized.receive_some(1024) == b""

        tiny = b.raw_pair()
        await tiny.send_all(struct.pack(">i", 3) + b"abc")
        assert await tiny.receive_some(1024) == b""

        unknown = b.raw_pair()
        await unknown.send_all(struct.pack(">ihhi", 8, 99, 0, 5))
        data = await unknown.receive_some(1024)
        assert struct.unpack_from(">iih", data) == (6, 5, Status.UNSUPPORTED_VERSION)
        await unknown.send_all(encode_request(ApiVersionsRequest(), 6, 0))
        data = await unknown.receive_some(1 << 16)
        assert struct.unpack_from(">ih", data, 4) == (6, Status.OK)

        midframe, over = b.raw_connection()
        whole = encode_request(add(2, 0), 1, 0)
        await midframe.send_all(whole[: len(whole) // 2])
        await midframe.aclose()
        await over.wait()
        assert (await honest.call(add(1, 1)))[0] == Status.OK
        assert not b.storage.ledger_exists(2)


async def test_pipelined_adds_survive_a_client_that_disconnects(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b:
        raw, over = b.raw_connection()
        await raw.send_all(b"".join(encode_request(add(1, e), e, 0) for e in range(50)))
        await raw.aclose()
        await over.wait()
        await b.storage.force()
        assert b.storage.last_entry_id(1) == 49


async def test_admin_needs_loopback_or_secret(tmp_path: Path) -> None:
    async with running_bookie(tmp_path, admin_secret="s3cret") as b:
        async with b.connect(trusted=False) as remote:
            trig = AdminTriggerRequest(kind=AdminKind.MAJOR_COMPACTION)
            assert (await remote.call(trig))[0] == Status.UNAUTHORIZED
            assert (await remote.call(AdminStatusRequest()))[0] == Status.UNAUTHORIZED
            with_secret = AdminTriggerRequest(kind=AdminKind.GC, secret=b"s3cret")
            status, resp = await remote.call(with_secret)
            assert status == Status.OK and resp.started == 1  # type: ignore[union-attr]
        async with b.connect(trusted=True) as local:
            # A token is configured: loopback must present it too.
            assert (await local.call(AdminStatusRequest()))[0] == Status.UNAUTHORIZED
            status, resp = await local.call(AdminStatusRequest(secret=b"s3cret"))
            assert status == Status.OK and json.loads(resp.status_json) == {"ok": True}  # type: ignore[union-attr]
            assert (await local.call(AdminTriggerRequest(kind=42, secret=b"s3cret")))[0] \
                == Status.BAD_REQUEST
        assert b.triggered == [AdminKind.GC]
    async with running_bookie(tmp_path / "open") as b, b.connect(trusted=True) as local:
        assert (await local.call(AdminStatusRequest()))[0] == Status.OK  # no token: loopback


async def test_a_read_that_raises_is_answered_io_error_and_the_bookie_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A read that raises what no rule expects (an outside probe found one: a db
    read-ahead running backwards) closed the connection and stopped the bookie; the
    reader then asked the next replica, which failed the same way. It is answered
    IO_ERROR now, logged and counted, on the event loop's path and on the slow one."""
    async with running_bookie(tmp_path) as b, b.connect() as c:
        assert (await c.call(add(1, 0, 3)))[0] == Status.OK
        real = b.storage.read_entry

        def broken(ledger_id: int, entry_id: int) -> bytes:
            if entry_id == 1:
                raise struct.error("offset -7308 out of range for 1556-byte buffer")
            return real(ledger_id, entry_id)

        monkeypatch.setattr(b.storage, "read_entry", broken)
        assert (await c.call(ReadRequest(ledger_id=1, entry_id=1)))[0] == Status.IO_ERROR
        assert (await c.call(ReadRangeRequest(ledger_id=1, first_entry_id=0, max_count=3,
                                              max_bytes=1 << 20)))[0] == Status.IO_ERROR
        monkeypatch.setattr(b.storage, "pages_missing", lambda *_a: True)  # the slow path
        assert b.handler.read_now(ReadRequest(ledger_id=1, entry_id=1)) is None
        assert (await c.call(ReadRequest(ledger_id=1, entry_id=1)))[0] == Status.IO_ERROR
        status, resp = await c.call(ReadRequest(ledger_id=1, entry_id=2))
        assert status == Status.OK and resp is not None
        assert decode_entry(D, resp.entry).entry_id == 2
        assert b.metrics.requests_failed == 3
        assert "ledgerd_bookie_requests_failed_total 3.0" in b.metrics.exposition().decode()
        # one traceback per request kind and error a minute: Read twice, ReadRange once
        logged = [r for r in caplog.records if r.getMessage() == "request_failed"]
        assert len(logged) == 2 and all(r.exc_info for r in logged)


async def test_metrics_count_requests_by_api_and_status(tmp_path: Path) -> None:
    async with running_bookie(tmp_path) as b, b.connect() as c:
        await c.call_many([add(1, e) for e in range(4)])
        await c.call(ReadRequest(ledger_id=7, entry_id=0))
        await b.settled()
        text = b.metrics.exposition().decode()
        assert 'ledgerd_bookie_requests_total{api="ADD",status="OK"} 4.0' in text
        assert 'ledgerd_bookie_requests_total{api="READ",status="NO_SUCH_LEDGER"} 1.0' in text
        assert "ledgerd_bookie_add_latency_seconds_count 4.0" in text


async def test_reads_that_miss_index_pages_read_them_off_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interleaved storage with a 4-page cache: 40 ledgers, so every page a read needs
    was evicted, and evicted from the OS page cache too (and the kernel's RWF_NOWAIT
    answer for them made certain). ``read_now`` declines such reads; the slow path
    reads the pages in a worker thread, caches them, answers."""
    async with running_bookie(tmp_path, page_limit=4, page_size=512) as b, \
            b.connect() as c:
        replies = await c.call_many([add(lid, 0, 70) for lid in range(1, 41)])
        assert [s for s, _ in replies] == [Status.OK] * 40
        await b.storage.checkpoint()  # pages written; the cache holds only the last few
        cache = b.storage.cache
        # Each file leaves the OS page cache right before its first look: only that look
        # can be sure the page is cold (a RWF_NOWAIT read that finds it on disk starts
        # reading it, and a busy machine's writeback and readahead may too).
        assert not cache.ledgers[3].pages and not cache.ledgers[5].pages
        kernel_would_block(monkeypatch, cache.ledgers[3].path, cache.ledgers[5].path)
        evict(cache.ledgers[3].path)
        assert b.handler.read_now(ReadRequest(ledger_id=3, entry_id=65)) is None
        status, resp = await c.call(ReadRequest(ledger_id=3, entry_id=65))
        assert status == Status.OK and resp is not None
        assert decode_entry(D, resp.entry).entry_id == 65
        assert not cache.ledgers[5].pages
        evict(cache.ledgers[5].path)
        assert b.handler.read_now(ReadRangeRequest(ledger_id=5, first_entry_id=0,
                                                   max_count=70, max_bytes=1 << 20)) is None
        status, resp = await c.call(ReadRangeRequest(ledger_id=5, first_entry_id=0,
                                                     max_count=70, max_bytes=1 << 20))
        assert status == Status.OK and resp is not None and len(resp.entries) == 70
        assert [decode_entry(D, e).entry_id for e in resp.entries] == list(range(70))
        assert not b.storage.pages_missing(5, 0, 70)  # both pages in memory now


async def test_max_inflight_counts_each_frame_of_a_multi_frame_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """200 one-entry adds in one write become runs of many frames (one reply item
    each): ``max_inflight`` still counts frames, so the connection stops after eight
    unanswered, and once their group is collected every frame is answered in order."""
    async with running_bookie(tmp_path, options=ConnectionOptions(max_inflight=8)) as b:
        gate = gate_collection(b.storage.journal, monkeypatch)
        s = b.raw_pair()
        await s.send_all(b"".join(encode_request(add(1, e), e, 0) for e in range(200)))
        await trio.testing.wait_all_tasks_blocked(cushion=0.1)
        assert b.storage.last_entry_id(1) == 7  # eight frames unanswered: no more read
        gate.set()
        got = b""
        with trio.fail_after(30):
            while _frames(got) < 200:
                got += await s.receive_some(1 << 20)
        answers, pos = [], 0
        while pos < len(got):
            (size,) = struct.unpack_from(">i", got, pos)
            answers.append(struct.unpack_from(">ih", got, pos + 4))
            pos += 4 + size
        assert answers == [(e, Status.OK) for e in range(200)]
        assert b.storage.last_entry_id(1) == 199
