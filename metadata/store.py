"""The MetadataStore protocol: a versioned tree with ephemeral nodes, sessions and watches.

Two implementations share these semantics exactly: :class:`metadata.zookeeper.ZooKeeperStore`
(the product and every integration test) and :class:`metadata.memory.InMemoryStore` (unit
tests and the simulator). The behavioural tests in ``tests/metadata/test_store.py`` run
against both so the twin cannot drift.

Semantics, as ZooKeeper's:

- every node has data and a version that starts at 0 and increases by one per write;
  ``set``/``delete`` with ``version >= 0`` are compare-and-set and raise BadVersionError;
- ephemeral nodes belong to the store's session and vanish when it ends;
- sequential creates append a 10-digit counter kept per parent;
- watches are *change notifications*: a ``WatchEvent`` says a node or its children may
  have changed, and the consumer re-reads. Channels are bounded; when a consumer lags,
  notifications coalesce instead of queuing without bound;
- session events: ``LOST`` when the session expired (ephemerals are gone), ``CONNECTED``
  when a session is (re-)established, ``SUSPENDED`` when the connection dropped but the
  session may still live;
- ``multi`` applies a list of operations (:class:`Check`, :class:`Create`,
  :class:`SetData`, :class:`Remove`) atomically, as ZooKeeper's multi-op transaction:
  all of them or none, and no reader sees a state between them.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

import trio

__all__ = ["Check", "Create", "MetadataStore", "NodeStat", "Op", "Remove", "SessionEvent",
           "SessionFanout", "SetData", "WatchEvent", "WatchKind"]


class SessionEvent(enum.Enum):
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


class WatchKind(enum.Enum):
    DATA = "data"
    CHILDREN = "children"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    path: str
    kind: WatchKind


@dataclass(frozen=True, slots=True)
class NodeStat:
    version: int
    ephemeral_owner: int  # session id, 0 for persistent nodes
    ctime_ms: int
    num_children: int


@dataclass(frozen=True, slots=True)
class Check:
    """A multi's condition: ``path`` exists (at ``version`` when that is >= 0)."""

    path: str
    version: int = -1


@dataclass(frozen=True, slots=True)
class Create:
    """A multi's create of a persistent node (its parent must exist)."""

    path: str
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class SetData:
    """A multi's write (compare-and-set when ``version >= 0``)."""

    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True, slots=True)
class Remove:
    """A multi's delete of a node without children (CAS when ``version >= 0``)."""

    path: str
    version: int = -1


Op = Check | Create | SetData | Remove


class SessionFanout:
    """Session events to every subscriber, through bounded channels (both stores use it).

    ``emit`` never blocks: a subscriber 16 events behind loses the newest, which is
    acceptable because owners re-check the session after LOST anyway.
    """

    def __init__(self) -> None:
        self._subscribers: set[trio.MemorySendChannel[SessionEvent]] = set()

    @asynccontextmanager
    async def subscribe(self) -> AsyncIterator[AsyncIterator[SessionEvent]]:
        send, recv = trio.open_memory_channel[SessionEvent](16)
        self._subscribers.add(send)
        try:
            async with recv:
                yield recv
        finally:
            self._subscribers.discard(send)
            send.close()

    def emit(self, event: SessionEvent) -> None:
        for send in list(self._subscribers):
            try:
                send.send_nowait(event)
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                pass

    def close(self) -> None:
        """End every subscriber's iteration (the store closed)."""
        for send in list(self._subscribers):
            send.close()


class MetadataStore(Protocol):
    """One session against the metadata tree. All paths are absolute."""

    @property
    def session_id(self) -> int:
        """The current session's id (it changes after an expiry)."""

    @property
    def servers(self) -> str:
        """The servers this store talks to, for error messages."""

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
                     sequential: bool = False, make_parents: bool = False) -> str:
        """Create a node; returns its path (with the counter when sequential)."""

    async def get(self, path: str) -> tuple[bytes, NodeStat]:
        """Data and stat of ``path``; NoNodeError if absent."""

    async def set(self, path: str, data: bytes, version: int = -1) -> NodeStat:
        """Write data; ``version >= 0`` makes it a compare-and-set."""

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        """Delete ``path`` (CAS when ``version >= 0``); NotEmptyError unless ``recursive``."""

    async def exists(self, path: str) -> NodeStat | None:
        """The stat of ``path``, or None."""

    async def multi(self, ops: Sequence[Op]) -> None:
        """Apply ``ops`` atomically, in order (each sees the ones before it): all of them
        or, if any fails, none; raises the first failing op's error (NoNodeError,
        NodeExistsError, BadVersionError, NotEmptyError) naming its path. A multi
        retried after a lost reply that had landed fails as a conflict would (its
        creates exist, its versions moved): callers re-read and decide again."""

    async def sync(self, path: str) -> None:
        """Bring this session's view of ``path`` up to date (ZooKeeper's ``sync``): a
        read after it sees every write that completed before it was called, whichever
        server the session is on. For a reader that learned of a write some other way
        (a bookie's LAC) and must now read the metadata that write was made under."""

    async def children(self, path: str) -> list[str]:
        """Child names of ``path``, sorted; NoNodeError if absent."""

    def watch(self, path: str, kind: WatchKind) -> AbstractAsyncContextManager[
            AsyncIterator[WatchEvent]]:
        """Notifications that ``path`` (DATA) or its children (CHILDREN) may have changed.

        The first notification arrives at once, so a consumer can read the initial
        state in the same loop it handles changes in.
        """

    def session_events(self) -> AbstractAsyncContextManager[AsyncIterator[SessionEvent]]:
        """Session state changes from now on, for owners of ephemeral nodes."""

    async def close(self) -> None:
        """End the session (its ephemeral nodes vanish)."""
