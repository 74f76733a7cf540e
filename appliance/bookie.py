"""The bookie: storage, listener and background services under one supervisor.

Start-up: connect to ZooKeeper and check the cluster (layout, instance id); check the
cookies of every directory against the configuration and ZooKeeper's copy; open
storage (replay the journal from the last mark, then checkpoint); start the storage
services, the listener, the admin endpoint, the disk checker and GC; register under
``available/`` (or ``available/readonly/``); then READY=1 to systemd.

Shutdown (``request_stop``, SIGTERM, SIGINT): STOPPING=1; stop accepting and stop reading
requests; let in-flight adds reach the journal and their replies go out (bounded by the
grace period); stop GC and the disk checker; close storage (last group, checkpoint);
deregister; close the ZooKeeper session. A stop during start-up cuts it short (the
journal replay excepted: it ends with its checkpoint) and stops what had started, exit
0; without that a bookie waiting on an unreachable ZooKeeper ignored the stop until its
retries ran out, then exited 1.

A critical service failure (storage: journal or checkpoint I/O) makes the bookie
read-only when ``read_only_mode_enabled``, or stops it with exit code 1.
"""

from __future__ import annotations

import logging
import os
import socket
from functools import partial
from pathlib import Path
from typing import Any

import trio

from ledgerd.appliance.autorecovery import (
    AutoRecoveryStats,
    register_autorecovery_metrics,
    run_autorecovery,
)
from ledgerd.appliance.config import BookieConfig
from ledgerd.appliance.core import BookieCore
from ledgerd.appliance.diskcheck import DiskChecker
from ledgerd.appliance.gc import GarbageCollector
from ledgerd.appliance.handlers import DRAINING, AdminHooks, RequestHandler, ServingState
from ledgerd.appliance.http import AdminHttp
from ledgerd.appliance.hub import ConnectionHub
from ledgerd.appliance.looplag import loop_lag_monitor
from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.appliance.scrubber import Scrubber, register_scrub_metrics
from ledgerd.appliance.sdnotify import notify, watchdog_service
from ledgerd.appliance.security import ConnectionSecurity
from ledgerd.appliance.server import is_loopback, serve_connection
from ledgerd.appliance.session import ConnectionOptions
from ledgerd.appliance.supervisor import Supervisor
from ledgerd.base.logs import fields
from ledgerd.disk.cookie import Cookie
from ledgerd.disk.errors import DiskFullError, StorageError
from ledgerd.disk.storage import LedgerStorage
from ledgerd.metadata.cluster import check_layout, instance_id, read_layout
from ledgerd.metadata.cookies import CookieStore
from ledgerd.metadata.errors import LayoutMismatchError, MetadataError, NoNodeError
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.metadata.registry import BookieRegistry
from ledgerd.metadata.store import MetadataStore
from ledgerd.metadata.underreplication import UnderreplicationManager
from ledgerd.wire.messages import AdminKind

__all__ = ["VERSION", "Bookie"]

log = logging.getLogger(__name__)
VERSION = "ledgerd-bookie 0.1"
DRAIN_GRACE_S = 10.0
METADATA_CHECK_S = 5.0  # how often a bookie looks for its cluster's metadata vanishing


class Bookie:
    """One bookie over the storage and metadata store it is given.

    ``store`` is the cluster's metadata (None: a standalone bookie with no registration,
    cookies only on disk and no ledger GC); the caller opened it and closes it. The
    bookie opens and closes ``storage``.
    """

    def __init__(self, config: BookieConfig, storage: LedgerStorage,
                 store: MetadataStore | None, *, core: BookieCore | None = None) -> None:
        self.config = config
        self.bookie_id = config.effective_bookie_id
        self.storage = storage
        self.state = ServingState()
        self.metrics = BookieMetrics()
        self.autorecovery = AutoRecoveryStats()
        self.store = store
        self.registry: BookieRegistry | None = None
        self.gc = GarbageCollector(self.storage, None, config.gc_options(),
                                   disk_full=lambda: self.disk_checker.full)
        self.scrubber = Scrubber(self.storage, self.bookie_id, config.scrub_options())
        self.disk_checker = DiskChecker(
            self.storage.usage, self._on_disk_change, threshold=config.disk_usage_threshold,
            lwm=config.disk_usage_lwm_threshold, interval_s=config.disk_check_interval_ms / 1000,
            on_dirs=self._on_dirs)
        self.storage.on_disk_full = self._on_storage_full
        self.admin = AdminHooks(trigger=self._admin_trigger, status=self.status,
                                secret=config.admin_token())
        self.handler = RequestHandler(self.storage, self.state, self.metrics, admin=self.admin,
                                      max_frame_bytes=config.max_frame_bytes,
                                      version=VERSION.encode(),
                                      core=core or BookieCore(
                                          recovery_secret=config.cluster_secret()))
        self.http = AdminHttp(self.metrics, self.state, self.admin, host=config.admin_address,
                              port=config.admin_port, metrics_enabled=config.metrics_enabled)
        self.conn_options = ConnectionOptions(
            max_frame_bytes=config.max_frame_bytes,
            max_inflight=config.max_inflight_per_connection,
            max_reply_bytes=config.max_reply_bytes_per_connection,
            idle_timeout=config.connection_idle_timeout_s)
        # TLS files are read now: a bad one stops the start with one line naming it.
        self.security = ConnectionSecurity.from_config(config)
        self.port = config.bookie_port
        self.exit_code = 0
        self.ready = trio.Event()
        self._stop = trio.Event()
        self._start_scope = trio.CancelScope()
        # why this bookie started without its cluster's metadata ("": it did not)
        self.awaiting_metadata = ""
        self._sup: Supervisor | None = None
        self._draining = False
        self._cookie_bytes = b""
        self._cookie_version = -1  # the ZooKeeper cookie's version, for its compare-and-set
        self._readers: set[trio.CancelScope] = set()
        self._listeners: list[trio.SocketListener] = []
        self._accept_scope = trio.CancelScope()
        self._connections_done = trio.Event()
        self._register_metrics()

    # -- life cycle --------------------------------------------------------------------

    def request_stop(self, exit_code: int = 0) -> None:
        if exit_code and not self.exit_code:
            self.exit_code = exit_code
        self._stop.set()
        if not self.ready.is_set():
            # A stop while starting (systemctl stop while ZooKeeper is unreachable, say)
            # cuts the start-up short instead of waiting out its retries and then
            # failing: what did start is stopped as on any stop.
            self._start_scope.cancel()

    def _start_phase(self) -> trio.CancelScope:
        """A cancel scope for one stretch of the start-up; ``request_stop`` cancels it."""
        self._start_scope = trio.CancelScope()
        if self._stop.is_set():
            self._start_scope.cancel()
        return self._start_scope

    async def run(self, *, task_status: trio.TaskStatus[Bookie] = trio.TASK_STATUS_IGNORED) -> int:
        """Run until asked to stop; returns the process exit code."""
        try:
            # Bind first: a bookie that cannot take its port registers nothing, cookie
            # included, and its id (port 0) is known before the cookie names it.
            with self._start_phase():
                await self._bind()
                await self._connect_metadata()
                cookies = await self._cookies()
                # Not cut short by a stop: the replay, which ends with its checkpoint,
                # and ZooKeeper's copy of the cookie it stamps on a first start (a
                # cookie on disk and not in ZooKeeper would refuse the next start).
                with trio.CancelScope(shield=True):
                    check = await self.storage.open(*cookies)
                    if check is not None and self.store is not None \
                            and not self.awaiting_metadata:
                        remote = CookieStore(self.store, self.config.zk_ledgers_root_path)
                        if check.create_remote:
                            await remote.create(self.bookie_id, self._cookie_bytes)
                        elif check.update_remote:  # compare-and-set on the version read
                            await remote.update(self.bookie_id, self._cookie_bytes,
                                                self._cookie_version)
                if check is not None and check.added:
                    log.warning("storage_expanded", extra=fields(
                        bookie_id=self.bookie_id, added=[str(d) for d in check.added]))
            if self._stop.is_set():
                log.warning("bookie_start_interrupted", extra=fields(bookie_id=self.bookie_id))
                task_status.started(self)  # (a caller's nursery.start returns; run ends)
            else:
                await self._serve(task_status)
        finally:
            for listener in self._listeners:
                with trio.CancelScope(shield=True):
                    await listener.aclose()
            self._listeners = []
            with trio.CancelScope(shield=True):
                if not self.storage.closed:
                    try:
                        await self.storage.close()
                    except (StorageError, OSError) as exc:
                        log.error("storage_close_failed", extra=fields(error=repr(exc)))
        return self._stopped()

    async def _serve(self, task_status: trio.TaskStatus[Bookie]) -> None:
        """The services, from the first to READY=1, until asked to stop."""
        async with trio.open_nursery() as root:
            sup = Supervisor(root, on_critical=self._on_critical,
                             on_restart=self._count_restart)
            with self._start_phase():
                await sup.start("storage", self.storage.run, critical=True)
                await sup.start("listener", self._listener, critical=True)
                await sup.start("admin-http", self.http.run)
                await sup.start("disk-checker", self.disk_checker.run)
                await sup.start("gc", self.gc.run)
                self._sup = sup
                if self.registry is not None:
                    if not self.awaiting_metadata:
                        await self._join(sup)
                    await sup.start("metadata-watch", self._metadata_watch)
                await sup.start("watchdog", partial(watchdog_service, self._healthy))
                await sup.start("loop-lag", partial(
                    loop_lag_monitor, self.metrics.loop_lag,
                    warn_after=self.config.event_loop_stall_ms / 1000))
                notify("READY=1")
                self.ready.set()
                log.info("bookie_ready", extra=fields(
                    bookie_id=self.bookie_id, port=self.port,
                    admin_port=self.http.bound_port,
                    replayed=self.storage.replayed_records, read_only=self.state.read_only,
                    tls=("required" if self.security.required else
                         "start_tls" if self.security.tls else "off"),
                    authorization=self.security.authorization))
                task_status.started(self)
            if not self.ready.is_set():
                log.warning("bookie_start_interrupted", extra=fields(
                    bookie_id=self.bookie_id, started=sorted(sup.services)))
                task_status.started(self)
            await self._stop.wait()
            notify("STOPPING=1")
            await self._shutdown(sup)
            root.cancel_scope.cancel()

    def _stopped(self) -> int:
        log.info("bookie_stopped", extra=fields(bookie_id=self.bookie_id,
                                                exit_code=self.exit_code))
        return self.exit_code

    async def _connect_metadata(self) -> None:
        cfg = self.config
        if self.store is None:
            log.warning("no_metadata_store", extra=fields(
                note="zk_servers is empty: no registration, cookies only on disk, no ledger GC"))
            return
        root = cfg.zk_ledgers_root_path
        try:
            layout = await check_layout(self.store, root, cfg.ledger_manager_type)
        except LayoutMismatchError as exc:
            if await read_layout(self.store, root) is not None or not self._local_cookie():
                raise
            # A bookie with data whose cluster's metadata is gone (a ZooKeeper restarted
            # empty, a deleted root, and this bookie restarted meanwhile): it starts
            # anyway, serving reads and its holdings for `metadata rebuild`, without
            # writing anything to ZooKeeper (no cookie, no registration: that would
            # recreate a root the operator restores into) and with GC frozen; it joins
            # once the metadata is back (``_metadata_watch``).
            layout = cfg.ledger_manager_type
            self.awaiting_metadata = str(exc)
            log.error("cluster_metadata_missing", extra=fields(
                bookie_id=self.bookie_id, problem=str(exc), action=(
                    "this bookie starts without registering, serves its data for "
                    "`ledgerd shell metadata rebuild`, and its GC deletes nothing; bring "
                    "the metadata back with `ledgerd shell metadata restore FILE` (a "
                    "snapshot) or `ledgerd shell metadata rebuild --bookies HOST:PORT,... "
                    "--apply`; do not run initnewcluster or format this bookie")))
        self.registry = BookieRegistry(self.store, root)
        self.gc.ledgers = LedgerManager(self.store, root, layout)
        self.scrubber.ledgers = self.gc.ledgers
        self.scrubber.marks = UnderreplicationManager(self.store, root)

    def _local_cookie(self) -> Cookie | None:
        """The cookie stamped in this bookie's directories (the first found), if any."""
        for d in self.storage.all_dirs():
            version = Path(d) / "current" / "VERSION"
            if version.exists():
                return Cookie.from_bytes(version.read_bytes(), str(version))
        return None

    async def _cookies(self) -> tuple[Cookie | None, bytes | None]:
        cfg = self.config
        iid = ""
        remote: bytes | None = None
        if self.store is not None and self.awaiting_metadata:
            local = self._local_cookie()
            assert local is not None
            iid = self.gc.instance_id = local.instance_id  # the data's own cluster
            # the cookie on disk stands in for ZooKeeper's (which is gone with the rest,
            # and put back from it once the metadata is: ``_metadata_watch``)
            remote = local.to_bytes()
        elif self.store is not None:
            iid = await instance_id(self.store, cfg.zk_ledgers_root_path)
            self.gc.instance_id = iid
            got = await CookieStore(self.store, cfg.zk_ledgers_root_path).get(self.bookie_id)
            remote = got[0] if got else None
            self._cookie_version = got[1] if got else -1
        cookie = Cookie(bookie_id=self.bookie_id, journal_dir=cfg.journal_directory,
                        ledger_dirs=tuple(cfg.ledger_directories),
                        index_dirs=tuple(cfg.effective_index_directories), instance_id=iid)
        self._cookie_bytes = cookie.to_bytes()
        return cookie, remote

    async def _shutdown(self, sup: Supervisor) -> None:
        log.info("bookie_stopping", extra=fields(bookie_id=self.bookie_id))
        # 1. No new connections, no new requests; replies still go out.
        self._draining = True
        self._accept_scope.cancel()
        for scope in list(self._readers):
            scope.cancel()
        if "listener" in sup.services:  # (a stop during start-up may come before it)
            with trio.move_on_after(DRAIN_GRACE_S):
                await self._connections_done.wait()
        # 2. Background work that writes.
        for name in ("autorecovery", "scrubber", "gc", "disk-checker"):
            if name in sup.services:
                await sup.stop(name)
        # 3. Last journal group, checkpoint, close.
        await self.storage.close()
        for name in ("storage", "listener", "registration"):  # 4. Leave the cluster.
            if name in sup.services:
                await sup.stop(name)

    def _on_critical(self, name: str, exc: BaseException) -> None:
        if self.config.read_only_mode_enabled and name == "storage":
            self.state.set(True, f"{name} failed: {exc}", storage_failed=True)
            log.error("bookie_read_only", extra=fields(reason=self.state.reason))
        else:
            log.error("bookie_stopping_on_failure", extra=fields(service=name, error=repr(exc)))
            self.request_stop(1)

    def _count_restart(self, name: str) -> None:
        self.metrics.service_restarts[name] = self.metrics.service_restarts.get(name, 0) + 1

    def _admin_trigger(self, kind: AdminKind) -> bool:
        """An admin request: GC or compaction, or read-only / writable (draining before
        a decommission: writers see READ_ONLY and change ensemble themselves, and the
        registration moves to available/readonly). True if it started or changed it."""
        if kind is AdminKind.READ_ONLY:
            self.state.draining = True
            changed = self.state.set(True, DRAINING)
        elif kind is AdminKind.WRITABLE:
            self.state.draining = False
            if self.state.storage_failed or self.disk_checker.full:
                changed = False  # read-only for its own reason: a restart, or room
                if self.state.reason == DRAINING:
                    self.state.reason = "disk full" if self.disk_checker.full else "storage failed"
            else:
                changed = self.state.set(False, "")
        else:
            return self.gc.trigger(kind)
        log.warning("bookie_read_only_by_admin" if self.state.draining
                    else "bookie_writable_by_admin",
                    extra=fields(read_only=self.state.read_only, reason=self.state.reason))
        return changed

    def _on_disk_change(self, full: bool, reason: str) -> None:
        if self.state.storage_failed:
            return
        if full and not self.config.read_only_mode_enabled:
            log.error("disk_full_and_read_only_disabled", extra=fields(reason=reason))
            self.request_stop(1)
            return
        self.state.set(full, reason if full else "")

    def _on_storage_full(self, exc: DiskFullError, began: float) -> None:
        self.disk_checker.force_full(
            f"{exc} (writable again under {self.config.disk_usage_lwm_threshold:.0%} used)",
            began=began)

    def _on_dirs(self, unusable: set[Path], failed: set[Path]) -> None:
        self.storage.set_full_dirs(unusable)
        self.storage.set_failed_dirs(failed)

    def _zk_connected(self) -> bool:
        store = self.store
        return store is not None and bool(getattr(store, "is_connected", True))

    def _healthy(self) -> bool:
        return not self.state.storage_failed

    # -- services ----------------------------------------------------------------------

    async def _bind(self) -> None:
        """Open the listening sockets (``_listener`` serves them)."""
        port = self.port if self.port else self.config.bookie_port
        address = f"{self.config.listen_address}:{port}"
        try:
            self._listeners = await trio.open_tcp_listeners(port, host=self.config.listen_address)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {address}: {exc.strerror}") from exc
        self.port = self._listeners[0].socket.getsockname()[1]
        if not self.config.bookie_id and self.config.bookie_port == 0:
            host = self.config.advertised_address or self.config.listen_address
            self.bookie_id = f"{host}:{self.port}"

    async def _listener(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if not self._listeners:  # a restart of this service binds the same port again
            await self._bind()
        listeners, self._listeners = self._listeners, []
        log.info("listening", extra=fields(address=f"{self.config.listen_address}:{self.port}"))
        open_connections = 0

        async def on_connection(stream: trio.SocketStream) -> None:
            nonlocal open_connections
            open_connections += 1
            self._connections_done = trio.Event() if open_connections == 1 else \
                self._connections_done
            try:
                if open_connections > self.config.max_connections:
                    self.metrics.connections_refused += 1
                    if self.metrics.connections_refused % 1000 == 1:  # one line per 1000
                        log.warning("connection_refused", extra=fields(
                            open=open_connections - 1, max_connections=self.config.max_connections,
                            refused=self.metrics.connections_refused))
                    await stream.aclose()
                    return
                if self.config.server_tcp_no_delay:
                    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                reader_scope = trio.CancelScope()
                if self._draining:
                    reader_scope.cancel()
                self._readers.add(reader_scope)
                try:
                    if hub is not None and isinstance(stream, trio.SocketStream):
                        await hub.serve(stream, trusted=is_loopback(stream),
                                        reader_scope=reader_scope)
                    else:
                        await serve_connection(stream, self.handler, self.conn_options,
                                               reader_scope=reader_scope,
                                               security=self.security)
                finally:
                    self._readers.discard(reader_scope)
            except Exception as exc:  # one connection's bug must not stop the listener
                log.exception("connection_failed", extra=fields(error=repr(exc)))
            finally:
                open_connections -= 1
                if open_connections == 0:
                    self._connections_done.set()

        self._connections_done.set()
        async with trio.open_nursery() as connections:
            hub: ConnectionHub | None = None
            # The hub serves plain TCP only: with TLS or authorization on, every
            # connection gets its own reader and writer (START_TLS upgrades in place).
            secured = (self.security.active or self.security.authorization
                       or bool(self.security.tokens))
            if self.config.connection_hub_enabled and not secured:
                hub = ConnectionHub(self.handler, self.conn_options)
                await connections.start(hub.run)
            with self._accept_scope:
                async with trio.open_nursery() as accept:
                    await accept.start(partial(trio.serve_listeners, on_connection, listeners,
                                               handler_nursery=connections))
                    task_status.started()
            for listener in listeners:
                await listener.aclose()
            await trio.sleep_forever()  # until stopped: connections drain meanwhile

    async def _join(self, sup: Supervisor) -> None:
        """The services that take part in the cluster's metadata: the registration,
        the scrubber (after replay and the first checkpoint: a pass now), autorecovery.
        Started once the metadata is there (a bookie started without it waits)."""
        await sup.start("registration", self._registration)
        await sup.start("scrubber", self.scrubber.run)
        if self.config.auto_recovery_daemon_enabled:
            await sup.start("autorecovery", self._autorecovery)

    async def _registration(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        registry = self.registry
        assert registry is not None
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(registry.keep_registered, self.bookie_id,
                                        self._registration_info, lambda: self.state.read_only))
            task_status.started()
            registered_ro = self.state.read_only
            while True:
                changed = self.state.changed
                if self.state.read_only != registered_ro:
                    registered_ro = self.state.read_only
                    await registry.register(self.bookie_id, self._registration_info(),
                                            read_only=registered_ro)
                    log.info("registration_moved", extra=fields(
                        bookie_id=self.bookie_id, read_only=registered_ro))
                    continue
                await changed.wait()

    async def _metadata_watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                              ) -> None:
        """Service: notice the cluster's metadata vanishing under a running bookie (a
        wiped root, a ZooKeeper started on an empty disk) and come back after a restore
        or rebuild.

        Every ``METADATA_CHECK_S`` (three reads): with no LAYOUT/INSTANCEID under the root, log once
        that the metadata is gone and how to bring it back (the bookie keeps serving
        reads and deletes nothing: GC checks the same); with another instance id (the
        root re-initialised), refuse to register in that cluster; once the root holds
        this bookie's instance again, put back its ZooKeeper cookie from the local one
        if it is missing, and its registration if it is missing. Cancelling leaves
        nothing half done (each step is one idempotent write)."""
        assert self.store is not None and self.registry is not None
        store, registry = self.store, self.registry
        root = self.config.zk_ledgers_root_path
        said = ""
        task_status.started()
        while True:
            await trio.sleep(METADATA_CHECK_S)
            if not getattr(store, "is_connected", True):
                continue
            try:
                problem = await self._metadata_problem()
                if problem:
                    if problem != said:
                        log.error("cluster_metadata_missing", extra=fields(
                            bookie_id=self.bookie_id, problem=problem, action=(
                                "this bookie keeps its data, does not register and its GC "
                                "deletes nothing; bring the metadata back with `ledgerd "
                                "shell metadata restore FILE` (a snapshot) or `ledgerd shell "
                                "metadata rebuild --apply`; do not format this bookie")))
                        said = problem
                    continue
                if said:
                    log.info("cluster_metadata_back", extra=fields(bookie_id=self.bookie_id))
                    said = ""
                if self.awaiting_metadata:
                    # started without metadata: its cookie back, then the registration
                    # service it did not start (which registers at once)
                    cookies = CookieStore(store, root)
                    if await cookies.get(self.bookie_id) is None:
                        await cookies.create(self.bookie_id, self._cookie_bytes)
                        log.warning("cookie_restored", extra=fields(bookie_id=self.bookie_id))
                    assert self._sup is not None
                    await self._join(self._sup)
                    self.awaiting_metadata = ""
                    log.warning("re_registered_after_metadata_loss", extra=fields(
                        bookie_id=self.bookie_id, read_only=self.state.read_only))
                    continue
                ro = self.state.read_only
                if await store.exists(registry.registration_path(self.bookie_id, read_only=ro)) \
                        is not None:
                    continue  # registered: the steady state costs three reads a check
                cookies = CookieStore(store, root)
                if await cookies.get(self.bookie_id) is None:
                    await cookies.create(self.bookie_id, self._cookie_bytes)
                    log.warning("cookie_restored", extra=fields(bookie_id=self.bookie_id))
                if ro == self.state.read_only:  # not moved meanwhile (the other service)
                    await registry.register(self.bookie_id, self._registration_info(),
                                            read_only=ro)
                    log.warning("re_registered_after_metadata_loss", extra=fields(
                        bookie_id=self.bookie_id, read_only=ro))
            except (MetadataError, NoNodeError) as exc:
                log.warning("metadata_watch_failed", extra=fields(error=repr(exc)))

    async def _metadata_problem(self) -> str:
        """Why this bookie cannot take part in the cluster under its root now, or ""."""
        assert self.store is not None
        root = self.config.zk_ledgers_root_path
        if await self.store.exists(f"{root}/LAYOUT") is None:
            return f"no cluster metadata at {root} (LAYOUT is gone)"
        try:
            raw, _ = await self.store.get(f"{root}/INSTANCEID")
        except NoNodeError:
            return f"no INSTANCEID at {root}"
        iid = raw.decode("utf-8", "replace")
        if self.gc.instance_id and iid != self.gc.instance_id:
            return (f"{root} now holds cluster instance {iid}; this bookie's data belongs "
                    f"to {self.gc.instance_id} (re-initialised after a loss?)")
        return ""

    async def _autorecovery(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        assert self.store is not None
        await run_autorecovery(self.store, self.config, self.bookie_id,
                               stats=self.autorecovery, task_status=task_status)

    def _registration_info(self) -> dict[str, Any]:
        return {"bookie_id": self.bookie_id, "port": self.port,
                "host": self.config.advertised_address or self.config.listen_address,
                "admin_port": self.http.bound_port, "version": VERSION, "pid": os.getpid(),
                "rack": self.config.bookie_rack,
                "read_only_reason": self.state.reason if self.state.read_only else ""}

    # -- status and metrics ------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        j = self.storage.journal
        return {
            "bookie_id": self.bookie_id,
            "instance_id": self.gc.instance_id,
            "state": "read_only" if self.state.read_only else "writable",
            "draining": self.state.draining,
            "reason": self.state.reason,
            "storage_failed": self.state.storage_failed,
            "port": self.port,
            "ledgers": len(self.storage.cache.ledgers),
            "journal": {"groups": j.groups_written, "records": j.records_written,
                        "bytes": j.bytes_written, "pending_bytes": j.pending_bytes,
                        "durable": [j.durable.file_id, j.durable.offset]},
            "checkpoints": self.storage.checkpoints,
            "gc": self.gc.status(),
            "scrub": self.scrubber.status(),
            "disk": {"full": self.disk_checker.full, "checks": self.disk_checker.checks,
                     "full_dirs": sorted(map(str, self.disk_checker.verdict.full)),
                     "failed_dirs": sorted(map(str, self.disk_checker.verdict.failed)),
                     "worst": (str(self.disk_checker.worst.path), self.disk_checker.worst.fraction)
                     if self.disk_checker.worst else None},
            "add_latency_p99_s": self.metrics.add_latency.quantile(0.99),
        }

    def _register_metrics(self) -> None:
        m = self.metrics
        j = self.storage.journal
        j.on_group = m.on_journal_group
        cache = self.storage.cache
        m.gauge("ledgerd_journal_queue_bytes", "Journal bytes waiting for the next group.",
                lambda: j.pending_bytes)
        m.counter("ledgerd_journal_zeroed_ahead_bytes", "Journal space zeroed ahead of the "
                  "groups by the background zeroer.", lambda: j.background_zero_bytes)
        m.counter("ledgerd_journal_slow_groups", "Groups that rolled the journal file or "
                  "zeroed ahead for themselves (the zeroer fell behind).",
                  lambda: j.slow_groups)
        m.gauge("ledgerd_bookie_read_only", "1 while the bookie refuses writes.",
                lambda: float(self.state.read_only))
        m.gauge("ledgerd_bookie_ledgers", "Ledgers held.", lambda: len(cache.ledgers))
        # BookKeeper's names for the same facts (existing dashboards and alerts).
        m.gauge("bookie_SERVER_STATUS", "1 writable, 0 read-only (BookKeeper's name).",
                lambda: float(not self.state.read_only))
        m.gauge("bookie_ledgers_count", "Ledgers held (BookKeeper's name).",
                lambda: len(cache.ledgers))
        m.gauge("bookie_journal_JOURNAL_QUEUE_SIZE", "Journal records waiting for the next "
                "group (BookKeeper's name).", lambda: float(j.pending_records))
        ledger_dirs = [Path(d) for d in self.config.ledger_directories]
        m.gauge("bookie_ledger_writable_dirs", "Ledger directories taking new entry logs "
                "(BookKeeper's name).", lambda: float(sum(
                    1 for d in ledger_dirs if d not in self.disk_checker.verdict.unusable)))
        m.gauge("ledgerd_zookeeper_connected", "1 while the bookie holds a ZooKeeper "
                "session (0 without one, or without a metadata store).",
                lambda: float(self._zk_connected()))
        m.counter("ledgerd_ledger_cache_hits", "Index page hits (db storage: locations "
                  "found in memory).", lambda: cache.hits)
        m.counter("ledgerd_ledger_cache_misses", "Index page misses (db storage: lookups "
                  "in the index store).", lambda: cache.misses)
        m.gauge("ledgerd_ledger_cache_pages", "Index pages held in memory (interleaved "
                "storage; at most page_limit; 0 for db storage).",
                lambda: float(getattr(cache, "cached_pages", 0)))
        m.gauge("bookie_NUM_INDEX_PAGES", "Index pages held in memory (BookKeeper's name).",
                lambda: float(getattr(cache, "cached_pages", 0)))
        files = self.storage.open_files
        m.gauge("ledgerd_open_index_files", "Index files open for reading and writing "
                "(least recently used closed past open_file_limit).",
                lambda: float(files.count("idx")))
        m.gauge("ledgerd_open_entry_log_files", "Entry logs open for reading (the one being "
                "written is apart).", lambda: float(files.count("log")))
        storage = self.storage
        storage.on_checkpoint = m.checkpoint_latency.observe
        storage.engine.register_metrics(m)
        m.counter("ledgerd_gc_ledgers_deleted", "Ledgers garbage collected.",
                  lambda: self.gc.ledgers_deleted)
        m.counter("ledgerd_gc_entry_logs_compacted", "Entry logs compacted.",
                  lambda: self.gc.logs_compacted)
        m.counter("ledgerd_gc_entry_logs_deleted", "Dead entry logs deleted.",
                  lambda: self.gc.logs_deleted)
        m.counter("ledgerd_gc_passes", "Garbage collection passes finished.",
                  lambda: self.gc.passes)
        m.counter("ledgerd_gc_seconds", "Time spent in garbage collection passes.",
                  lambda: self.gc.seconds_total)
        m.counter("ledgerd_gc_bytes_reclaimed", "Entry-log bytes freed by GC and compaction.",
                  lambda: self.gc.bytes_reclaimed)
        m.counter("ledgerd_gc_entries_trimmed", "Entries dropped below an unbounded "
                  "ledger's retention start.", lambda: self.gc.entries_trimmed)
        m.counter("ledgerd_compaction_entries_moved", "Live entries copied by compaction.",
                  lambda: self.gc.entries_moved)
        m.gauge("ledgerd_gc_running", "1 while a GC or compaction pass runs.",
                lambda: float(self.gc.running))
        m.gauge("ledgerd_compaction_logs_in_flight", "Entry logs left in the running "
                "compaction pass.", lambda: float(
                    (p.progress.logs_total - p.progress.logs_done) if (p := self.gc.current)
                    else 0))
        logger = self.storage.entry_logger
        m.gauge("ledgerd_entry_logs", "Entry logs on disk.", lambda: len(logger.paths))
        m.gauge("ledgerd_entry_log_bytes", "Bytes of entry logs on disk.",
                lambda: float(logger.disk_bytes()))
        register_autorecovery_metrics(m, self.autorecovery)
        register_scrub_metrics(m, self.scrubber)
