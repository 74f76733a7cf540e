"""Request handling: thin trio glue between connections, the bookie core and storage.

Every rule lives in ``appliance.core`` (key binding, fencing, terms, truncate, read-only,
header checks, LAC and long-poll rules); this module asks the core, performs what it
decided on ``LedgerStorage``, and shapes the reply.

Adds have one path into storage: ``store(runs)``, synchronous in the transport's task,
decides each run of Add frames through the core, stores the accepted entries (readable
at once), queues their journal records, and returns per frame the journal group its
reply must wait for. Plain reads that can be answered now take ``read_now``. Everything
that waits (fencing and term reads, long polls, WriteLac, ForceLedger, admin) goes
through ``handle`` in a task of its own.
"""

from __future__ import annotations

import hmac
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from ledgerd.appliance.core import ACCEPT, Accept, BookieCore
from ledgerd.appliance.holdings import list_holdings
from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.base.logs import fields
from ledgerd.disk.errors import EntryNotFoundError, LedgerNotFoundError, StorageError
from ledgerd.disk.index import LedgerIndex
from ledgerd.disk.journal import JournalGroup
from ledgerd.disk.storage import LedgerStorage, StateRun
from ledgerd.wire.connection import AddRun, api_versions_response
from ledgerd.wire.messages import (
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
    LedgerHoldingsRequest,
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
FAILED_LOG_EVERY_S = 60.0  # request_failed tracebacks, per request kind and error

Reply = tuple[int, Message | None]
# An add's outcome: its status and, on OK, the journal group its reply waits for.
Outcome = tuple[int, JournalGroup | None]


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
        # (request kind, error) -> (when its traceback was last logged, failures since)
        self._failures: dict[tuple[str, str], tuple[float, int]] = {}
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
            ApiKey.LEDGER_HOLDINGS: self._ledger_holdings,
            ApiKey.API_VERSIONS: self._api_versions,
        }

    # -- adds (the one path into storage) ----------------------------------------------

    def store(self, runs: Sequence[AddRun]) -> list[list[Outcome]]:
        """Store the adds of ``runs``, in order; one outcome per frame of each run: its
        status and, on OK, the journal group its reply waits for.

        Each run is decided once by the core, on the state the runs before it left.
        Runs accepted as they are (a ledger held here, its key, not fenced, its term)
        are stored together with one journal submission (``LedgerStorage.submit_runs``);
        a run that binds a key, adopts a term, truncates or is sparse is stored alone,
        after those before it. A refused run of several frames is decided again frame
        by frame (each frame once), so one bad frame fails alone and nothing of a
        refused frame is stored; so is a run that binds a key or adopts a term and that
        storage failed. The journal's memory cap answers TOO_MANY_REQUESTS.
        """
        out: list[list[Outcome] | None] = [None] * len(runs)
        storage = self.storage
        ledgers = storage.cache.ledgers
        on_add = self.core.on_add
        state = self.state
        has_capacity = storage.journal.has_capacity
        batch: list[tuple[LedgerIndex, int, Sequence[bytes]]] = []
        at: list[tuple[int, AddRun]] = []  # each batched run's place in ``out``
        waiting = 0  # journal bytes the batch will add
        # (run, its place in ``out``, whether it is one frame of a refused run); a
        # refused run's frames take its place here, and ``parts`` gathers their outcomes.
        work = [(run, k, False) for k, run in enumerate(runs)]
        work.reverse()
        parts: dict[int, list[Outcome]] = {}
        while work:
            run, k, is_part = work.pop()
            entries = run.entries
            n = len(entries)
            size = (len(entries[0]) if n == 1 else sum(map(len, entries))) + 64 * n
            idx = ledgers.get(run.ledger_id)
            decision = on_add(run, idx, state.read_only, state.storage_failed)
            if decision is ACCEPT:
                if has_capacity(waiting + size):
                    assert idx is not None  # ACCEPT: a ledger held here
                    waiting += size
                    batch.append((idx, run.first_entry_id, entries))
                    at.append((k, run))
                    continue
                status: int = Status.TOO_MANY_REQUESTS
            elif type(decision) is Accept:
                status = Status.TOO_MANY_REQUESTS
            else:
                status = decision  # type: ignore[assignment]
            if batch:  # stored before anything decided apart
                self._store_runs(batch, at, out, parts)
                batch, at, waiting = [], [], 0
            outcome: Outcome = (status, None)
            if type(decision) is Accept and decision is not ACCEPT and has_capacity(size):
                outcome = self._store_with_state(run, decision)
            if outcome[0] == Status.OK or is_part or len(run.correlation_ids) == 1:
                self._finish(k, run, outcome, out, parts)
            else:
                # Refused (or failed in storage) as a whole: each frame is decided on its
                # own, in order.
                parts[k] = []
                work += [(frame, k, True) for frame in reversed(run.frames())]
        if batch:
            self._store_runs(batch, at, out, parts)
        return out  # type: ignore[return-value]

    @staticmethod
    def _finish(k: int, run: AddRun, outcome: Outcome, out: list[list[Outcome] | None],
                parts: dict[int, list[Outcome]]) -> None:
        """Record ``run``'s outcome (one per frame) at ``out[k]``; a frame of a refused
        run adds to that run's outcomes instead."""
        whole = parts.get(k)
        if whole is None:
            out[k] = [outcome] * len(run.correlation_ids)
        else:
            whole.append(outcome)
            out[k] = whole

    def _store_with_state(self, run: AddRun, decision: Accept) -> Outcome:
        """Store a run whose decision changes the ledger's state (binds its key,
        adopts a term, truncates after it, or places sparse entries)."""
        entries = run.entries
        try:
            group, failed = self.storage.submit_runs([StateRun(
                run.ledger_id, run.first_entry_id, entries, decision.bind_key,
                decision.new_term, decision.truncate, decision.entry_ids)])
        except StorageError as exc:  # the journal refused it (failed or closed)
            return status_for_storage_error(exc), None
        if failed:
            return status_for_storage_error(failed[0]), None
        self._added(run.ledger_id, entries)
        return Status.OK, group

    def _added(self, ledger_id: int, entries: Sequence[bytes]) -> None:
        self.metrics.entries_added += len(entries)
        self.metrics.entry_bytes_added += (len(entries[0]) if len(entries) == 1
                                           else sum(map(len, entries)))
        waiters = self._lac_waiters
        if waiters:
            waiter = waiters.pop(ledger_id, None)
            if waiter is not None:
                waiter.set()

    def _store_runs(self, batch: list[tuple[LedgerIndex, int, Sequence[bytes]]],
                    at: list[tuple[int, AddRun]], out: list[list[Outcome] | None],
                    parts: dict[int, list[Outcome]]) -> None:
        try:
            group, failed = self.storage.submit_runs(batch)
        except StorageError as exc:  # the journal refused them all (failed or closed)
            status = status_for_storage_error(exc)
            for k, run in at:
                self._finish(k, run, (status, None), out, parts)
            return
        ok: Outcome = (Status.OK, group)
        metrics = self.metrics
        waiters = self._lac_waiters
        for i, (k, run) in enumerate(at):
            error = failed.get(i) if failed else None
            if error is not None:
                self._finish(k, run, (status_for_storage_error(error), None), out, parts)
                continue
            # ``_finish`` and ``_added``, inline: once per run on the bookie's hot path.
            if parts and k in parts:
                self._finish(k, run, ok, out, parts)
            else:
                out[k] = [ok] * len(run.correlation_ids)
            entries = run.entries
            metrics.entries_added += len(entries)
            metrics.entry_bytes_added += (len(entries[0]) if len(entries) == 1
                                          else sum(map(len, entries)))
            if waiters:
                waiter = waiters.pop(run.ledger_id, None)
                if waiter is not None:
                    waiter.set()

    # -- reads that can be answered now ------------------------------------------------

    def read_now(self, req: Message) -> Reply | None:
        """Answer a plain read at once, or None if it needs ``handle`` (it waits)."""
        try:
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
        except Exception:
            return self._failed(req)

    def _failed(self, req: Message) -> Reply:
        """A request that raised what no rule here expects (a bug): IO_ERROR for it,
        logged with its traceback. The bookie goes on: a read every replica fails the
        same way must not take every replica down with it (the reader asks the next
        one). Adds keep failing the bookie (``store``): an add half applied in memory
        could be acknowledged later. The traceback is logged once a minute per request
        kind and error (with how many came since): a bug every read meets must not
        flood the log."""
        self.metrics.requests_failed += 1
        exc = sys.exc_info()[1]
        key = (type(req).__name__, type(exc).__name__)
        now = time.monotonic()
        last, since = self._failures.get(key, (-FAILED_LOG_EVERY_S, 0))
        if now - last < FAILED_LOG_EVERY_S:
            self._failures[key] = (last, since + 1)
            return Status.IO_ERROR, None
        if len(self._failures) >= 1000:
            self._failures.clear()
        self._failures[key] = (now, 0)
        log.exception("request_failed", extra=fields(
            api=type(req).__name__, ledger=getattr(req, "ledger_id", None),
            entry=getattr(req, "entry_id", getattr(req, "first_entry_id", None)),
            unlogged_since=since))
        return Status.IO_ERROR, None

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
        self.metrics.entries_read += 1
        self.metrics.entry_bytes_read += len(data)
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
        self.metrics.entries_read += len(entries)
        self.metrics.entry_bytes_read += sum(len(e) for e in entries)
        resp = ReadStrideResponse if type(req) is ReadStrideRequest else ReadRangeResponse
        return Status.OK, resp(ledger_id=req.ledger_id, first_entry_id=req.first_entry_id,
                               max_lac=lac, entries=tuple(entries))

    # -- everything else ---------------------------------------------------------------

    async def handle(self, req: Message, *, trusted: bool = True) -> Reply:
        """Answer any request but an Add (adds go through ``store``);
        ``trusted`` says the peer may make admin calls unasked. If cancelled, a fence or
        term this request set may be durable or not (both are idempotent)."""
        handler = self._slow.get(req.API_KEY)
        if handler is None:
            return Status.BAD_REQUEST, None
        try:
            return await handler(req, trusted)
        except StorageError as exc:
            return status_for_storage_error(exc), None
        except Exception:
            return self._failed(req)

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
        # no probe: a client asking for the space left never writes to the disks (the
        # disk checker probes them)
        usage = await trio.to_thread.run_sync(partial(self.storage.usage, probe=False))
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

    async def _ledger_holdings(self, req: LedgerHoldingsRequest, trusted: bool) -> Reply:
        """A page of what this bookie holds (``appliance.holdings``), for an admin."""
        if not self._admin_allowed(req.secret, trusted):
            return Status.UNAUTHORIZED, None
        if req.first_ledger_id < 0 or req.first_entry_id < 0:
            return Status.BAD_REQUEST, None
        return Status.OK, await list_holdings(self.storage, req)
