"""Request handling: thin trio glue between connections, the bookie core and storage.

Every rule lives in ``appliance.core`` (key binding, fencing, terms, truncate, read-only,
header checks, LAC and long-poll rules); this module asks the core, performs what it
decided on ``LedgerStorage``, and shapes the reply.

Adds take the fast path: ``add`` runs synchronously in the connection's task, stores the
frame's entries (readable at once), queues their journal records, and returns the
journal group the reply must wait for. Plain reads that can be answered now take
``read_now``. Everything that waits (fencing and term reads, long polls, WriteLac,
ForceLedger, admin) goes through ``handle`` in a task of its own.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from ledgerd.appliance.core import ACCEPT, Accept, BookieCore
from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.base.logs import fields
from ledgerd.disk.errors import EntryNotFoundError, LedgerNotFoundError, StorageError
from ledgerd.disk.index import LedgerIndex
from ledgerd.disk.journal import JournalGroup
from ledgerd.disk.storage import LedgerStorage
from ledgerd.wire.connection import AddRun, api_versions_response
from ledgerd.wire.frames import add_request
from ledgerd.wire.messages import (
    AddFlags,
    AddRequest,
    AdminKind,
    AdminStatusRequest,
    AdminStatusResponse,
    AdminTriggerRequest,
    AdminTriggerResponse,
    ApiKey,
    ApiVersionsRequest,
    BookieState,
    ForceLedgerRequest,
    ForceLedgerResponse,
    GetBookieInfoRequest,
    GetBookieInfoResponse,
    Message,
    ReadLacRequest,
    ReadLacResponse,
    ReadRangeRequest,
    ReadRangeResponse,
    ReadRequest,
    ReadResponse,
    ReadStrideRequest,
    ReadStrideResponse,
    WriteLacRequest,
    WriteLacResponse,
)
from ledgerd.wire.status import Status, status_for_error

__all__ = ["AdminHooks", "RequestHandler", "ServingState", "status_for_storage_error"]

log = logging.getLogger(__name__)

Reply = tuple[int, Message | None]
UNMERGED_ADD_FLAGS = int(AddFlags.SPARSE | AddFlags.TRUNCATE)  # add_batch keeps these whole


@dataclass
class ServingState:
    """What the bookie is willing to do right now."""

    read_only: bool = False
    reason: str = ""
    storage_failed: bool = False
    draining: bool = False  # read-only by an admin request, whatever the disks say
    changed: trio.Event = field(default_factory=trio.Event)

    def set(self, read_only: bool, reason: str, *, storage_failed: bool = False) -> bool:
        """Change state; True if it changed (listeners wake on ``changed``). While
        draining, the bookie stays read-only (a disk check finding room again must not
        make a bookie being decommissioned take adds)."""
        storage_failed = storage_failed or self.storage_failed
        if self.draining and not read_only:
            read_only, reason = True, DRAINING
        if (read_only, storage_failed) == (self.read_only, self.storage_failed):
            return False
        self.read_only, self.reason, self.storage_failed = read_only, reason, storage_failed
        self.changed.set()
        self.changed = trio.Event()
        return True


DRAINING = "read-only by an admin request (draining)"


def admin_allowed(token: str, presented: str, loopback: bool) -> bool:
    """The admin rule: with a token configured, a request must present it (from anywhere,
    loopback too: any local user could otherwise run admin calls); without one, only
    loopback peers may (the development default). Compared in constant time."""
    if token:
        return hmac.compare_digest(presented.encode(), token.encode())
    return loopback


@dataclass
class AdminHooks:
    """What admin requests may start, and the status they report."""

    trigger: Callable[[AdminKind], bool]
    status: Callable[[], dict[str, Any]]
    secret: str = ""


_STORAGE_STATUS: dict[type[BaseException], Status] = {
    LedgerNotFoundError: Status.NO_SUCH_LEDGER,
    EntryNotFoundError: Status.NO_SUCH_ENTRY,
}


def status_for_storage_error(exc: BaseException) -> Status:
    """What storage reports, as a status: a missing ledger or entry is a fact of this
    bookie's storage; anything else goes through the one table (``wire.status``) in
    reverse, which makes an unexpected storage failure IO_ERROR."""
    status = _STORAGE_STATUS.get(type(exc))
    if status is not None:
        return status
    if isinstance(exc, StorageError):
        return Status.IO_ERROR  # this bookie's disk failed the request, not the client
    return status_for_error(exc)


class RequestHandler:
    """Carries requests to the core and its decisions to storage (one per bookie)."""

    def __init__(self, storage: LedgerStorage, state: ServingState, metrics: BookieMetrics, *,
                 admin: AdminHooks | None = None, max_frame_bytes: int = 8 << 20,
                 version: bytes = b"ledgerd", core: BookieCore | None = None) -> None:
        self.core = core or BookieCore()
        self.storage = storage
        self.state = state
        self.metrics = metrics
        self.admin = admin
        self.max_frame_bytes = max_frame_bytes
        self.version = version
        self._lac_waiters: dict[int, trio.Event] = {}
        self._slow: dict[ApiKey, Callable[[Any, bool], Awaitable[Reply]]] = {
            ApiKey.READ: self._read,
            ApiKey.READ_RANGE: self._read_range,
            ApiKey.READ_STRIDE: self._read_range,
            ApiKey.READ_LAC: self._read_lac,
            ApiKey.WRITE_LAC: self._write_lac,
            ApiKey.FORCE_LEDGER: self._force_ledger,
            ApiKey.GET_BOOKIE_INFO: self._bookie_info,
            ApiKey.ADMIN_TRIGGER: self._admin_trigger,
            ApiKey.ADMIN_STATUS: self._admin_status,
            ApiKey.API_VERSIONS: self._api_versions,
        }

    # -- adds (fast path) --------------------------------------------------------------

    def add(self, req: AddRequest) -> tuple[int, JournalGroup | None]:
        """Store an Add's entries now; reply once the returned group is durable.

        On OK the reply is an AddResponse echoing the request's ledger, first entry and
        count (the server encodes it straight from the request).
        """
        state = self.state
        storage = self.storage
        lid = req.ledger_id
        decision = self.core.on_add(req, storage.cache.ledgers.get(lid), state.read_only,
                                    state.storage_failed)
        if type(decision) is not Accept:
            return decision, None  # type: ignore[return-value]
        entries = req.entries
        n = len(entries)
        nbytes = len(entries[0]) if n == 1 else sum(map(len, entries))
        if not storage.journal.has_capacity(nbytes + 64 * n):
            return Status.TOO_MANY_REQUESTS, None
        try:
            group = storage.submit_entries(lid, req.first_entry_id, entries,
                                           decision.bind_key, decision.new_term,
                                           decision.truncate, decision.entry_ids)
        except StorageError as exc:
            return status_for_storage_error(exc), None
        self.metrics.entries_added += n
        self.metrics.entry_bytes_added += nbytes
        if self._lac_waiters:
            waiter = self._lac_waiters.pop(lid, None)
            if waiter is not None:
                waiter.set()
        return Status.OK, group

    def add_batch(self, reqs: list[AddRequest]) -> list[tuple[int, JournalGroup | None]]:
        """``add`` for the adds of one connection read together, in order: each run of
        them that continues one ledger (consecutive ids, the same flags, key and term)
        is stored as one add, so its entries take the batched storage path (one index
        and entry-log call) instead of one call per frame. Each request gets its own
        answer: when a merged run is refused, its requests are decided one by one
        (nothing of a refused add is stored)."""
        out: list[tuple[int, JournalGroup | None]] = []
        add = self.add
        i = 0
        n = len(reqs)
        while i < n:
            first = reqs[i]
            nxt = first.first_entry_id + len(first.entries)
            j = i + 1
            if not first.flags & UNMERGED_ADD_FLAGS:
                while j < n:
                    r = reqs[j]
                    if (r.first_entry_id != nxt or r.ledger_id != first.ledger_id
                            or r.flags != first.flags or r.term != first.term
                            or r.master_key != first.master_key):
                        break
                    nxt += len(r.entries)
                    j += 1
            if j - i == 1:
                out.append(add(first))
            else:
                merged = AddRequest(ledger_id=first.ledger_id,
                                    first_entry_id=first.first_entry_id, flags=first.flags,
                                    master_key=first.master_key, term=first.term,
                                    entries=tuple(e for r in reqs[i:j] for e in r.entries))
                status, group = add(merged)
                if status == Status.OK:
                    out += [(status, group)] * (j - i)
                else:
                    out += [add(r) for r in reqs[i:j]]
            i = j
        return out

    def add_run(self, run: AddRun) -> list[tuple[int, JournalGroup | None]]:
        """``add_batch`` for a run of one-entry Adds cut straight from a connection's
        buffer (``ServerConnection.take_add_run``: one ledger, consecutive ids, the
        same flags, key and term): stored as one add; if that is refused, each frame is
        decided on its own, as ``add_batch`` does."""
        entries = run.entries
        n = len(entries)
        # The run's key is MASTER_KEY_SIZE bytes (cut by the frame's layout).
        status, group = self.add(add_request(run.ledger_id, run.first_entry_id, run.flags,
                                             run.master_key, run.term, tuple(entries)))
        if status == Status.OK:
            return [(status, group)] * n
        if n == 1:
            return [(status, group)]
        first = run.first_entry_id
        return [self.add(add_request(run.ledger_id, first + i, run.flags, run.master_key,
                                     run.term, (entry,)))
                for i, entry in enumerate(entries)]

    def add_runs(self, runs: Sequence[AddRun]) -> list[list[tuple[int, JournalGroup | None]]]:
        """``add_run`` for the runs of one hub pass (of many connections), in order; one
        answer per frame of each. Runs the core accepts as they are (a ledger held here,
        its key, not fenced, its term) are stored together with one journal submission
        (``LedgerStorage.submit_runs``); any other run first stores those before it,
        then takes ``add_run``, so every run is decided on the state the runs before it
        left. At 64 connections with one add each in flight, each run through ``add_run``
        cost the event loop ~25 us (bench/RESULTS.md, eleventh pass)."""
        out: list[list[tuple[int, JournalGroup | None]] | None] = []
        storage = self.storage
        ledgers = storage.cache.ledgers
        on_add = self.core.on_add
        state = self.state
        has_capacity = storage.journal.has_capacity
        batch: list[tuple[LedgerIndex, int, Sequence[bytes]]] = []
        at: list[int] = []  # each batched run's place in ``out``
        waiting = 0  # journal bytes the batch will add
        for run in runs:
            idx = ledgers.get(run.ledger_id)
            if idx is not None:
                entries = run.entries
                n = len(entries)
                size = (len(entries[0]) if n == 1 else sum(map(len, entries))) + 64 * n
                if (on_add(run, idx, state.read_only, state.storage_failed) is ACCEPT
                        and has_capacity(waiting + size)):
                    waiting += size
                    batch.append((idx, run.first_entry_id, entries))
                    at.append(len(out))
                    out.append(None)
                    continue
            if batch:
                self._store_runs(runs, batch, at, out)
                batch, at, waiting = [], [], 0
            out.append(self.add_run(run))
        if batch:
            self._store_runs(runs, batch, at, out)
        return out  # type: ignore[return-value]

    def _store_runs(self, runs: Sequence[AddRun],
                    batch: list[tuple[LedgerIndex, int, Sequence[bytes]]], at: list[int],
                    out: list[list[tuple[int, JournalGroup | None]] | None]) -> None:
        try:
            group, failed = self.storage.submit_runs(batch)
        except StorageError as exc:  # the journal refused them all (failed or closed)
            status = status_for_storage_error(exc)
            for k in at:
                out[k] = [(status, None)] * len(runs[k].entries)
            return
        metrics = self.metrics
        waiters = self._lac_waiters
        for i, k in enumerate(at):
            entries = runs[k].entries
            error = failed.get(i) if failed else None
            if error is not None:
                out[k] = [(status_for_storage_error(error), None)] * len(entries)
                continue
            out[k] = [(Status.OK, group)] * len(entries)
            metrics.entries_added += len(entries)
            metrics.entry_bytes_added += sum(map(len, entries))
            if waiters:
                waiter = waiters.pop(batch[i][0].ledger_id, None)
                if waiter is not None:
                    waiter.set()

    # -- reads that can be answered now ------------------------------------------------

    def read_now(self, req: Message) -> Reply | None:
        """Answer a plain read at once, or None if it needs ``handle`` (it waits)."""
        if not self.core.is_immediate(req):
            lid = getattr(req, "ledger_id", -1)
            storage = self.storage
            if not self.core.is_settled_recovery_read(req, storage.ledger(lid),
                                                      storage.is_durably_fenced(lid)):
                return None
        if self._index_pages(req, self.storage.pages_missing):
            return None  # an index page to read from a file: off the event loop
        if type(req) is ReadRequest:
            return self._read_entry(req.ledger_id, req.entry_id)
        return self._read_range_now(req)  # type: ignore[arg-type]

    def _index_pages(self, req: Message, fn: Callable[..., Any]) -> Any:
        """``fn(ledger, first entry, count, stride)`` for the entries a read needs, or
        False for other requests and ledgers not held here."""
        if type(req) is ReadRequest:
            idx = self.storage.ledger(req.ledger_id)
            if idx is None:
                return False
            return fn(req.ledger_id, self.core.entry_to_read(req.entry_id, idx.last_entry_id),
                      1, 1)
        if type(req) is ReadRangeRequest or type(req) is ReadStrideRequest:
            return fn(req.ledger_id, req.first_entry_id, req.max_count,
                      getattr(req, "stride", 1))
        return False

    def _read_entry(self, ledger_id: int, entry_id: int) -> Reply:
        storage = self.storage
        idx = storage.ledger(ledger_id)
        if idx is None:
            return Status.NO_SUCH_LEDGER, None
        eid = self.core.entry_to_read(entry_id, idx.last_entry_id)
        try:
            data = storage.read_entry(ledger_id, eid)
            lac = storage.lac(ledger_id)
        except StorageError as exc:
            return status_for_storage_error(exc), None
        return Status.OK, ReadResponse(ledger_id=ledger_id, entry_id=eid, max_lac=lac, entry=data)

    def _read_range_now(self, req: ReadRangeRequest | ReadStrideRequest) -> Reply:
        """ReadRange, and ReadStride (every ``stride``-th entry): the same budget rules."""
        budget = self.core.range_budget(req, self.max_frame_bytes)
        if not isinstance(budget, tuple):
            return budget, None
        stride = req.stride if type(req) is ReadStrideRequest else 1
        try:
            entries = self.storage.read_range(req.ledger_id, req.first_entry_id, *budget,
                                              stride=stride)
            lac = self.storage.lac(req.ledger_id)
        except StorageError as exc:
            return status_for_storage_error(exc), None
        resp = ReadStrideResponse if type(req) is ReadStrideRequest else ReadRangeResponse
        return Status.OK, resp(ledger_id=req.ledger_id, first_entry_id=req.first_entry_id,
                               max_lac=lac, entries=tuple(entries))

    # -- everything else ---------------------------------------------------------------

    async def handle(self, req: Message, *, trusted: bool = True) -> Reply:
        """Answer any request but an Add (the server stores adds through ``add``);
        ``trusted`` says the peer may make admin calls unasked. If cancelled, a fence or
        term this request set may be durable or not (both are idempotent)."""
        handler = self._slow.get(req.API_KEY)
        if handler is None:
            return Status.BAD_REQUEST, None
        try:
            return await handler(req, trusted)
        except StorageError as exc:
            return status_for_storage_error(exc), None

    async def _recovery_flags(self, req: ReadRequest | ReadRangeRequest | ReadStrideRequest
                              ) -> Status:
        """Fence and/or adopt the term, durably, before a recovery read is answered (a
        plain read passes straight through)."""
        decision = self.core.on_recovery_read(req, self.storage.ledger(req.ledger_id))
        if not isinstance(decision, Accept):
            return decision
        if decision.fence:
            await self.storage.fence(req.ledger_id, bind_key=decision.bind_key,
                                     new_term=decision.new_term)
        elif decision.new_term:
            await self.storage.set_term(req.ledger_id, decision.new_term)
        return Status.OK

    async def _read(self, req: ReadRequest, trusted: bool) -> Reply:
        t0 = time.perf_counter()
        status = await self._recovery_flags(req)
        if status != Status.OK:
            return status, None
        if req.timeout_ms > 0:
            return await self._long_poll(req)
        await self._page_in(req)
        reply = self._read_entry(req.ledger_id, req.entry_id)
        self.metrics.read_latency.observe(time.perf_counter() - t0)
        return reply

    async def _long_poll(self, req: ReadRequest) -> Reply:
        lid = req.ledger_id
        storage = self.storage
        core = self.core
        with trio.move_on_after(core.long_poll_timeout(req)):
            while not core.long_poll_ready(storage.ledger_exists(lid),
                                           storage.lac(lid) if storage.ledger_exists(lid) else -1,
                                           req.previous_lac):
                event = self._lac_waiters.get(lid)
                if event is None:
                    event = self._lac_waiters[lid] = trio.Event()
                await event.wait()
        if not storage.ledger_exists(lid):
            return Status.NO_SUCH_LEDGER, None
        lac = storage.lac(lid)
        entry = b""
        piggyback = core.piggyback_entry(req, lac)
        if piggyback >= 0:
            try:
                entry = storage.read_entry(lid, piggyback)
            except EntryNotFoundError:
                entry = b""
        return Status.OK, ReadResponse(ledger_id=lid, entry_id=req.previous_lac + 1,
                                       max_lac=lac, entry=entry)

    async def _read_range(self, req: ReadRangeRequest | ReadStrideRequest,
                          trusted: bool) -> Reply:
        status = await self._recovery_flags(req)
        if status != Status.OK:
            return status, None
        await self._page_in(req)
        return self._read_range_now(req)

    async def _page_in(self, req: Message) -> None:
        """Read the index pages a read needs in a worker thread (interleaved storage)."""
        pending = self._index_pages(req, lambda *a: a)
        if pending:
            await self.storage.page_in(*pending)

    async def _read_lac(self, req: ReadLacRequest, trusted: bool) -> Reply:
        storage = self.storage
        idx = storage.ledger(req.ledger_id)
        if idx is None:
            return Status.NO_SUCH_LEDGER, None
        explicit = idx.explicit_lac
        try:
            last = storage.read_entry(req.ledger_id, idx.last_entry_id)
        except EntryNotFoundError:
            last = b""
        status = self.core.read_lac_status(explicit, last)
        if status != Status.OK:
            return status, None
        return Status.OK, ReadLacResponse(ledger_id=req.ledger_id, explicit_lac=explicit,
                                          last_entry=last)

    async def _write_lac(self, req: WriteLacRequest, trusted: bool) -> Reply:
        storage = self.storage
        decision = self.core.on_write_lac(req, storage.ledger(req.ledger_id),
                                          read_only=self.state.read_only)
        if not isinstance(decision, Accept):
            return decision, None
        if decision.new_term:
            await storage.set_term(req.ledger_id, decision.new_term)
        await storage.set_explicit_lac(req.ledger_id, req.lac_body, req.lac)
        waiter = self._lac_waiters.pop(req.ledger_id, None)
        if waiter is not None:
            waiter.set()
        return Status.OK, WriteLacResponse(ledger_id=req.ledger_id)

    async def _force_ledger(self, req: ForceLedgerRequest, trusted: bool) -> Reply:
        status = self.core.on_force_ledger(req, self.storage.ledger(req.ledger_id))
        if status != Status.OK:
            return status, None
        await self.storage.force()
        return Status.OK, ForceLedgerResponse(ledger_id=req.ledger_id)

    async def _bookie_info(self, req: GetBookieInfoRequest, trusted: bool) -> Reply:
        usage = await trio.to_thread.run_sync(self.storage.usage)
        ledger_usage = [u for u in usage if u.path in self.storage.options.ledger_dirs] or usage
        state = BookieState.READ_ONLY if self.state.read_only else BookieState.WRITABLE
        return Status.OK, GetBookieInfoResponse(
            total_bytes=sum(u.total for u in ledger_usage),
            free_bytes=sum(u.free for u in ledger_usage), state=state, version=self.version)

    async def _api_versions(self, req: ApiVersionsRequest, trusted: bool) -> Reply:
        return Status.OK, api_versions_response()

    def _admin_allowed(self, secret: bytes, trusted: bool) -> bool:
        if self.admin is None:
            return False
        return admin_allowed(self.admin.secret, secret.decode("utf-8", "replace"), trusted)

    async def _admin_trigger(self, req: AdminTriggerRequest, trusted: bool) -> Reply:
        if not self._admin_allowed(req.secret, trusted):
            return Status.UNAUTHORIZED, None
        assert self.admin is not None
        try:
            kind = AdminKind(req.kind)
        except ValueError:
            return Status.BAD_REQUEST, None
        started = self.admin.trigger(kind)
        log.info("admin_trigger", extra=fields(kind=kind.name, started=started))
        return Status.OK, AdminTriggerResponse(started=int(started))

    async def _admin_status(self, req: AdminStatusRequest, trusted: bool) -> Reply:
        if not self._admin_allowed(req.secret, trusted):
            return Status.UNAUTHORIZED, None
        assert self.admin is not None
        body = json.dumps(self.admin.status(), sort_keys=True).encode()
        return Status.OK, AdminStatusResponse(status_json=body)

    def wake_long_polls(self) -> None:
        """Wake every long poll (shutdown; they re-check and answer)."""
        for event in self._lac_waiters.values():
            event.set()
        self._lac_waiters.clear()
