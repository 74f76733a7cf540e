"""An in-memory MetadataStore with ZooKeeper's semantics, for unit tests and the simulator.

``InMemoryCluster`` is the shared tree (the "server"); each ``InMemoryStore`` is one
session against it. ``expire_session()`` does what a ZooKeeper session expiry does: the
session's ephemeral nodes vanish, its owner sees LOST, and a new session starts
(CONNECTED), as kazoo reconnects. Never used by integration tests.
"""

from __future__ import annotations

import posixpath
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import trio

from ledgerd.metadata.errors import (
    BadVersionError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from ledgerd.metadata.store import (
    Check,
    Create,
    NodeStat,
    Op,
    SessionEvent,
    SessionFanout,
    SetData,
    WatchEvent,
    WatchKind,
)

__all__ = ["InMemoryCluster", "InMemoryStore"]


@dataclass
class _Node:
    data: bytes
    version: int = 0
    ephemeral_owner: int = 0
    ctime_ms: int = 0
    children: set[str] = field(default_factory=set)
    sequence: int = 0


def _parent(path: str) -> str:
    return posixpath.dirname(path) or "/"


def _check_path(path: str) -> None:
    if not path.startswith("/") or (path != "/" and path.endswith("/")) or "//" in path:
        raise MetadataError(f"invalid path {path!r}")


class InMemoryCluster:
    """The shared tree: what a ZooKeeper ensemble would hold."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Node] = {"/": _Node(b"")}
        self.watchers: dict[tuple[str, WatchKind], set[trio.MemorySendChannel[WatchEvent]]] = \
            defaultdict(set)
        self._next_session = 0x1000

    def new_session_id(self) -> int:
        self._next_session += 1
        return self._next_session

    def notify(self, path: str, kind: WatchKind) -> None:
        for send in list(self.watchers.get((path, kind), ())):
            try:
                send.send_nowait(WatchEvent(path, kind))
            except trio.WouldBlock:
                pass  # a notification is already pending; the consumer re-reads anyway
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                self.watchers[(path, kind)].discard(send)

    def remove(self, path: str) -> None:
        node = self.nodes.pop(path)
        assert not node.children
        parent = _parent(path)
        self.nodes[parent].children.discard(posixpath.basename(path))
        self.notify(path, WatchKind.DATA)
        self.notify(path, WatchKind.CHILDREN)  # ZooKeeper fires NodeDeleted at child watches
        self.notify(parent, WatchKind.CHILDREN)

    def drop_ephemerals(self, session_id: int) -> None:
        for path in sorted((p for p, n in self.nodes.items() if n.ephemeral_owner == session_id),
                           key=len, reverse=True):
            self.remove(path)


class InMemoryStore:
    """One session against an :class:`InMemoryCluster`."""

    def __init__(self, cluster: InMemoryCluster) -> None:
        self.cluster = cluster
        self._session_id = cluster.new_session_id()
        self._closed = False
        self._sessions = SessionFanout()

    @property
    def session_id(self) -> int:
        return self._session_id

    @property
    def servers(self) -> str:
        return "memory"

    def _live(self) -> None:
        if self._closed:
            raise SessionExpiredError("session closed")

    def _node(self, path: str) -> _Node:
        _check_path(path)
        node = self.cluster.nodes.get(path)
        if node is None:
            raise NoNodeError(path)
        return node

    @staticmethod
    def _stat(node: _Node) -> NodeStat:
        return NodeStat(node.version, node.ephemeral_owner, node.ctime_ms, len(node.children))

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
                     sequential: bool = False, make_parents: bool = False) -> str:
        await trio.lowlevel.checkpoint()
        self._live()
        _check_path(path)
        parent = _parent(path)
        if parent not in self.cluster.nodes:
            if not make_parents:
                raise NoNodeError(parent)
            self._make_parents(parent)
        pnode = self.cluster.nodes[parent]
        if pnode.ephemeral_owner:
            raise MetadataError(f"ephemeral node {parent} cannot have children")
        if sequential:
            path = f"{path}{pnode.sequence:010d}"
            pnode.sequence += 1
        if path in self.cluster.nodes:
            raise NodeExistsError(path)
        self.cluster.nodes[path] = _Node(bytes(data), 0, self._session_id if ephemeral else 0,
                                         int(time.time() * 1000))
        pnode.children.add(posixpath.basename(path))
        self.cluster.notify(path, WatchKind.DATA)
        self.cluster.notify(path, WatchKind.CHILDREN)  # a watch that outlived a deletion
        self.cluster.notify(parent, WatchKind.CHILDREN)
        return path

    def _make_parents(self, path: str) -> None:
        # Like kazoo's ensure_path: create each missing ancestor, ignore existing ones.
        missing = []
        while path not in self.cluster.nodes:
            missing.append(path)
            path = _parent(path)
        for p in reversed(missing):
            pnode = self.cluster.nodes[_parent(p)]
            if pnode.ephemeral_owner:
                raise MetadataError(f"ephemeral node {_parent(p)} cannot have children")
            self.cluster.nodes[p] = _Node(b"", ctime_ms=int(time.time() * 1000))
            pnode.children.add(posixpath.basename(p))
            self.cluster.notify(p, WatchKind.CHILDREN)  # a watch that outlived a deletion
            self.cluster.notify(_parent(p), WatchKind.CHILDREN)

    async def get(self, path: str) -> tuple[bytes, NodeStat]:
        await trio.lowlevel.checkpoint()
        self._live()
        node = self._node(path)
        return node.data, self._stat(node)

    async def set(self, path: str, data: bytes, version: int = -1) -> NodeStat:
        await trio.lowlevel.checkpoint()
        self._live()
        node = self._node(path)
        if version >= 0 and node.version != version:
            raise BadVersionError(path, version)
        self._set_now(node, path, data)
        return self._stat(node)

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        await trio.lowlevel.checkpoint()
        self._live()
        node = self._node(path)
        if version >= 0 and node.version != version:
            raise BadVersionError(path, version)
        if node.children:
            if not recursive:
                raise NotEmptyError(path)
            for child in sorted(node.children):
                await self.delete(posixpath.join(path, child), recursive=True)
        self.cluster.remove(path)

    async def multi(self, ops: Sequence[Op]) -> None:
        """Every op checked against the tree as the ops before it leave it, then all
        applied with no checkpoint between them (no other task sees a state between)."""
        await trio.lowlevel.checkpoint()
        self._live()
        nodes = self.cluster.nodes
        seen: dict[str, tuple[bool, int]] = {}  # path -> (exists, version) after the ops
        kids: dict[str, int] = {}  # path -> children count after the ops

        def state(path: str) -> tuple[bool, int]:
            if path in seen:
                return seen[path]
            node = nodes.get(path)
            return (False, 0) if node is None else (True, node.version)

        def count(path: str) -> int:
            return kids[path] if path in kids else len(nodes[path].children) \
                if path in nodes else 0

        for op in ops:
            _check_path(op.path)
            exists, version = state(op.path)
            if isinstance(op, Create):
                parent = _parent(op.path)
                if not state(parent)[0]:
                    raise NoNodeError(parent)
                if parent in nodes and nodes[parent].ephemeral_owner:
                    raise MetadataError(f"ephemeral node {parent} cannot have children")
                if exists:
                    raise NodeExistsError(op.path)
                seen[op.path] = (True, 0)
                kids[op.path] = 0
                kids[parent] = count(parent) + 1
                continue
            if not exists:
                raise NoNodeError(op.path)
            if op.version >= 0 and op.version != version:
                raise BadVersionError(op.path, op.version)
            if isinstance(op, SetData):
                seen[op.path] = (True, version + 1)
            elif not isinstance(op, Check):  # Remove
                if count(op.path):
                    raise NotEmptyError(op.path)
                parent = _parent(op.path)
                seen[op.path] = (False, 0)
                kids[parent] = count(parent) - 1
        for op in ops:  # every op holds: apply them all, with no checkpoint between
            if isinstance(op, Create):
                self._create_now(op.path, op.data)
            elif isinstance(op, SetData):
                self._set_now(self.cluster.nodes[op.path], op.path, op.data)
            elif not isinstance(op, Check):
                self.cluster.remove(op.path)

    def _create_now(self, path: str, data: bytes) -> None:
        parent = _parent(path)
        self.cluster.nodes[path] = _Node(bytes(data), 0, 0, int(time.time() * 1000))
        self.cluster.nodes[parent].children.add(posixpath.basename(path))
        self.cluster.notify(path, WatchKind.DATA)
        self.cluster.notify(path, WatchKind.CHILDREN)
        self.cluster.notify(parent, WatchKind.CHILDREN)

    def _set_now(self, node: _Node, path: str, data: bytes) -> None:
        node.data = bytes(data)
        node.version += 1
        self.cluster.notify(path, WatchKind.DATA)

    async def exists(self, path: str) -> NodeStat | None:
        await trio.lowlevel.checkpoint()
        self._live()
        _check_path(path)
        node = self.cluster.nodes.get(path)
        return None if node is None else self._stat(node)

    async def sync(self, path: str) -> None:
        """Nothing to catch up: every session reads the one copy."""
        await trio.lowlevel.checkpoint()
        self._live()
        _check_path(path)

    async def children(self, path: str) -> list[str]:
        await trio.lowlevel.checkpoint()
        self._live()
        return sorted(self._node(path).children)

    @asynccontextmanager
    async def watch(self, path: str, kind: WatchKind) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        self._live()
        _check_path(path)
        if kind is WatchKind.CHILDREN and path not in self.cluster.nodes:
            raise NoNodeError(path)
        send, recv = trio.open_memory_channel[WatchEvent](1)
        self.cluster.watchers[(path, kind)].add(send)
        send.send_nowait(WatchEvent(path, kind))
        try:
            async with recv:
                yield recv
        finally:
            self.cluster.watchers[(path, kind)].discard(send)
            send.close()

    def session_events(self) -> AbstractAsyncContextManager[AsyncIterator[SessionEvent]]:
        return self._sessions.subscribe()

    def expire_session(self) -> None:
        """What a ZooKeeper session expiry does: ephemerals vanish, LOST, then a new session."""
        self.cluster.drop_ephemerals(self._session_id)
        self._sessions.emit(SessionEvent.LOST)
        self._session_id = self.cluster.new_session_id()
        self._sessions.emit(SessionEvent.CONNECTED)

    async def close(self) -> None:
        if self._closed:
            return
        self.cluster.drop_ephemerals(self._session_id)
        self._closed = True
        self._sessions.close()
