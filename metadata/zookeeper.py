"""The ZooKeeper MetadataStore, over kazoo: the only module that imports kazoo.

kazoo is blocking, so every call runs in a worker thread through
``trio.to_thread.run_sync`` under a capacity limiter. A change runs with
``abandon_on_cancel=False``: a cancelled caller waits for the call it started, so no
node is written behind its back. A read is abandoned on cancel (its thread finishes
within ``operation_timeout`` and holds its limiter slot until then), so a stop with
ZooKeeper gone does not wait out a read in flight. Each call is bounded by ``operation_timeout`` (kazoo's sync calls can
otherwise wait forever while disconnected). A lost connection is retried with backoff a
bounded number of times, then raises MetadataUnavailableError naming the servers.

Watch and state callbacks run on kazoo's own thread; they never block it: each one hands
an event to trio with ``TrioToken.run_sync_soon`` into a bounded memory channel, where a
full channel means a notification is already pending (watches coalesce).
"""

from __future__ import annotations

import logging
import random
import socket
import warnings
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, TypeVar

import trio
from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

from ledgerd.base.logs import fields
from ledgerd.metadata.errors import (
    BadServersError,
    BadVersionError,
    MetadataError,
    MetadataUnavailableError,
    NodeExistsError,
    NoNodeError,
    NotAuthorizedError,
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

# A chroot that does not exist yet is normal here (a new cluster's, created on init);
# what matters is reported by check_layout, in one line.
warnings.filterwarnings("ignore", message="No chroot path exists", category=UserWarning)

__all__ = ["ZooKeeperStore"]

log = logging.getLogger(__name__)
# A library must not print on an application's stderr: without a handler of the
# application's own, kazoo's warnings ("Connection dropped: socket connection broken")
# went to Python's last-resort handler. The CLI and the bookie route them through their
# own logging (configure_logging); an application that configures logging sees them.
logging.getLogger("kazoo").addHandler(logging.NullHandler())
T = TypeVar("T")

_RETRYABLE = (kz.ConnectionLoss, kz.OperationTimeoutError, KazooTimeoutError)
_STATES = {KazooState.CONNECTED: SessionEvent.CONNECTED,
           KazooState.SUSPENDED: SessionEvent.SUSPENDED,
           KazooState.LOST: SessionEvent.LOST}


def _stat(zstat: Any) -> NodeStat:
    return NodeStat(zstat.version, zstat.ephemeralOwner, zstat.ctime, zstat.numChildren)


class ZooKeeperStore:
    """One kazoo session. Open with :meth:`connect`; end with :meth:`close`."""

    def __init__(self, client: KazooClient, servers: str, token: trio.lowlevel.TrioToken, *,
                 operation_timeout: float, retries: int) -> None:
        self._client = client
        self._servers = servers
        self._token = token
        self._op_timeout = operation_timeout
        self._retries = retries
        self._limiter = trio.CapacityLimiter(16)
        self._sessions = SessionFanout()
        self._closed = False
        self._rng = random.Random()
        client.add_listener(self._on_state)

    @classmethod
    async def connect(cls, servers: str, *, session_timeout: float = 10.0,
                      connect_timeout: float = 15.0, operation_timeout: float = 10.0,
                      retries: int = 5, credentials: tuple[str, str] | None = None,
                      secure: bool = False) -> ZooKeeperStore:
        """Open a session to ``servers`` (``host:port,...[/chroot]``).

        With ``credentials`` (user, password) the session authenticates by digest; with
        ``secure`` too, every node it creates gets an ACL giving all rights to that user
        and none to anyone else. Raises MetadataUnavailableError naming the servers if no
        session is established within ``connect_timeout``. If cancelled, the
        half-started client is stopped.
        """
        await trio.to_thread.run_sync(check_servers, servers, abandon_on_cancel=True)
        extra: dict[str, Any] = {}
        if credentials is not None:
            user, password = credentials
            extra["auth_data"] = [("digest", f"{user}:{password}")]
            if secure:
                extra["default_acl"] = [make_digest_acl(user, password, all=True)]
        elif secure:
            raise ValueError("secure ZooKeeper ACLs need credentials")
        client = KazooClient(hosts=servers, timeout=session_timeout,
                             logger=logging.getLogger("kazoo.client"), **extra)
        try:
            # kazoo's ``start`` waits in a thread a cancel cannot reach for the whole
            # timeout (a bookie asked to stop while ZooKeeper is away ignored SIGTERM
            # that long): start the client, then wait for its session where a cancel
            # can leave (the client is stopped below either way).
            live = await trio.to_thread.run_sync(client.start_async)
            if not await trio.to_thread.run_sync(live.wait, connect_timeout,
                                                 abandon_on_cancel=True) \
                    or not client.connected:
                raise KazooTimeoutError("Connection time-out")
        except (KazooTimeoutError, kz.KazooException, OSError) as exc:
            await trio.to_thread.run_sync(_stop_client, client)
            raise MetadataUnavailableError(servers, f"no session within {connect_timeout}s "
                                           f"({type(exc).__name__})") from exc
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_stop_client, client)
            raise
        return cls(client, servers, trio.lowlevel.current_trio_token(),
                   operation_timeout=operation_timeout, retries=retries)

    @property
    def session_id(self) -> int:
        cid = self._client.client_id
        return int(cid[0]) if cid else 0

    @property
    def session_password(self) -> bytes:
        cid = self._client.client_id
        return bytes(cid[1]) if cid else b""

    @property
    def servers(self) -> str:
        return self._servers

    @property
    def is_connected(self) -> bool:
        """True while the session is connected (not suspended, lost or closed)."""
        return bool(self._client.connected) and not self._closed

    # -- the bridge -------------------------------------------------------------------

    async def _call(self, what: str, path: str, fn: Callable[[], T], *,
                    retry: bool = True, read: bool = False) -> T:
        if self._closed:
            raise SessionExpiredError("store closed")
        delay = 0.05
        attempts = self._retries if retry else 1
        for attempt in range(1, attempts + 1):
            try:
                return await trio.to_thread.run_sync(fn, abandon_on_cancel=read,
                                                     limiter=self._limiter)
            except kz.NoNodeError:
                raise NoNodeError(path) from None
            except kz.NodeExistsError:
                raise NodeExistsError(path) from None
            except kz.BadVersionError:
                raise BadVersionError(path, -1) from None
            except kz.NotEmptyError:
                raise NotEmptyError(path) from None
            except (kz.NoAuthError, kz.AuthFailedError):
                raise NotAuthorizedError(path) from None
            except kz.SessionExpiredError as exc:
                raise SessionExpiredError(f"{what} {path}: session expired") from exc
            except kz.NoChildrenForEphemeralsError as exc:
                raise MetadataError(f"ephemeral node cannot have children: {path}") from exc
            except _RETRYABLE as exc:
                if attempt == attempts:
                    raise MetadataUnavailableError(
                        self._servers, f"{what} {path} failed {attempts} times: "
                        f"{type(exc).__name__}") from exc
                log.warning("zookeeper_retry", extra=fields(
                    op=what, path=path, attempt=attempt, error=type(exc).__name__))
                await trio.sleep(delay * (0.5 + self._rng.random()))
                delay = min(delay * 2, 2.0)
            except kz.ConnectionClosedError as exc:
                raise SessionExpiredError(f"{what} {path}: client closed") from exc
            except kz.KazooException as exc:
                # Any other answer (a marshalling or server-side error): still a
                # MetadataError, so no kazoo type reaches the callers.
                raise MetadataError(f"{what} {path}: ZooKeeper failed the call: "
                                    f"{exc!r}") from exc
        raise AssertionError("unreachable")

    # -- operations ---------------------------------------------------------------------

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
                     sequential: bool = False, make_parents: bool = False) -> str:
        """Create a node. A create retried after a lost reply that finds its own node
        (same data, persistent) counts as success."""
        c, t = self._client, self._op_timeout
        retried = False

        def run() -> str:
            nonlocal retried
            try:
                result = c.create_async(path, data, ephemeral=ephemeral, sequence=sequential,
                                        makepath=make_parents).get(timeout=t)
            except kz.NodeExistsError:
                if retried and not ephemeral and not sequential:
                    existing, _ = c.get_async(path).get(timeout=t)
                    if existing == data:
                        return path
                raise
            except _RETRYABLE:
                retried = True
                raise
            return str(result)

        # Sequential creates are not retried: a lost reply may have made a node already.
        return await self._call("create", path, run, retry=not sequential)

    async def set_acl(self, path: str, secure: bool) -> None:
        """Give ``path`` this session's digest-only ACL (``secure``) or the open one."""
        c, t = self._client, self._op_timeout
        acl = list(c.default_acl) if secure else list(OPEN_ACL_UNSAFE)
        if secure and acl == list(OPEN_ACL_UNSAFE):
            raise ValueError("this session has no digest ACL (zk_enable_security)")

        def run() -> None:
            c.set_acls_async(path, acl).get(timeout=t)

        await self._call("set_acl", path, run)

    async def get_acl(self, path: str) -> list[str]:
        """The ACL of ``path`` as ``scheme:id:perms`` strings (tests, the migration)."""
        c, t = self._client, self._op_timeout

        def run() -> list[str]:
            acls, _ = c.get_acls_async(path).get(timeout=t)
            return [f"{a.id.scheme}:{a.id.id}:{a.perms}" for a in acls]

        return await self._call("get_acl", path, run, read=True)

    async def get(self, path: str) -> tuple[bytes, NodeStat]:
        c, t = self._client, self._op_timeout

        def run() -> tuple[bytes, NodeStat]:
            data, zstat = c.get_async(path).get(timeout=t)
            return bytes(data or b""), _stat(zstat)

        return await self._call("get", path, run, read=True)

    async def set(self, path: str, data: bytes, version: int = -1) -> NodeStat:
        """Write data. If an attempt's reply was lost and the retry then conflicts, the
        node is re-read: holding our data at ``version + 1`` means our write landed."""
        c, t = self._client, self._op_timeout
        retried = False

        def run() -> NodeStat:
            nonlocal retried
            try:
                return _stat(c.set_async(path, data, version).get(timeout=t))
            except kz.BadVersionError:
                if retried and version >= 0:
                    current, zstat = c.get_async(path).get(timeout=t)
                    if current == data and zstat.version == version + 1:
                        return _stat(zstat)
                raise
            except _RETRYABLE:
                retried = True
                raise

        try:
            return await self._call("set", path, run)
        except BadVersionError:
            raise BadVersionError(path, version) from None

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        c, t = self._client, self._op_timeout
        if recursive:
            for child in await self.children(path):
                await self.delete(f"{path.rstrip('/')}/{child}", recursive=True)
        try:
            await self._call("delete", path, lambda: c.delete_async(path, version).get(timeout=t))
        except BadVersionError:
            raise BadVersionError(path, version) from None

    async def exists(self, path: str) -> NodeStat | None:
        c, t = self._client, self._op_timeout

        def run() -> NodeStat | None:
            zstat = c.exists_async(path).get(timeout=t)
            return None if zstat is None else _stat(zstat)

        return await self._call("exists", path, run, read=True)

    async def multi(self, ops: Sequence[Op]) -> None:
        """ZooKeeper's multi-op transaction (kazoo's ``transaction``); the failing op's
        error names that op's path."""
        if not ops:
            return
        c, t = self._client, self._op_timeout

        def run() -> None:
            tx = c.transaction()
            for op in ops:
                if isinstance(op, Check):
                    tx.check(op.path, op.version)
                elif isinstance(op, Create):
                    tx.create(op.path, op.data)
                elif isinstance(op, SetData):
                    tx.set_data(op.path, op.data, op.version)
                else:
                    tx.delete(op.path, op.version)
            results = tx.commit_async().get(timeout=t)
            for op, result in zip(ops, results, strict=False):
                if not isinstance(result, Exception) or isinstance(result, kz.RolledBackError):
                    continue
                version = -1 if isinstance(op, Create) else op.version
                if isinstance(result, kz.NoNodeError):
                    raise NoNodeError(op.path)
                if isinstance(result, kz.NodeExistsError):
                    raise NodeExistsError(op.path)
                if isinstance(result, kz.BadVersionError):
                    raise BadVersionError(op.path, version)
                if isinstance(result, kz.NotEmptyError):
                    raise NotEmptyError(op.path)
                raise result
            if any(isinstance(r, Exception) for r in results):  # rolled back, no cause
                raise MetadataError(f"multi on {ops[0].path}: rolled back: {results!r}")

        await self._call("multi", ops[0].path, run)

    async def sync(self, path: str) -> None:
        c, t = self._client, self._op_timeout

        def run() -> None:
            c.sync_async(path).get(timeout=t)

        await self._call("sync", path, run)

    async def children(self, path: str) -> list[str]:
        c, t = self._client, self._op_timeout
        return await self._call("children", path,
                                lambda: sorted(c.get_children_async(path).get(timeout=t)),
                                read=True)

    async def advance_sequence(self, parent: str, at_least: int, *, batch: int = 500) -> int:
        """Move ``parent``'s sequential-child counter to ``at_least`` or beyond (a
        restored tree's id generator): ephemeral sequential nodes created and deleted in
        transactions of ``batch``. Returns the next number the counter gives (at least:
        where it stands is read from the names of the nodes made, never assumed; a
        delete does not move the counter, and the number of creates needed is not
        guessed from it)."""
        c, t = self._client, self._op_timeout

        def step(n: int) -> int:
            tx = c.transaction()
            for _ in range(n):
                tx.create(f"{parent}/ID-", b"", ephemeral=True, sequence=True)
            made = tx.commit_async().get(timeout=t)
            bad = [r for r in made if isinstance(r, Exception)]
            if bad:
                raise bad[0]
            tx = c.transaction()
            for node in made:
                tx.delete(node)
            tx.commit_async().get(timeout=t)
            return max(int(str(node).rsplit("-", 1)[1]) for node in made) + 1

        current = await self._call("advance_sequence", parent, partial(step, 1), retry=False)
        while current < at_least:
            n = max(1, min(batch, at_least - current))
            current = await self._call("advance_sequence", parent, partial(step, n),
                                       retry=False)
        return current

    # -- bulk operations (restore and rebuild) -------------------------------------------

    def _pipeline(self, starts: Sequence[tuple[str, Callable[[], Any]]], window: int,
                  results: list[Any] | None = None) -> list[MetadataError | None]:
        """Runs in one worker thread: start each request (kazoo's ``*_async``), keeping
        ``window`` in flight on the session, and collect each outcome in order (the
        replies into ``results`` if given). ZooKeeper applies one session's requests in
        the order sent."""
        t = self._op_timeout
        out: list[MetadataError | None] = [None] * len(starts)
        pending: deque[tuple[int, str, Any]] = deque()

        def finish() -> None:
            i, path, result = pending.popleft()
            try:
                got = result.get(timeout=t)
                if results is not None:
                    results[i] = got
            except kz.NoNodeError:
                out[i] = NoNodeError(path)
            except kz.NodeExistsError:
                out[i] = NodeExistsError(path)
            except kz.BadVersionError:
                out[i] = BadVersionError(path, -1)
            except (kz.NoAuthError, kz.AuthFailedError):
                out[i] = NotAuthorizedError(path)
            except (*_RETRYABLE, kz.ConnectionClosedError, kz.SessionExpiredError) as exc:
                out[i] = MetadataUnavailableError(self._servers, f"{path}: "
                                                  f"{type(exc).__name__}")
            else:
                if isinstance(got, list):  # a transaction: the first failed op says why
                    bad = next((r for r in got if isinstance(r, Exception)
                                and not isinstance(r, kz.RolledBackError)), None)
                    if bad is not None:
                        out[i] = (BadVersionError(path, -1)
                                  if isinstance(bad, kz.BadVersionError)
                                  else MetadataError(f"{path}: {type(bad).__name__}"))

        for i, (path, start) in enumerate(starts):
            if len(pending) >= window:
                finish()
            pending.append((i, path, start()))
        while pending:
            finish()
        return out

    async def read_many(self, paths: Sequence[str], *, window: int = 256, chunk: int = 2000
                        ) -> list[tuple[bytes, NodeStat, list[str]] | None]:
        """Each node's data, stat and (when it has any) sorted children, pipelined
        (``window`` requests in flight, one worker thread per ``chunk``); None for a
        node that does not exist (or went away between its two reads). Raises the
        first other error. If cancelled, nothing changed."""
        c = self._client
        out: list[tuple[bytes, NodeStat, list[str]] | None] = []
        for i in range(0, len(paths), chunk):
            part = paths[i:i + chunk]
            got: list[Any] = [None] * len(part)
            errors = await self._call("read_many", part[0], partial(
                self._pipeline, [(p, partial(c.get_async, p)) for p in part], window, got),
                retry=False)
            parents = [k for k, (err, g) in enumerate(zip(errors, got, strict=True))
                       if err is None and g[1].numChildren]
            kids: list[Any] = [None] * len(parents)
            kid_errors = await self._call("read_many", part[0], partial(
                self._pipeline, [(part[k], partial(c.get_children_async, part[k]))
                                 for k in parents], window, kids), retry=False)
            children = {k: sorted(names) for k, names, err
                        in zip(parents, kids, kid_errors, strict=True) if err is None}
            for k, (err, g) in enumerate(zip(errors, got, strict=True)):
                if isinstance(err, NoNodeError):
                    out.append(None)
                elif err is not None:
                    raise err
                else:
                    out.append((bytes(g[0] or b""), _stat(g[1]), children.get(k, [])))
        return out

    async def create_many(self, nodes: Sequence[tuple[str, bytes]], *, window: int = 256,
                          chunk: int = 2000) -> list[MetadataError | None]:
        """Create persistent nodes (parents must exist), pipelined: ``window`` requests
        in flight, one worker thread per ``chunk``. Returns, per node in order, None
        (created) or the error (NodeExistsError, NoNodeError for a missing parent,
        MetadataUnavailableError: the node may or may not exist). Nothing is retried.
        If cancelled, the chunk under way completes; later ones are not sent."""
        c = self._client
        out: list[MetadataError | None] = []
        for i in range(0, len(nodes), chunk):
            starts = [(path, partial(c.create_async, path, data))
                      for path, data in nodes[i:i + chunk]]
            out += await self._call("create_many", nodes[i][0],
                                    partial(self._pipeline, starts, window), retry=False)
        return out

    async def raise_versions(self, nodes: Sequence[tuple[str, bytes, int, int]], *,
                             batch: int = 1000, window: int = 64, chunk: int = 2000
                             ) -> list[MetadataError | None]:
        """Bring each node ``(path, data, version_now, version_wanted)`` to its wanted
        version, ending with ``data``: transactions of up to ``batch`` compare-and-set
        writes each (every write moves the version by one; a transaction's writes but
        its last are empty, so no reader sees a value the node never had), pipelined
        ``window`` transactions at a time. A node written by anyone else meanwhile gets
        BadVersionError. Returns per node None or the error. If cancelled, a node may
        stand at a version between its two (holding ``data``)."""
        c = self._client

        def txn(path: str, data: bytes, first: int, count: int) -> Any:
            tx = c.transaction()
            for k in range(count):
                tx.set_data(path, data if k == count - 1 else b"", version=first + k)
            return tx.commit_async()

        out: list[MetadataError | None] = [None] * len(nodes)
        starts: list[tuple[str, Callable[[], Any]]] = []
        owner: list[int] = []

        async def flush() -> None:
            got = await self._call("raise_versions", starts[0][0],
                                   partial(self._pipeline, list(starts), window), retry=False)
            for i, err in zip(owner, got, strict=True):
                if err is not None and out[i] is None:
                    out[i] = err
            starts.clear()
            owner.clear()

        for i, (path, data, have, want) in enumerate(nodes):
            while have < want:
                count = min(batch, want - have)
                starts.append((path, partial(txn, path, data, have, count)))
                owner.append(i)
                have += count
            if len(starts) >= chunk:
                await flush()
        if starts:
            await flush()
        return out

    # -- watches and session events ------------------------------------------------------

    def _hand_to_trio(self, fn: Callable[[], None]) -> None:
        """Runs on kazoo's thread: schedule ``fn`` in trio and return at once."""
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError:
            pass

    @asynccontextmanager
    async def watch(self, path: str, kind: WatchKind) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        send, recv = trio.open_memory_channel[WatchEvent](1)
        active = True

        def deliver() -> None:
            if not active:
                return
            try:
                send.send_nowait(WatchEvent(path, kind))
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                pass

        def on_change(*_args: Any) -> bool:
            # Returning False tells the kazoo recipe to stop watching.
            if not active:
                return False
            self._hand_to_trio(deliver)
            return True

        c = self._client

        gone = False

        def on_node(_data: Any, stat: Any, *_args: Any) -> bool:
            # kazoo's ChildrenWatch stops silently when its node is deleted (a wiped
            # root): a DataWatch on the same node says so, and arms a new ChildrenWatch
            # when the node is created again (a restore), each time with a notification.
            nonlocal gone
            if not active:
                return False
            if stat is None and not gone:
                gone = True
                self._hand_to_trio(deliver)
            elif stat is not None and gone:
                gone = False
                ChildrenWatch(c, path, func=on_change)
                self._hand_to_trio(deliver)
            return True

        def arm() -> None:
            if kind is WatchKind.DATA:
                DataWatch(c, path, func=on_change)
            else:
                if c.exists(path) is None:
                    raise kz.NoNodeError(path)
                ChildrenWatch(c, path, func=on_change)
                DataWatch(c, path, func=on_node)

        await self._call("watch", path, arm)
        try:
            async with recv:
                yield recv
        finally:
            active = False
            send.close()

    def _on_state(self, state: Any) -> None:
        """kazoo state listener (kazoo's thread): fan the event out in trio."""
        event = _STATES.get(state)
        if event is None:
            return

        def deliver() -> None:
            if self._closed:
                return  # our own close ends the session: nothing was lost
            log.info("zookeeper_session", extra=fields(state=event.value,
                                                       servers=self._servers))
            self._sessions.emit(event)

        self._hand_to_trio(deliver)

    def session_events(self) -> AbstractAsyncContextManager[AsyncIterator[SessionEvent]]:
        return self._sessions.subscribe()

    async def close(self) -> None:
        """End the session; ephemeral nodes vanish. Safe to call twice; shielded."""
        if self._closed:
            return
        self._closed = True
        self._sessions.close()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_stop_client, self._client)


def check_servers(servers: str) -> None:
    """Raise BadServersError for a connection string that cannot work: an empty one, a
    port that is not a number in 1-65535, a chroot not starting with "/", or no host
    that resolves (blocking: name resolution; call it in a thread). Without this a
    port out of range ended in kazoo's ValueError traceback and an unknown host in a
    session timeout that named neither."""
    hosts, slash, chroot = servers.partition("/")
    if not hosts.strip():
        raise BadServersError(servers, "no host:port given")
    if slash and not chroot.strip():
        raise BadServersError(servers, "an empty chroot after '/'")
    unresolved = []
    resolved = 0
    several = "," in hosts
    for item in hosts.split(","):
        item = item.strip()
        where = f"{item!r}: " if several else ""
        host, sep, port_text = item.rpartition(":")
        if not sep or "]" in port_text:
            host, port_text = item, "2181"
        host = host.strip("[]")
        if not host:
            raise BadServersError(servers, f"{item!r} has no host")
        try:
            port = int(port_text)
        except ValueError:
            raise BadServersError(servers, f"{where}the port {port_text!r} is not a "
                                           "number") from None
        if not 1 <= port <= 65535:
            raise BadServersError(servers, f"{where}port {port} is out of range 1-65535")
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            resolved += 1
        except (socket.gaierror, UnicodeError):
            unresolved.append(host)
    if not resolved:
        raise BadServersError(servers, "cannot resolve " + ", ".join(map(repr, unresolved)))


def _stop_client(client: KazooClient) -> None:
    try:
        client.stop()
    finally:
        client.close()
