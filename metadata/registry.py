"""Bookie registry: ephemeral nodes under ``<root>/available`` and ``available/readonly``.

A bookie registers after replay and its first checkpoint, moves between writable and
read-only, and deregisters on shutdown. ``keep_registered`` is the bookie's service: it
re-creates the node after a session expiry (the old node vanished with the session).
After a kill -9 the previous process's node lingers until its session times out; a
restart waits for it to vanish rather than failing, up to ``stale_wait``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from ledgerd.base.logs import fields
from ledgerd.metadata.errors import BookieIdInUseError, NodeExistsError, NoNodeError
from ledgerd.metadata.ledger import check_bookie_id
from ledgerd.metadata.store import MetadataStore, SessionEvent, WatchKind

__all__ = ["BookieRegistry", "BookieSet"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BookieSet:
    writable: frozenset[str]
    read_only: frozenset[str]
    # bookie -> rack label from its registration (bookies registered before racks: none)
    racks: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def all(self) -> frozenset[str]:
        return self.writable | self.read_only


class BookieRegistry:
    def __init__(self, store: MetadataStore, root: str = "/ledgers") -> None:
        self.store = store
        self.root = root
        self.available = f"{root}/available"
        self.readonly = f"{root}/available/readonly"

    def _path(self, bookie_id: str, read_only: bool) -> str:
        check_bookie_id(bookie_id)
        return f"{self.readonly if read_only else self.available}/{bookie_id}"

    def registration_path(self, bookie_id: str, *, read_only: bool) -> str:
        """Where ``bookie_id``'s registration lives (writable or read-only list)."""
        return self._path(bookie_id, read_only)

    async def register(self, bookie_id: str, info: dict[str, Any], *, read_only: bool = False,
                       stale_wait: float = 30.0) -> None:
        """Create this bookie's ephemeral node (and remove it from the other list).

        Raises BookieIdInUseError if another live session holds the id for longer than
        ``stale_wait`` seconds.
        """
        path = self._path(bookie_id, read_only)
        other = self._path(bookie_id, not read_only)
        data = json.dumps(info, sort_keys=True).encode()
        with trio.move_on_after(stale_wait) as scope:
            while True:
                try:
                    await self.store.create(path, data, ephemeral=True)
                    break
                except NodeExistsError:
                    try:
                        _, stat = await self.store.get(path)
                    except NoNodeError:
                        continue
                    if stat.ephemeral_owner == self.store.session_id:
                        await self.store.set(path, data)
                        break
                    log.warning("bookie_id_registered_elsewhere", extra=fields(
                        bookie_id=bookie_id, owner=hex(stat.ephemeral_owner)))
                    await trio.sleep(0.5)
        if scope.cancelled_caught:
            raise BookieIdInUseError(
                f"bookie id {bookie_id} is registered by another live session at {path}; "
                "is another bookie running with the same id?")
        await self._remove_own(other)

    async def _remove_own(self, path: str) -> None:
        try:
            _, stat = await self.store.get(path)
        except NoNodeError:
            return
        if stat.ephemeral_owner == self.store.session_id:
            try:
                await self.store.delete(path)
            except NoNodeError:
                pass

    async def unregister(self, bookie_id: str) -> None:
        for ro in (False, True):
            await self._remove_own(self._path(bookie_id, ro))

    async def list_bookies(self, *, with_racks: bool = False) -> BookieSet:
        """Who is registered; ``with_racks`` also reads each registration's rack label
        (one read per bookie)."""
        writable = frozenset(c for c in await self.store.children(self.available)
                             if c != "readonly")
        read_only = frozenset(await self.store.children(self.readonly))
        racks: dict[str, str] = {}
        if with_racks:
            for ro, names in ((False, writable), (True, read_only)):
                for name in names:
                    try:
                        raw, _ = await self.store.get(self._path(name, ro))
                        rack = json.loads(raw or b"{}").get("rack")
                    except (NoNodeError, ValueError, AttributeError):
                        continue
                    if isinstance(rack, str):
                        racks[name] = rack
        return BookieSet(writable, read_only, racks)

    async def registered_pid(self, bookie_id: str, *, read_only: bool | None = None
                             ) -> int | None:
        """The process id a bookie's registration names, or None if it is not registered
        (or names none). After a bookie was killed and started again, its old
        registration stays until ZooKeeper expires the dead process's session; the new
        process registers only then, so the id being listed is not enough.
        ``read_only``: the node in that list only (None: the writable one if any, else
        the read-only one)."""
        try:
            if read_only is None:
                info = await self.bookie_info(bookie_id)
            else:
                raw, _ = await self.store.get(self._path(bookie_id, read_only))
                info = json.loads(raw or b"{}")
        except NoNodeError:
            return None
        pid = info.get("pid") if isinstance(info, dict) else None
        return pid if isinstance(pid, int) else None

    async def registered_as(self, snapshot: BookieSet, bookie_id: str, pid: int | None, *,
                            read_only: bool) -> bool:
        """Whether process ``pid`` is registered in the one list (read-only, or writable)
        and no longer in the other. ``register`` creates the new node before it removes
        the old one, so a bookie moving between the lists is for a moment listed in
        both, the old node still naming its process: that is a move not yet done, not
        the state waited for (a bookie just turned read-only, seen still writable,
        refuses adds). A node in the other list left by another process (killed, its
        session not yet expired) does not count."""
        listed = snapshot.read_only if read_only else snapshot.writable
        if pid is None or bookie_id not in listed:
            return False
        if await self.registered_pid(bookie_id, read_only=read_only) != pid:
            return False
        return await self.registered_pid(bookie_id, read_only=not read_only) != pid

    async def registered_by(self, snapshot: BookieSet, pids: Mapping[str, int | None], *,
                            writable: bool = True) -> bool:
        """Whether every bookie id in ``pids`` is in ``snapshot`` (its writable list, or
        either list if not ``writable``) with a registration naming that process id
        (None, a process not started, never matches): the test for "these processes are
        up", since a killed process's registration is listed until its session expires
        (``registered_pid``). Writable means moved there: not still listed read-only
        by the same process as well (``registered_as``)."""
        listed = snapshot.writable if writable else snapshot.writable | snapshot.read_only
        if not pids.keys() <= listed:
            return False
        for bookie_id, pid in pids.items():
            if writable:
                if not await self.registered_as(snapshot, bookie_id, pid, read_only=False):
                    return False
            elif pid is None or await self.registered_pid(bookie_id) != pid:
                return False
        return True

    async def full_disk_reason(self, snapshot: BookieSet, pids: Mapping[str, int | None]
                               ) -> str | None:
        """The first of ``pids``' processes registered read-only because a disk is full,
        as ``"<bookie id>: <reason>"`` (None if none is): such a bookie turns writable
        only once someone frees space, so a wait for it to be writable should stop."""
        for bookie_id in sorted(pids.keys() & (snapshot.read_only - snapshot.writable)):
            try:
                info = await self.bookie_info(bookie_id)
            except NoNodeError:
                continue
            reason = str(info.get("read_only_reason") or "")
            if info.get("pid") == pids[bookie_id] and ("full" in reason or "space" in reason):
                return f"{bookie_id}: {reason}"
        return None

    async def bookie_info(self, bookie_id: str) -> dict[str, Any]:
        for ro in (False, True):
            try:
                raw, _ = await self.store.get(self._path(bookie_id, ro))
                info: dict[str, Any] = json.loads(raw or b"{}")
                return info
            except NoNodeError:
                continue
        raise NoNodeError(self._path(bookie_id, False))

    @asynccontextmanager
    async def watch_bookies(self, *, with_racks: bool = False
                            ) -> AsyncIterator[AsyncIterator[BookieSet]]:
        """Membership snapshots: one now, then one after every change."""
        send, recv = trio.open_memory_channel[BookieSet](1)

        async def pump(kind_path: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with self.store.watch(kind_path, WatchKind.CHILDREN) as events:
                task_status.started()
                async for _ in events:
                    try:
                        snapshot = await self.list_bookies(with_racks=with_racks)
                    except NoNodeError:
                        # The root was deleted (metadata lost): the last membership
                        # stands until it is back (the watch says when).
                        continue
                    try:
                        send.send_nowait(snapshot)
                    except trio.WouldBlock:
                        # Replace the stale pending snapshot with the fresh one.
                        recv.receive_nowait()
                        send.send_nowait(snapshot)

        async with trio.open_nursery() as nursery:
            await nursery.start(pump, self.available)
            await nursery.start(pump, self.readonly)
            try:
                yield recv
            finally:
                nursery.cancel_scope.cancel()

    async def wait_for(self, done: Callable[[BookieSet], Awaitable[bool]]) -> BookieSet:
        """Wait, on a watch, until ``done(membership)`` holds; returns that membership."""
        async with self.watch_bookies() as snapshots:
            current = await self.list_bookies()  # the watch is armed: no change is missed
            if await done(current):
                return current
            async for snapshot in snapshots:
                if await done(snapshot):
                    return snapshot
        raise AssertionError("bookie watch ended")  # watch_bookies never ends on its own

    async def keep_registered(self, bookie_id: str, info: Callable[[], dict[str, Any]],
                              is_read_only: Callable[[], bool], *,
                              task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Service: register now and again after every session loss, until cancelled.

        If cancelled, the registration is removed (shielded) before returning.
        """
        async with self.store.session_events() as events:
            await self.register(bookie_id, info(), read_only=is_read_only())
            task_status.started()
            try:
                lost = False
                async for event in events:
                    if event is SessionEvent.LOST:
                        lost = True
                        log.warning("registration_lost", extra=fields(bookie_id=bookie_id))
                    elif event is SessionEvent.CONNECTED and lost:
                        lost = False
                        await self.register(bookie_id, info(), read_only=is_read_only())
                        log.info("re_registered", extra=fields(bookie_id=bookie_id))
            finally:
                if not getattr(self.store, "is_connected", True):
                    # Waiting for a session that may not come back would hold up a
                    # stop (SIGTERM, systemd) for the client's whole retry budget; the
                    # registration is ephemeral and goes when ZooKeeper expires it.
                    log.warning("unregister_skipped", extra=fields(
                        bookie_id=bookie_id, reason="ZooKeeper session not connected; the "
                        "registration goes when the session expires"))
                else:
                    with trio.move_on_after(5, shield=True):
                        try:
                            await self.unregister(bookie_id)
                        except Exception as exc:  # the session may be gone already
                            log.warning("unregister_failed", extra=fields(
                                bookie_id=bookie_id, error=repr(exc)))
