"""Reading a ledger from its bookies: entries with failover, the LAC, long polls.

The decisions (replica order, failover, speculation, timeouts, run plans, LAC coverage)
are the machines of ``ledgerd.machines.reads``; this module sends what they ask for,
verifies what comes back, and sleeps until their next deadline.

Ranges go out as ReadRange requests (``fetch_range``): each fragment is cut into runs
that one bookie stores whole (``range_runs``), one request per run. Whatever a run does
not deliver (an error, a short answer, a bad digest, no answer within the speculative
timeout) is read entry by entry with ``fetch_entries``, the other replicas first.

Every entry read goes to the entry's write set in the fragment that holds it, healthy
replicas first (``BookiePool.order_replicas``). A replica that fails, answers anything
but OK, or returns bytes whose digest does not verify is skipped for the next one; when
a replica is slow past the speculative timeout the next one is asked too, and the first
good answer wins. An entry no replica could serve raises EntryUnavailableError listing
every replica's failure.

``read_lac`` asks the last ensemble for its last entries (and explicit LACs) and takes
the highest LAC once every write quorum has (Qw - Qa) + 1 definite answers. A long poll
asks the whole last ensemble to wait for the LAC to pass a value; the first answer that
does ends it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial

import trio

from ledgerd.bookie_client import BookieConnectionError
from ledgerd.bookies import BookiePool
from ledgerd.deadlines import DeadlineSleep
from ledgerd.errors import EntryUnavailableError, LedgerdError, ReplicaTimeoutError
from ledgerd.machines.quorum import is_definite, write_set
from ledgerd.machines.reads import (
    EntryReads,
    LacTally,
    LongPollTally,
    RangeReads,
    SendRange,
    SendRead,
)
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.wire.compression import decompress_payload
from ledgerd.wire.entry import Digester, Entry, decode_entry, decode_lac_body
from ledgerd.wire.errors import WireError
from ledgerd.wire.messages import (
    Message,
    ReadLacRequest,
    ReadLacResponse,
    ReadRangeRequest,
    ReadRangeResponse,
    ReadRequest,
    ReadResponse,
    ReadStrideRequest,
    ReadStrideResponse,
)
from ledgerd.wire.status import Status, error_for_status

__all__ = ["LedgerView", "fetch_entries", "fetch_range", "long_poll", "read_lac"]


@dataclass
class LedgerView:
    """What a reader needs: the metadata, how to verify entries, whom to ask."""

    ledger_id: int
    metadata: LedgerMetadata
    digester: Digester
    pool: BookiePool
    read_timeout: float = 5.0
    speculative_timeout: float = 2.0
    max_entry_bytes: int = 8 << 20
    strided_reads: bool = True  # ReadStride for striped fragments (Qw < E)

    def decode(self, entry_id: int, data: bytes) -> Entry:
        """Verify (digest, ids) and decompress; raises WireError subclasses."""
        e = decode_entry(self.digester, data, ledger_id=self.ledger_id, entry_id=entry_id)
        if self.metadata.compression == "zstd":
            e = Entry(e.ledger_id, e.entry_id, e.lac, e.length,
                      decompress_payload(e.payload, self.max_entry_bytes))
        return e

    def replicas(self, entry_id: int, avoid: frozenset[str] = frozenset()) -> list[str]:
        """The entry's write set, healthy replicas first and ``avoid`` last."""
        md = self.metadata
        ensemble = md.ensemble_for(entry_id)
        ordered = self.pool.order_replicas(
            ensemble[i] for i in write_set(entry_id, md.ensemble_size, md.write_quorum))
        return sorted(ordered, key=lambda b: b in avoid)


async def fetch_entries(view: LedgerView, first: int, last: int, *,
                        avoid: frozenset[str] = frozenset()) -> list[Entry]:
    """Entries ``first..last`` (inclusive), verified, in order; one request per entry,
    replicas in ``avoid`` asked last. If cancelled, nothing is left behind but replies
    that arrive later and are dropped."""
    return await _fetch_each(view, range(first, last + 1), avoid)


async def _fetch_each(view: LedgerView, entry_ids: Iterable[int],
                      avoid: frozenset[str]) -> list[Entry]:
    plan = [(eid, view.replicas(eid, avoid)) for eid in entry_ids]
    if not plan:
        return []
    machine = EntryReads(plan, speculative_timeout=view.speculative_timeout,
                         read_timeout=view.read_timeout)
    found: dict[int, Entry] = {}
    sleep = DeadlineSleep()
    pool = view.pool

    def send(reads: list[SendRead]) -> None:
        for r in reads:
            pool.send(r.bookie, ReadRequest(ledger_id=view.ledger_id, entry_id=r.entry_id),
                      partial(on_reply, r.entry_id, r.bookie))

    def on_reply(entry_id: int, bookie: str, status: int, response: Message | None,
                 error: BookieConnectionError | None) -> None:
        now = trio.current_time()
        if error is not None:
            send(machine.on_failure(entry_id, bookie, error, now))
        elif status != Status.OK or not isinstance(response, ReadResponse):
            send(machine.on_failure(entry_id, bookie, error_for_status(status), now))
        else:
            try:
                entry = view.decode(entry_id, response.entry)
            except WireError as exc:
                send(machine.on_failure(entry_id, bookie, exc, now))
            else:
                found.setdefault(entry_id, entry)
                send(machine.on_found(entry_id, now))
        if machine.is_done:
            sleep.interrupt()  # a reply only ever moves deadlines later: wake once, at the end

    send(machine.begin(trio.current_time()))
    while not machine.is_done:
        if await sleep.until(machine.next_deadline()):
            send(machine.on_timer(trio.current_time()))
    for eid in machine.timed_out:
        machine.failures(eid).append(("replicas", ReplicaTimeoutError(view.read_timeout)))
    for eid, _replicas in plan:
        if eid not in found:
            raise EntryUnavailableError(view.ledger_id, eid, machine.failures(eid))
    return [found[eid] for eid, _replicas in plan]


async def fetch_range(view: LedgerView, first: int, last: int, *, run_limit: int = 1024,
                      max_bytes: int = 4 << 20) -> list[Entry]:
    """Entries ``first..last`` (inclusive), verified, in order: one ReadRange per run a
    bookie stores whole, then ``fetch_entries`` for anything a run did not deliver. If
    cancelled, nothing is left behind but replies that arrive later and are dropped."""
    if first > last:
        return []
    md = view.metadata
    pool = view.pool
    machine = RangeReads(md.fragments(), first, last, ensemble_size=md.ensemble_size,
                         write_quorum=md.write_quorum, run_limit=run_limit,
                         skip=frozenset(pool.recent_failures()),
                         speculative_timeout=view.speculative_timeout or view.read_timeout,
                         strided=view.strided_reads)
    found: dict[int, Entry] = {}
    sleep = DeadlineSleep()
    budget = max(1, min(max_bytes, view.max_entry_bytes // 2))

    def send(sends: list[SendRange]) -> None:
        for s in sends:
            req: Message
            if s.stride > 1:
                req = ReadStrideRequest(ledger_id=view.ledger_id, first_entry_id=s.first_entry_id,
                                        stride=s.stride, max_count=s.max_count,
                                        max_bytes=budget)
            else:
                req = ReadRangeRequest(ledger_id=view.ledger_id, first_entry_id=s.first_entry_id,
                                       max_count=s.max_count, max_bytes=budget)
            pool.send(s.bookie, req, partial(on_reply, s.run, s.first_entry_id, s.stride))

    def on_reply(run: int, first_id: int, stride: int, status: int,
                 response: Message | None, error: BookieConnectionError | None) -> None:
        wanted = machine.wanted(run)
        if not wanted:
            return
        if (error is not None or status != Status.OK
                or not isinstance(response, (ReadRangeResponse, ReadStrideResponse))
                or response.first_entry_id != first_id):
            # A bookie that predates ReadStride answers UNSUPPORTED_VERSION: what the
            # run did not deliver is read entry by entry from the replicas.
            send(machine.on_answer(run, 0, True, trio.current_time()))
            if machine.is_done:
                sleep.interrupt()
            return
        delivered = 0
        failed = False
        eid = first_id
        for data in response.entries[:wanted]:
            try:
                found[eid] = view.decode(eid, data)
            except WireError:
                failed = True
                break
            delivered += 1
            eid += stride
        send(machine.on_answer(run, delivered, failed, trio.current_time()))
        if machine.is_done:
            sleep.interrupt()

    send(machine.begin(trio.current_time()))
    while not machine.is_done:
        if await sleep.until(machine.next_deadline()):
            machine.on_timer(trio.current_time())
    if len(found) < last - first + 1:
        missing = [eid for eid in range(first, last + 1) if eid not in found]
        for entry in await _fetch_each(view, missing, frozenset(machine.avoid)):
            found[entry.entry_id] = entry
    return [found[eid] for eid in range(first, last + 1)]


def lac_of_answer(digester: Digester, ledger_id: int, response: ReadLacResponse) -> int:
    """The LAC a bookie's ReadLac answer shows: its explicit LAC or the LAC inside its last
    entry, whichever is higher; -1 if neither. WireError if a body fails its digest."""
    lac = -1
    if response.explicit_lac:
        lac = decode_lac_body(digester, response.explicit_lac, ledger_id=ledger_id)
    if response.last_entry:
        lac = max(lac, decode_entry(digester, response.last_entry, ledger_id=ledger_id).lac)
    return lac


async def read_lac(view: LedgerView) -> int:
    """The highest LAC the last ensemble knows (coverage-checked); -1 if none."""
    md = view.metadata
    ensemble = md.last_ensemble[1]
    tally = LacTally(md.ensemble_size, md.write_quorum, md.ack_quorum)
    done = trio.Event()
    errors: list[str] = []

    def on_reply(index: int, bookie: str, status: int, response: Message | None,
                 error: BookieConnectionError | None) -> None:
        lac = -1
        if error is not None:
            errors.append(f"{bookie}: {error.reason}")
            status = Status.IO_ERROR
        elif status == Status.OK and isinstance(response, ReadLacResponse):
            try:
                lac = lac_of_answer(view.digester, view.ledger_id, response)
            except WireError as exc:
                errors.append(f"{bookie}: {exc}")
                status, lac = Status.IO_ERROR, -1
        elif not is_definite(status):
            errors.append(f"{bookie}: {error_for_status(status)}")
        tally.on_answer(index, status, lac)
        if tally.is_done:
            done.set()

    for index, bookie in enumerate(ensemble):
        view.pool.send(bookie, ReadLacRequest(ledger_id=view.ledger_id),
                       partial(on_reply, index, bookie))
    with trio.move_on_after(view.read_timeout):
        await done.wait()
    if not tally.covered:
        raise LedgerdError(f"ledger {view.ledger_id}: read_lac could not reach (Qw - Qa) + 1 "
                           f"bookies of every write quorum ({'; '.join(errors) or 'timed out'})")
    return tally.best


async def long_poll(view: LedgerView, previous_lac: int, timeout: float) -> int:
    """Wait up to ``timeout`` for the LAC to pass ``previous_lac``; returns the LAC then
    (``previous_lac`` when nothing changed: every bookie answered empty, or time ran
    out). The first bookie whose LAC passes the mark ends the wait."""
    ensemble = view.metadata.last_ensemble[1]
    tally = LongPollTally(len(ensemble), previous_lac)
    done = trio.Event()
    req = ReadRequest(ledger_id=view.ledger_id, entry_id=previous_lac + 1,
                      previous_lac=previous_lac, timeout_ms=max(1, int(timeout * 1000)))

    def on_reply(status: int, response: Message | None,
                 error: BookieConnectionError | None) -> None:
        answered = error is None and status == Status.OK and isinstance(response, ReadResponse)
        tally.on_answer(response.max_lac if answered else None)  # type: ignore[union-attr]
        if tally.is_done:
            done.set()

    for bookie in ensemble:
        view.pool.send(bookie, req, on_reply)
    with trio.move_on_after(timeout + view.read_timeout):
        await done.wait()
    return tally.best
