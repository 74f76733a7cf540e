"""Request handling: the bookie's semantics over LedgerStorage, with no sockets.

Adds take the fast path: ``add`` runs synchronously in the connection's task, stores the
frame's entries (readable at once), queues their journal records, and returns the
journal group the reply must wait for. Plain reads that can be answered now take
``read_now``. Everything that waits (fencing and term reads, long polls, WriteLac,
ForceLedger, admin) goes through ``handle`` in a task of its own.

Semantics, as BookKeeper's bookie (``../shared/reference/bookkeeper-facts.md`` §1):
- the first add binds the master key; a different key answers UNAUTHORIZED;
- a plain add to a fenced ledger answers FENCED; RECOVERY_ADD bypasses the fence;
- a fencing read sets the fence, journals it, and answers once that is durable;
- entry -1 reads the last entry stored here; replies carry this bookie's LAC (the
  highest LAC field of the entries it holds);
- a long poll waits until the LAC passes ``previous_lac`` or the timeout ends (then
  answers OK with no entry), and with PIGGYBACK carries entry ``previous_lac + 1``;
- terms (unbounded ledgers): a request whose term is below the ledger's answers
  INVALID_TERM, a higher one raises the stored term (journaled first); term 0 means
  the request does not use terms;
- a read-only bookie answers READ_ONLY to writes except HIGH_PRIORITY ones (recovery),
  which pass unless storage itself has failed.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from appliance.metrics import BookieMetrics
from disk.errors import (
    EntryNotFoundError,
    LedgerFencedStorageError,
    LedgerNotFoundError,
    MasterKeyMismatchError,
    StorageError,
    TermTooLowError,
)
from disk.journal import JournalGroup
from disk.storage import LedgerStorage
from ledgerd.logs import fields
from wire.connection import api_versions_response
from wire.messages import (
    NO_MASTER_KEY,
    AddFlags,
    AddRequest,
    AddResponse,
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
    ReadFlags,
    ReadLacRequest,
    ReadLacResponse,
    ReadRangeRequest,
    ReadRangeResponse,
    ReadRequest,
    ReadResponse,
    WriteLacRequest,
    WriteLacResponse,
)
from wire.status import Status

__all__ = ["AdminHooks", "RequestHandler", "ServingState", "status_for_storage_error"]

log = logging.getLogger(__name__)
_IDS = struct.Struct(">qq")
_ENTRY_HEADER = 32
# Room left in a response frame for everything but entry bytes.
_RANGE_OVERHEAD = 64
_MAX_LONG_POLL_S = 60.0

Reply = tuple[int, Message | None]
# Plain ints: an IntFlag operand would route every ``&`` through enum's Python code.
_RECOVERY = int(AddFlags.RECOVERY_ADD)
_HIGH_PRIORITY = int(AddFlags.HIGH_PRIORITY)
_TRUNCATE = int(AddFlags.TRUNCATE)


@dataclass
class ServingState:
    """What the bookie is willing to do right now."""

    read_only: bool = False
    reason: str = ""
    storage_failed: bool = False
    changed: trio.Event = field(default_factory=trio.Event)

    def set(self, read_only: bool, reason: str, *, storage_failed: bool = False) -> bool:
        """Change state; True if it changed (listeners wake on ``changed``)."""
        storage_failed = storage_failed or self.storage_failed
        if (read_only, storage_failed) == (self.read_only, self.storage_failed):
            return False
        self.read_only, self.reason, self.storage_failed = read_only, reason, storage_failed
        self.changed.set()
        self.changed = trio.Event()
        return True


@dataclass
class AdminHooks:
    """What admin requests may start, and the status they report."""

    trigger: Callable[[AdminKind], bool]
    status: Callable[[], dict[str, Any]]
    secret: str = ""


def status_for_storage_error(exc: BaseException) -> Status:
    if isinstance(exc, LedgerNotFoundError):
        return Status.NO_SUCH_LEDGER
    if isinstance(exc, EntryNotFoundError):
        return Status.NO_SUCH_ENTRY
    if isinstance(exc, MasterKeyMismatchError):
        return Status.UNAUTHORIZED
    if isinstance(exc, LedgerFencedStorageError):
        return Status.FENCED
    if isinstance(exc, TermTooLowError):
        return Status.INVALID_TERM
    return Status.IO_ERROR


class RequestHandler:
    def __init__(self, storage: LedgerStorage, state: ServingState, metrics: BookieMetrics, *,
                 admin: AdminHooks | None = None, max_frame_bytes: int = 8 << 20,
                 version: bytes = b"ledgerd") -> None:
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
        flags = req.flags
        if state.read_only and (state.storage_failed or not flags & _HIGH_PRIORITY):
            return Status.READ_ONLY, None
        entries = req.entries
        lid, first = req.ledger_id, req.first_entry_id
        if first < 0 or not entries:
            return Status.BAD_REQUEST, None
        nbytes = 0
        unpack = _IDS.unpack_from
        for i, entry in enumerate(entries):
            n = len(entry)
            if n < _ENTRY_HEADER or unpack(entry) != (lid, first + i):
                return Status.BAD_REQUEST, None
            nbytes += n
        storage = self.storage
        if not storage.journal.has_capacity(nbytes + 64 * len(entries)):
            return Status.TOO_MANY_REQUESTS, None
        try:
            group = storage.submit_entries(lid, first, entries, req.master_key,
                                           flags & _RECOVERY != 0, req.term or None,
                                           flags & _TRUNCATE != 0)
        except StorageError as exc:
            return status_for_storage_error(exc), None
        self.metrics.entries_added += len(entries)
        if self._lac_waiters:
            waiter = self._lac_waiters.pop(lid, None)
            if waiter is not None:
                waiter.set()
        return Status.OK, group

    # -- reads that can be answered now ------------------------------------------------

    def read_now(self, req: Message) -> Reply | None:
        """Answer a plain read at once, or None if it needs ``handle`` (it waits)."""
        if type(req) is ReadRequest:
            if req.flags & ReadFlags.FENCE or req.term or req.timeout_ms > 0:
                return None
            return self._read_entry(req.ledger_id, req.entry_id)
        if type(req) is ReadRangeRequest:
            if req.flags & ReadFlags.FENCE or req.term:
                return None
            return self._read_range_now(req)
        return None

    def _read_entry(self, ledger_id: int, entry_id: int) -> Reply:
        storage = self.storage
        try:
            data = storage.read_entry(ledger_id, entry_id)
            lac = storage.lac(ledger_id)
        except StorageError as exc:
            return status_for_storage_error(exc), None
        eid = entry_id if entry_id >= 0 else _IDS.unpack_from(data)[1]
        return Status.OK, ReadResponse(ledger_id=ledger_id, entry_id=eid, max_lac=lac, entry=data)

    def _read_range_now(self, req: ReadRangeRequest) -> Reply:
        if req.max_count < 1 or req.first_entry_id < 0:
            return Status.BAD_REQUEST, None
        max_bytes = min(req.max_bytes, self.max_frame_bytes - _RANGE_OVERHEAD)
        try:
            entries = self.storage.read_range(req.ledger_id, req.first_entry_id, req.max_count,
                                              max(0, max_bytes - 4 * req.max_count))
            lac = self.storage.lac(req.ledger_id)
        except StorageError as exc:
            return status_for_storage_error(exc), None
        return Status.OK, ReadRangeResponse(ledger_id=req.ledger_id,
                                            first_entry_id=req.first_entry_id,
                                            max_lac=lac, entries=tuple(entries))

    # -- everything else ---------------------------------------------------------------

    async def handle(self, req: Message, *, trusted: bool = True) -> Reply:
        """Answer any request; ``trusted`` says the peer may make admin calls unasked."""
        if type(req) is AddRequest:
            status, group = self.add(req)
            if group is None:
                return status, None
            try:
                await group.wait()
            except StorageError as exc:
                return status_for_storage_error(exc), None
            return status, AddResponse(ledger_id=req.ledger_id, first_entry_id=req.first_entry_id,
                                       count=len(req.entries))
        handler = self._slow.get(req.API_KEY)
        if handler is None:
            return Status.BAD_REQUEST, None
        try:
            return await handler(req, trusted)
        except StorageError as exc:
            return status_for_storage_error(exc), None

    async def _apply_recovery_flags(self, ledger_id: int, flags: int, master_key: bytes,
                                    term: int) -> None:
        """Fence and/or raise the term, durably, before a recovery read is answered."""
        if term:
            await self.storage.set_term(ledger_id, term)
        if flags & ReadFlags.FENCE:
            if master_key == NO_MASTER_KEY:
                raise MasterKeyMismatchError(ledger_id)
            await self.storage.fence(ledger_id, master_key)

    async def _read(self, req: ReadRequest, trusted: bool) -> Reply:
        t0 = time.perf_counter()
        if req.flags & ReadFlags.FENCE or req.term:
            await self._apply_recovery_flags(req.ledger_id, req.flags, req.master_key, req.term)
        if req.timeout_ms > 0:
            return await self._long_poll(req)
        reply = self._read_entry(req.ledger_id, req.entry_id)
        self.metrics.read_latency.observe(time.perf_counter() - t0)
        return reply

    async def _long_poll(self, req: ReadRequest) -> Reply:
        lid = req.ledger_id
        storage = self.storage
        with trio.move_on_after(min(req.timeout_ms / 1000.0, _MAX_LONG_POLL_S)):
            while not storage.ledger_exists(lid) or storage.lac(lid) <= req.previous_lac:
                event = self._lac_waiters.get(lid)
                if event is None:
                    event = self._lac_waiters[lid] = trio.Event()
                await event.wait()
        if not storage.ledger_exists(lid):
            return Status.NO_SUCH_LEDGER, None
        lac = storage.lac(lid)
        entry = b""
        next_id = req.previous_lac + 1
        if req.flags & ReadFlags.PIGGYBACK and lac > req.previous_lac:
            try:
                entry = storage.read_entry(lid, next_id)
            except EntryNotFoundError:
                entry = b""
        return Status.OK, ReadResponse(ledger_id=lid, entry_id=next_id, max_lac=lac, entry=entry)

    async def _read_range(self, req: ReadRangeRequest, trusted: bool) -> Reply:
        if req.flags & ReadFlags.FENCE or req.term:
            await self._apply_recovery_flags(req.ledger_id, req.flags, req.master_key, req.term)
        return self._read_range_now(req)

    async def _read_lac(self, req: ReadLacRequest, trusted: bool) -> Reply:
        storage = self.storage
        explicit = storage.explicit_lac(req.ledger_id)
        try:
            last = storage.read_entry(req.ledger_id, -1)
        except EntryNotFoundError:
            last = b""
        if not explicit and not last:
            return Status.NO_SUCH_ENTRY, None
        return Status.OK, ReadLacResponse(ledger_id=req.ledger_id, explicit_lac=explicit,
                                          last_entry=last)

    async def _write_lac(self, req: WriteLacRequest, trusted: bool) -> Reply:
        if self.state.read_only:
            return Status.READ_ONLY, None
        if req.term:
            await self.storage.set_term(req.ledger_id, req.term)
        await self.storage.set_explicit_lac(req.ledger_id, req.master_key, req.lac_body, req.lac)
        waiter = self._lac_waiters.pop(req.ledger_id, None)
        if waiter is not None:
            waiter.set()
        return Status.OK, WriteLacResponse(ledger_id=req.ledger_id)

    async def _force_ledger(self, req: ForceLedgerRequest, trusted: bool) -> Reply:
        storage = self.storage
        if storage.ledger_exists(req.ledger_id) and storage.master_key(req.ledger_id) not in (
                b"", req.master_key):
            return Status.UNAUTHORIZED, None
        await storage.force()
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
        if trusted:
            return True
        return bool(self.admin.secret) and secret == self.admin.secret.encode()

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
