"""Connections to every bookie a client talks to: one each, reconnecting with backoff.

``BookiePool.send(address, message, callback)`` never blocks. The first send to a
bookie starts its connection task; requests made while it connects are queued and sent
once it is up. A connection that fails fails its outstanding requests (their callbacks
get the error) and the next send reconnects at once. A *connect* that fails puts the
bookie in backoff (0.1 s doubling to 5 s): sends during backoff fail straight away,
from a task of their own so a callback never runs inside the send that caused it.

``recent_failures`` tells placement and readers which bookies failed lately, so reads
try healthy replicas first and ensemble changes prefer bookies that answer.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field

import trio

from ledgerd.base.logs import fields
from ledgerd.bookie_client import (
    BookieClient,
    BookieConnectionError,
    Callback,
    Connect,
    open_bookie_client,
    tcp_connect,
)
from ledgerd.wire.messages import Message

__all__ = ["BookiePool", "PoolOptions"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolOptions:
    connect_timeout: float = 10.0
    max_inflight: int = 10000
    max_frame_bytes: int = 8 << 20
    backoff_initial: float = 0.1
    backoff_max: float = 5.0
    failure_memory: float = 30.0  # seconds a failure counts in ``recent_failures``
    reorder_reads: bool = True  # reads ask recently failed replicas last
    tls: ssl.SSLContext | None = None  # START_TLS on every connection (ClientConfig.tls_*)
    auth_token: bytes | None = None  # AUTH with it on every connection (auth_token_file)


@dataclass
class _Slot:
    client: BookieClient | None = None
    queued: list[tuple[Message, Callback]] = field(default_factory=list)
    connecting: bool = False
    failed_connects: int = 0
    retry_at: float = 0.0
    last_error: BookieConnectionError | None = None


class BookiePool:
    """One connection per bookie, opened on first use with ``connect`` (TCP by default;
    tests pass one that returns memory streams)."""

    def __init__(self, nursery: trio.Nursery, options: PoolOptions | None = None, *,
                 connect: Connect = tcp_connect) -> None:
        self._nursery = nursery
        self._connect = connect
        self.options = options or PoolOptions()
        self._slots: dict[str, _Slot] = {}
        self._failed_at: dict[str, float] = {}
        self.closed = False

    # -- sending -----------------------------------------------------------------------

    def send(self, address: str, message: Message, callback: Callback) -> None:
        if self.closed:
            self._fail_soon(callback, BookieConnectionError(address, "client closed"))
            return
        slot = self._slots.get(address)
        if slot is None:
            slot = self._slots[address] = _Slot()
        client = slot.client
        if client is not None and not client.closed:
            client.send(message, callback)
            return
        if slot.connecting:
            slot.queued.append((message, callback))
            return
        now = trio.current_time()
        if now < slot.retry_at:
            assert slot.last_error is not None
            self._fail_soon(callback, slot.last_error)
            return
        slot.queued.append((message, callback))
        slot.connecting = True
        self._nursery.start_soon(self._connection, address, slot)

    async def call(self, address: str, message: Message,
                   timeout: float) -> tuple[int, Message | None, str | None]:
        """``send`` awaited: ``(status, response, None)``, or ``(-1, None, reason)`` when
        the connection failed or no answer came within ``timeout``. If cancelled (or
        timed out), the request may still reach the bookie and be acted on; its reply
        is dropped."""
        done = trio.Event()
        box: list[tuple[int, Message | None, str | None]] = []

        def on_reply(status: int, response: Message | None,
                     error: BookieConnectionError | None) -> None:
            box.append((status, response, error.reason if error else None))
            done.set()

        self.send(address, message, on_reply)
        with trio.move_on_after(timeout):
            await done.wait()
        return box[0] if box else (-1, None, f"no answer within {timeout:g}s")

    def _fail_soon(self, callback: Callback, error: BookieConnectionError) -> None:
        async def fire() -> None:
            callback(-1, None, error)
        self._nursery.start_soon(fire)

    # -- connections -------------------------------------------------------------------

    async def _connection(self, address: str, slot: _Slot) -> None:
        opts = self.options
        try:
            async with open_bookie_client(address, connect=self._connect,
                                          connect_timeout=opts.connect_timeout,
                                          max_inflight=opts.max_inflight,
                                          max_frame_bytes=opts.max_frame_bytes,
                                          tls=opts.tls,
                                          auth_token=opts.auth_token) as client:
                slot.client = client
                slot.connecting = False
                slot.failed_connects = 0
                slot.retry_at = 0.0
                queued, slot.queued = slot.queued, []
                for message, callback in queued:
                    client.send(message, callback)
                await client.ended.wait()
                self.note_failure(address)
        except BookieConnectionError as exc:
            slot.failed_connects += 1
            delay = min(opts.backoff_max, opts.backoff_initial * 2 ** (slot.failed_connects - 1))
            slot.retry_at = trio.current_time() + delay
            slot.last_error = exc
            self.note_failure(address)
            log.info("bookie_connect_failed", extra=fields(bookie=address, error=exc.reason,
                                                           retry_in=round(delay, 3)))
            queued, slot.queued = slot.queued, []
            for _message, callback in queued:
                callback(-1, None, exc)
        finally:
            slot.connecting = False
            slot.client = None

    # -- failure memory ----------------------------------------------------------------

    def note_failure(self, address: str) -> None:
        self._failed_at[address] = trio.current_time()

    def last_error(self, address: str) -> str | None:
        """Why the last connection to ``address`` failed (None: it has not)."""
        slot = self._slots.get(address)
        return slot.last_error.reason if slot is not None and slot.last_error else None

    def recent_failures(self) -> set[str]:
        horizon = trio.current_time() - self.options.failure_memory
        return {a for a, t in self._failed_at.items() if t >= horizon}

    def order_replicas(self, bookies: Iterable[str]) -> list[str]:
        """Replicas with the recently failed ones last (stable otherwise); in write-set
        order when ``reorder_reads`` is off."""
        if not self.options.reorder_reads:
            return list(bookies)
        horizon = trio.current_time() - self.options.failure_memory
        failed = {a: t for a, t in self._failed_at.items() if t >= horizon}
        return sorted(bookies, key=lambda b: failed.get(b, float("-inf")))

    def close(self) -> None:
        self.closed = True
        for slot in self._slots.values():
            if slot.client is not None:
                slot.client.close()
