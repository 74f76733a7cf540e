"""Reading a ledger from its bookies: entries with failover, the LAC, long polls.

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
from dataclasses import dataclass, field
from functools import partial

import trio

from ledgerd.bookie_client import BookieConnectionError
from ledgerd.bookies import BookiePool
from ledgerd.errors import EntryUnavailableError, LedgerdError, ReplicaTimeoutError
from ledgerd.machines.quorum import EnsembleCoverage, range_runs, write_set
from metadata.ledger import LedgerMetadata
from wire.compression import decompress_payload
from wire.entry import Digester, Entry, decode_entry, decode_lac_body
from wire.errors import WireError
from wire.messages import (
    Message,
    ReadLacRequest,
    ReadLacResponse,
    ReadRangeRequest,
    ReadRangeResponse,
    ReadRequest,
    ReadResponse,
)
from wire.status import Status, error_for_status

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


def _status_name(status: int) -> str:
    try:
        return Status(status).name
    except ValueError:
        return f"status {status}"


@dataclass
class _EntryRead:
    entry_id: int
    replicas: list[str]
    next: int = 0
    outstanding: int = 0
    last_sent: float = 0.0
    result: Entry | None = None
    failed: bool = False
    failures: list[tuple[str, LedgerdError]] = field(default_factory=list)


async def fetch_entries(view: LedgerView, first: int, last: int, *,
                        avoid: frozenset[str] = frozenset()) -> list[Entry]:
    """Entries ``first..last`` (inclusive), verified, in order; one request per entry,
    replicas in ``avoid`` asked last."""
    return await _fetch_each(view, range(first, last + 1), avoid)


async def _fetch_each(view: LedgerView, entry_ids: Iterable[int],
                      avoid: frozenset[str]) -> list[Entry]:
    reads = [_EntryRead(eid, view.replicas(eid, avoid)) for eid in entry_ids]
    if not reads:
        return []
    remaining = len(reads)
    done = trio.Event()
    pool = view.pool

    def finish(r: _EntryRead) -> None:
        nonlocal remaining
        remaining -= 1
        if not remaining:
            done.set()

    def send_next(r: _EntryRead) -> None:
        bookie = r.replicas[r.next]
        r.next += 1
        r.outstanding += 1
        r.last_sent = trio.current_time()
        pool.send(bookie, ReadRequest(ledger_id=view.ledger_id, entry_id=r.entry_id),
                  partial(on_reply, r, bookie))

    def on_reply(r: _EntryRead, bookie: str, status: int, response: Message | None,
                 error: BookieConnectionError | None) -> None:
        r.outstanding -= 1
        if r.result is not None or r.failed:
            return
        if error is not None:
            r.failures.append((bookie, error))
        elif status != Status.OK or not isinstance(response, ReadResponse):
            r.failures.append((bookie, error_for_status(status)))
        else:
            try:
                r.result = view.decode(r.entry_id, response.entry)
            except WireError as exc:
                r.failures.append((bookie, exc))
            else:
                finish(r)
                return
        if r.next < len(r.replicas):
            send_next(r)
        elif r.outstanding == 0:
            r.failed = True
            finish(r)

    for r in reads:
        if r.replicas:
            send_next(r)
        else:
            r.failed = True
            finish(r)
    spec = view.speculative_timeout or view.read_timeout
    tick = max(0.01, min(spec, view.read_timeout) / 4)
    while not done.is_set():
        with trio.move_on_after(tick):
            await done.wait()
        now = trio.current_time()
        for r in reads:
            if r.result is not None or r.failed or now - r.last_sent < spec:
                continue
            if r.next < len(r.replicas):
                send_next(r)  # speculative: the slow replica may still answer first
            elif now - r.last_sent >= view.read_timeout:
                r.failures.append(("replicas", ReplicaTimeoutError(view.read_timeout)))
                r.failed = True
                finish(r)
    out = []
    for r in reads:
        if r.result is None:
            raise EntryUnavailableError(view.ledger_id, r.entry_id, r.failures)
        out.append(r.result)
    return out


@dataclass
class _RunRead:
    bookie: str
    next: int
    last: int
    sent_at: float = 0.0
    over: bool = False


async def fetch_range(view: LedgerView, first: int, last: int, *, run_limit: int = 1024,
                      max_bytes: int = 4 << 20) -> list[Entry]:
    """Entries ``first..last`` (inclusive), verified, in order: one ReadRange per run a
    bookie stores whole, then ``fetch_entries`` for anything a run did not deliver."""
    if first > last:
        return []
    md = view.metadata
    pool = view.pool
    unhealthy = pool.recent_failures()
    found: dict[int, Entry] = {}
    avoid: set[str] = set()
    runs: list[_RunRead] = []
    for f_first, f_last, ensemble in md.fragments():
        lo, hi = max(first, f_first), (last if f_last < 0 else min(last, f_last))
        for index, a, b in range_runs(lo, hi, md.ensemble_size, md.write_quorum, run_limit):
            if ensemble[index] not in unhealthy:  # left to the per-entry reads
                runs.append(_RunRead(ensemble[index], a, b))
    pending = len(runs)
    done = trio.Event()
    budget = max(1, min(max_bytes, view.max_entry_bytes // 2))

    def end(run: _RunRead, failed: bool) -> None:
        nonlocal pending
        run.over = True
        if failed:  # asked last for what this run did not deliver
            avoid.add(run.bookie)
        pending -= 1
        if not pending:
            done.set()

    def send(run: _RunRead) -> None:
        run.sent_at = trio.current_time()
        pool.send(run.bookie, ReadRangeRequest(
            ledger_id=view.ledger_id, first_entry_id=run.next,
            max_count=run.last - run.next + 1, max_bytes=budget), partial(on_reply, run))

    def on_reply(run: _RunRead, status: int, response: Message | None,
                 error: BookieConnectionError | None) -> None:
        if run.over:
            return
        if (error is not None or status != Status.OK
                or not isinstance(response, ReadRangeResponse)
                or response.first_entry_id != run.next or not response.entries):
            end(run, failed=True)
            return
        for data in response.entries[: run.last - run.next + 1]:
            try:
                found[run.next] = view.decode(run.next, data)
            except WireError:
                end(run, failed=True)
                return
            run.next += 1
        if run.next > run.last:
            end(run, failed=False)
        else:
            send(run)  # the answer stopped at max_bytes, or before an entry it lacks

    for run in runs:
        send(run)
    spec = view.speculative_timeout or view.read_timeout
    while pending:
        with trio.move_on_after(max(0.01, spec / 4)):
            await done.wait()
        now = trio.current_time()
        for run in runs:
            if not run.over and now - run.sent_at >= spec:
                end(run, failed=True)  # slow: the rest goes to the other replicas
    if len(found) < last - first + 1:
        missing = [eid for eid in range(first, last + 1) if eid not in found]
        for entry in await _fetch_each(view, missing, frozenset(avoid)):
            found[entry.entry_id] = entry
    return [found[eid] for eid in range(first, last + 1)]


async def read_lac(view: LedgerView) -> int:
    """The highest LAC the last ensemble knows (coverage-checked); -1 if none."""
    md = view.metadata
    ensemble = md.last_ensemble[1]
    coverage = EnsembleCoverage(md.ensemble_size, md.write_quorum, md.ack_quorum)
    best = -1
    done = trio.Event()
    errors: list[str] = []

    def on_reply(index: int, bookie: str, status: int, response: Message | None,
                 error: BookieConnectionError | None) -> None:
        nonlocal best
        definite = False
        if error is None and status == Status.OK and isinstance(response, ReadLacResponse):
            try:
                if response.explicit_lac:
                    best = max(best, decode_lac_body(view.digester, response.explicit_lac,
                                                     ledger_id=view.ledger_id))
                if response.last_entry:
                    e = decode_entry(view.digester, response.last_entry,
                                     ledger_id=view.ledger_id)
                    best = max(best, e.lac)
                definite = True
            except WireError as exc:
                errors.append(f"{bookie}: {exc}")
        elif error is None and status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER):
            definite = True
        else:
            errors.append(f"{bookie}: {error.reason if error else _status_name(status)}")
        coverage.record(index, definite)
        if coverage.all_answered:
            done.set()

    for index, bookie in enumerate(ensemble):
        view.pool.send(bookie, ReadLacRequest(ledger_id=view.ledger_id),
                       partial(on_reply, index, bookie))
    with trio.move_on_after(view.read_timeout):
        await done.wait()
    if not coverage.covered:
        raise LedgerdError(f"ledger {view.ledger_id}: read_lac could not reach (Qw - Qa) + 1 "
                           f"bookies of every write quorum ({'; '.join(errors) or 'timed out'})")
    return best


async def long_poll(view: LedgerView, previous_lac: int, timeout: float) -> int:
    """Wait up to ``timeout`` for the LAC to pass ``previous_lac``; returns the LAC then
    (``previous_lac`` when nothing changed: every bookie answered empty, or time ran
    out). The first bookie whose LAC passes the mark ends the wait."""
    ensemble = view.metadata.last_ensemble[1]
    done = trio.Event()
    answered = 0
    best = previous_lac
    req = ReadRequest(ledger_id=view.ledger_id, entry_id=previous_lac + 1,
                      previous_lac=previous_lac, timeout_ms=max(1, int(timeout * 1000)))

    def on_reply(status: int, response: Message | None,
                 error: BookieConnectionError | None) -> None:
        nonlocal answered, best
        answered += 1
        if error is None and status == Status.OK and isinstance(response, ReadResponse):
            best = max(best, response.max_lac)
        if best > previous_lac or answered == len(ensemble):
            done.set()

    for bookie in ensemble:
        view.pool.send(bookie, req, on_reply)
    with trio.move_on_after(timeout + view.read_timeout):
        await done.wait()
    return best
