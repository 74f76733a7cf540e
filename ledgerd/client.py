"""The client: ``open_client`` connects to ZooKeeper and hands out ledger handles.

::

    async with ledgerd.open_client("127.0.0.1:2181") as client:
        async with await client.create_ledger(3, 2, 2, password=b"pw") as lh:
            await lh.append(b"hello")
        async with await client.open_ledger(lh.ledger_id, password=b"pw") as rh:
            async for entry in rh.read():
                print(entry.entry_id, entry.payload)

One client holds one ZooKeeper session, one connection per bookie (``BookiePool``), and
a watch on bookie membership that placement reads. ``client.logs`` reaches the
cluster's logs of ledgers (``ledgerd.ledgerlog.Logs``). Handles run their background work
(add timeouts, explicit LAC) in the client's nursery; closing the client ends them.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from ledgerd.base.logs import fields
from ledgerd.bookie_client import Connect, tcp_connect
from ledgerd.bookies import BookiePool, PoolOptions
from ledgerd.config import ClientConfig, ConfigError, load_config
from ledgerd.errors import (
    BadPasswordError,
    LedgerClosedError,
    LedgerdError,
    NoSuchLedgerError,
    single_exception,
)
from ledgerd.handles import ClientServices, ReadHandle, WriteHandle
from ledgerd.ledgerlog import Logs
from ledgerd.machines.changes import ClosedChangeError
from ledgerd.machines.placement import Placement, adheres, choose_ensemble
from ledgerd.machines.quorum import check_quorums
from ledgerd.metadata.cluster import check_layout
from ledgerd.metadata.errors import NoNodeError
from ledgerd.metadata.ledger import LedgerMetadata, password_check
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.metadata.registry import BookieRegistry, BookieSet
from ledgerd.metadata.store import MetadataStore
from ledgerd.metrics import ClientMetrics
from ledgerd.pipeline import SendFlusher
from ledgerd.reads import LedgerView
from ledgerd.recovery import recover_ledger, take_over
from ledgerd.wire.entry import Digester, DigestType, master_key

__all__ = ["Client", "open_client"]

log = logging.getLogger(__name__)


def _password_bytes(password: bytes | str) -> bytes:
    return password.encode() if isinstance(password, str) else bytes(password)


class Client:
    def __init__(self, config: ClientConfig, store: MetadataStore, nursery: trio.Nursery,
                 layout: str, rng: random.Random | None = None, *,
                 connect: Connect = tcp_connect) -> None:
        self.config = config
        self.store = store
        self.nursery = nursery
        root = config.zk_ledgers_root_path
        self.ledgers = LedgerManager(store, root, layout)
        self.registry = BookieRegistry(store, root)
        self.rng = rng or random.Random()
        self.metrics = ClientMetrics()
        self.pool = BookiePool(nursery, PoolOptions(
            connect_timeout=config.connect_timeout_ms / 1000,
            max_inflight=config.max_inflight_per_bookie,
            max_frame_bytes=config.max_frame_bytes,
            reorder_reads=config.reorder_read_sequence_enabled,
            tls=config.tls_context(), auth_token=config.auth_token()), connect=connect)
        self._bookies: BookieSet | None = None
        self._bookies_seen = trio.Event()
        self.flusher = SendFlusher()  # batches the write handles' sends per loop pass
        nursery.start_soon(self.flusher.run)
        # What handles use of the client (they never see the client itself).
        self.services = ClientServices(
            config=config, pool=self.pool, nursery=nursery, flusher=self.flusher,
            metrics=self.metrics, ledgers=self.ledgers, rng=self.rng,
            writable_bookies=self.writable_bookies, placement=self.placement)
        self.logs = Logs(self)  # the cluster's logs of ledgers (ledgerd.ledgerlog)

    # -- membership --------------------------------------------------------------------

    async def _watch_bookies(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with self.registry.watch_bookies(with_racks=True) as snapshots:
            task_status.started()
            async for snapshot in snapshots:
                self._bookies = snapshot
                self._bookies_seen.set()

    async def bookies(self) -> BookieSet:
        """The current membership (writable and read-only), as the watch last saw it."""
        await self._bookies_seen.wait()
        assert self._bookies is not None
        return self._bookies

    async def writable_bookies(self) -> set[str]:
        return set((await self.bookies()).writable)

    async def placement(self) -> Placement:
        """The registered bookies' rack labels, for rack-aware placement."""
        return Placement((await self.bookies()).racks)

    # -- ledgers -----------------------------------------------------------------------

    async def create_ledger(self, ensemble_size: int | None = None,
                            write_quorum: int | None = None, ack_quorum: int | None = None, *,
                            digest: str | None = None, password: bytes | str = b"",
                            compression: str | None = None,
                            custom_metadata: Mapping[str, str] | None = None,
                            _unbounded: bool = False) -> WriteHandle:
        """Create a ledger on E random writable bookies and return its write handle.

        Raises ValueError unless ``E >= Qw >= Qa >= 1``, and NotEnoughBookiesError
        (naming how many were needed and found) when too few bookies are writable.
        """
        cfg = self.config
        e = cfg.ensemble_size if ensemble_size is None else ensemble_size
        qw = cfg.write_quorum_size if write_quorum is None else write_quorum
        qa = cfg.ack_quorum_size if ack_quorum is None else ack_quorum
        check_quorums(e, qw, qa)
        digest_type = DigestType(digest or cfg.digest_type)
        if compression not in (None, "zstd"):
            raise ValueError(f"compression must be None or 'zstd', got {compression!r}")
        key = master_key(_password_bytes(password))
        writable = await self.writable_bookies()
        placement = await self.placement()
        ensemble = choose_ensemble(writable, e, self.rng, avoid=self.pool.recent_failures(),
                                   write_quorum=qw, placement=placement)
        racks = placement.distinct(writable)
        if racks > 1 and not adheres(ensemble, qw, placement, racks):
            log.warning("placement_not_rack_aware", extra=fields(
                ensemble=",".join(ensemble), racks=racks,
                reason="too few writable bookies on distinct racks for every write set"))
        md = LedgerMetadata(
            ensemble_size=e, write_quorum=qw, ack_quorum=qa, ensembles=((0, ensemble),),
            digest_type=digest_type.value, password_check=password_check(key),
            compression=compression, ctime_ms=int(time.time() * 1000),
            custom_metadata=dict(custom_metadata or {}),
            unbounded=_unbounded, term=1 if _unbounded else 0)
        lid, version = await self.ledgers.create(md)
        log.info("ledger_created", extra=fields(ledger=lid, ensemble=",".join(ensemble),
                                                e=e, qw=qw, qa=qa))
        view = self._view(lid, md, Digester(digest_type, _password_bytes(password)))
        return WriteHandle(self.services, lid, md, version, view, key)

    async def create_unbounded_ledger(self, ensemble_size: int | None = None,
                                      write_quorum: int | None = None,
                                      ack_quorum: int | None = None, *,
                                      digest: str | None = None, password: bytes | str = b"",
                                      custom_metadata: Mapping[str, str] | None = None,
                                      ) -> WriteHandle:
        """Create an unbounded ledger at term 1 and return its writer.

        It never needs closing: it grows fragment by fragment (``unbounded_fragment_entries``
        per fragment), old fragments are dropped with ``trim_ledger``, and another client
        becomes its writer with ``take_over_ledger`` (this one then gets
        LeadershipLostError)."""
        handle = await self.create_ledger(ensemble_size, write_quorum, ack_quorum,
                                          digest=digest, password=password,
                                          custom_metadata=custom_metadata, _unbounded=True)
        return handle

    async def take_over_ledger(self, ledger_id: int, password: bytes | str = b"",
                               ) -> WriteHandle:
        """Become the writer of an unbounded ledger: raise its term, recover its tail in
        that term, and return a write handle appending after it.

        Raises LeadershipLostError if another client raised the term meanwhile,
        LedgerClosedError for a CLOSED ledger, BadPasswordError, LedgerRecoveryError
        (too few bookies answered; the ledger stays IN_RECOVERY: take over again)."""
        md, _ = await self._read_metadata(ledger_id)
        if not md.unbounded:
            raise LedgerdError(f"ledger {ledger_id} is not unbounded; open_ledger recovers "
                               "and closes a bounded ledger")
        pw = _password_bytes(password)
        key = master_key(pw)
        if md.password_check and md.password_check != password_check(key):
            raise BadPasswordError(ledger_id)
        digester = Digester(DigestType(md.digest_type), pw)
        cfg = self.config
        try:
            got = await take_over(self.ledgers, self.pool, ledger_id, key, digester,
                                  read_timeout=cfg.read_timeout_ms / 1000,
                                  add_timeout=cfg.add_entry_timeout_ms / 1000,
                                  writable=self.writable_bookies, rng=self.rng,
                                  read_window=cfg.recovery_read_window)
        except ClosedChangeError as exc:
            raise LedgerClosedError(ledger_id, str(exc)) from exc
        view = self._view(ledger_id, got.md, digester)
        return WriteHandle(self.services, ledger_id, got.md, got.version, view, key,
                           last_add_confirmed=got.last_entry_id, length=got.length)

    async def trim_ledger(self, ledger_id: int, before_entry: int) -> LedgerMetadata:
        """Drop an unbounded ledger's whole fragments whose entries all precede
        ``before_entry`` (retention); returns the new metadata. Bookies reclaim the
        space of trimmed entries at their next GC pass."""
        md, _ = await self.ledgers.update(ledger_id, lambda m: m.trimmed_before(before_entry))
        log.info("ledger_trimmed", extra=fields(ledger=ledger_id, start=md.start_entry,
                                                fragments=len(md.ensembles)))
        return md

    def _view(self, lid: int, md: LedgerMetadata, digester: Digester) -> LedgerView:
        cfg = self.config
        return LedgerView(lid, md, digester, self.pool,
                          read_timeout=cfg.read_timeout_ms / 1000,
                          speculative_timeout=cfg.speculative_read_timeout_ms / 1000,
                          max_entry_bytes=cfg.max_frame_bytes)

    async def _read_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        try:
            return await self.ledgers.read(ledger_id)
        except NoNodeError:
            raise NoSuchLedgerError(ledger_id) from None

    async def open_ledger(self, ledger_id: int, password: bytes | str = b"", *,
                          recovery: bool = True) -> ReadHandle:
        """Open for reading. With ``recovery`` (the default) an open ledger is fenced,
        its end found and the ledger CLOSED first, so the old writer can add nothing
        more; without it, the metadata is read as it is and ``read_lac`` /
        ``wait_lac_beyond`` follow a ledger still being written.

        If cancelled during recovery, the ledger stays IN_RECOVERY with its bookies
        fenced and some entries maybe rewritten; the next ``open_ledger`` recovers it
        again from the start (recovery is idempotent).
        """
        md, version = await self._read_metadata(ledger_id)
        pw = _password_bytes(password)
        key = master_key(pw)
        if md.password_check and md.password_check != password_check(key):
            raise BadPasswordError(ledger_id)
        digester = Digester(DigestType(md.digest_type), pw)
        if recovery and not md.is_closed and md.unbounded:
            raise LedgerdError(f"ledger {ledger_id} is unbounded: it is never recovered to a "
                               "close; read it with recovery=False, or write it with "
                               "take_over_ledger")
        if recovery and not md.is_closed:
            cfg = self.config
            md, version = await recover_ledger(
                self.ledgers, self.pool, ledger_id, key, digester,
                read_timeout=cfg.read_timeout_ms / 1000,
                add_timeout=cfg.add_entry_timeout_ms / 1000,
                writable=self.writable_bookies, rng=self.rng,
                read_window=cfg.recovery_read_window)
        return ReadHandle(self.services, ledger_id, md, version,
                          self._view(ledger_id, md, digester))

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete the ledger's metadata; bookies drop its data at their next GC."""
        try:
            await self.ledgers.delete(ledger_id)
        except NoNodeError:
            raise NoSuchLedgerError(ledger_id) from None
        log.info("ledger_deleted", extra=fields(ledger=ledger_id))

    def metrics_collector(self) -> ClientMetrics:
        """A Prometheus collector of this client's metrics (``ledgerd.metrics``); asking
        for it turns the latency histograms on. Register it in the application's
        registry: ``prometheus_client.REGISTRY.register(client.metrics_collector())``."""
        return self.metrics.collector()

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return (await self._read_metadata(ledger_id))[0]

    async def list_ledgers(self) -> AsyncIterator[int]:
        async for lid in self.ledgers.iter_ledger_ids():
            yield lid

    async def aclose(self) -> None:
        self.pool.close()
        self.nursery.cancel_scope.cancel()


async def _check_default_zookeeper(servers: str) -> None:
    """When no one named a ZooKeeper (no argument, no LEDGERD_ZK_SERVERS) and nothing
    listens at the default, fail at once saying how to name one, rather than after the
    session timeout."""
    from ledgerd.metadata.errors import MetadataUnavailableError

    host, _, port = servers.partition("/")[0].split(",")[0].rpartition(":")
    try:
        with trio.fail_after(2):
            stream = await trio.open_tcp_stream(host or "127.0.0.1", int(port))
        await stream.aclose()
    except (OSError, ValueError, trio.TooSlowError):
        raise MetadataUnavailableError(
            servers, "nothing listens there, and no ZooKeeper was named: pass "
            "open_client(zk_servers) or export LEDGERD_ZK_SERVERS (`ledgerd local` prints "
            "its ZooKeeper; eval \"$(ledgerd local ctl env)\" exports it)") from None


@asynccontextmanager
async def open_client(zk_servers: str | None = None, *, config: ClientConfig | None = None,
                      rng: random.Random | None = None, store: MetadataStore | None = None,
                      connect: Connect = tcp_connect,
                      **settings: Any) -> AsyncIterator[Client]:
    """Connect to the cluster at ``zk_servers``; settings are ClientConfig keys (over
    ``LEDGERD_*`` environment variables and the defaults).

    ``store`` lets tests pass an in-memory metadata store instead of ZooKeeper, and
    ``connect`` memory streams instead of TCP. Leaving the block closes every handle
    (appends still pending fail) and the connections; if cancelled, the same holds.
    """
    import os

    unnamed = (config is None and zk_servers is None and "zk_servers" not in settings
               and not os.environ.get("LEDGERD_ZK_SERVERS"))
    if config is None:
        if zk_servers is not None:
            settings["zk_servers"] = zk_servers
        config = load_config(ClientConfig, overrides=settings)
    elif settings or zk_servers is not None:
        raise ConfigError("open_client", None, "pass either config= or settings, not both")
    own_store = store is None
    if store is None:
        from ledgerd.metadata.zookeeper import ZooKeeperStore
        if unnamed:
            await _check_default_zookeeper(config.zk_servers)
        store = await ZooKeeperStore.connect(config.zk_servers,
                                             session_timeout=config.zk_timeout_ms / 1000,
                                             connect_timeout=config.zk_timeout_ms / 1000,
                                             credentials=config.zk_credentials(),
                                             secure=config.zk_enable_security)
    try:
        layout = await check_layout(store, config.zk_ledgers_root_path)
        try:
            async with trio.open_nursery() as nursery:
                client = Client(config, store, nursery, layout, rng, connect=connect)
                await nursery.start(client._watch_bookies)
                try:
                    yield client
                finally:
                    await client.aclose()
        except BaseExceptionGroup as group:
            raise single_exception(group) from None
    finally:
        if own_store:
            with trio.CancelScope(shield=True):
                await store.close()
