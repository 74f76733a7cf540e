"""Reading a ledger from its bookies: entries with failover, the LAC, long polls.

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

from dataclasses import dataclass, field
from functools import partial

import trio

from ledgerd.bookie_client import BookieConnectionError
from ledgerd.bookies import BookiePool
from ledgerd.errors import EntryUnavailableError, LedgerdError
from ledgerd.machines.quorum import EnsembleCoverage, write_set
from metadata.ledger import LedgerMetadata
from wire.compression import decompress_payload
from wire.entry import Digester, Entry, decode_entry, decode_lac_body
from wire.errors import WireError
from wire.messages import (
    Message,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
)
from wire.status import Status

__all__ = ["LedgerView", "fetch_entries", "long_poll", "read_lac"]


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

    def replicas(self, entry_id: int) -> list[str]:
        md = self.metadata
        ensemble = md.ensemble_for(entry_id)
        return self.pool.order_replicas(
            ensemble[i] for i in write_set(entry_id, md.ensemble_size, md.write_quorum))


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
    failures: list[str] = field(default_factory=list)


async def fetch_entries(view: LedgerView, first: int, last: int) -> list[Entry]:
    """Entries ``first..last`` (inclusive), verified, in order."""
    reads = [_EntryRead(eid, view.replicas(eid)) for eid in range(first, last + 1)]
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
            r.failures.append(f"{bookie}: {error.reason}")
        elif status != Status.OK or not isinstance(response, ReadResponse):
            r.failures.append(f"{bookie}: {_status_name(status)}")
        else:
            try:
                r.result = view.decode(r.entry_id, response.entry)
            except WireError as exc:
                r.failures.append(f"{bookie}: {exc}")
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
                r.failures.append(f"no answer within {view.read_timeout:g}s")
                r.failed = True
                finish(r)
    out = []
    for r in reads:
        if r.result is None:
            raise EntryUnavailableError(view.ledger_id, r.entry_id, r.failures)
        out.append(r.result)
    return out


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
