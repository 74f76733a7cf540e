"""Process entry for ``ledgerd bookie --conf FILE``: signals, logging, exit codes."""

from __future__ import annotations

import gc
import logging
import signal
import time
from functools import partial

import trio

from ledgerd.appliance.bookie import Bookie
from ledgerd.appliance.config import BookieConfig
from ledgerd.base.logs import fields
from ledgerd.base.settings import ConfigError
from ledgerd.disk.storage import LedgerStorage
from ledgerd.metadata.store import MetadataStore
from ledgerd.metadata.zookeeper import ZooKeeperStore
from ledgerd.native import faults as native_faults

__all__ = ["connect_metadata", "run_autorecovery_process", "run_bookie", "settle_heap"]

log = logging.getLogger(__name__)


async def connect_metadata(config: BookieConfig) -> MetadataStore | None:
    """The cluster's metadata store for ``config`` (None when ``zk_servers`` is empty).

    Gives up after ``zk_timeout_ms`` (as BookKeeper and Kafka do) with one error naming
    the servers; kazoo's own retry warnings are held back meanwhile (they would precede
    that line with a dozen of its own)."""
    if not config.zk_servers:
        return None
    timeout = config.zk_timeout_ms / 1000
    kazoo_log = logging.getLogger("kazoo.client")
    level = kazoo_log.level
    kazoo_log.setLevel(logging.CRITICAL)
    try:
        return await ZooKeeperStore.connect(config.zk_servers, session_timeout=timeout,
                                            connect_timeout=timeout,
                                            credentials=config.zk_credentials(),
                                            secure=config.zk_enable_security)
    finally:
        kazoo_log.setLevel(level)


async def _main(config: BookieConfig) -> int:
    # Signals are taken from the first step: a stop while ZooKeeper is being reached
    # ends the start there, exit 0 (not the default SIGTERM death or a SIGINT traceback).
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        bookie: Bookie | None = None
        connecting = trio.CancelScope()

        async def on_signals() -> None:
            async for signum in signals:
                log.info("signal", extra=fields(signal=signal.Signals(signum).name))
                if bookie is None:
                    connecting.cancel()
                else:
                    bookie.request_stop()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(on_signals)
            store = None
            with connecting:
                if config.zk_servers:
                    log.info("metadata_connecting", extra=fields(
                        servers=config.zk_servers, timeout_ms=config.zk_timeout_ms))
                store = await connect_metadata(config)
            if connecting.cancelled_caught:
                log.warning("bookie_start_interrupted", extra=fields(step="connect_metadata"))
                nursery.cancel_scope.cancel()
                return 0
            try:
                bookie = Bookie(config, LedgerStorage(config.storage_options()), store)
                code = await _serve(bookie)
            finally:
                if store is not None:
                    with trio.CancelScope(shield=True):
                        await store.close()
            nursery.cancel_scope.cancel()
        return code


async def _serve(bookie: Bookie) -> int:
    async with trio.open_nursery() as nursery:
        async def settle_heap_when_ready() -> None:
            await bookie.ready.wait()
            settle_heap()
        nursery.start_soon(settle_heap_when_ready)
        code = await bookie.run()
        nursery.cancel_scope.cancel()
    return code


def settle_heap() -> None:
    """Collect once, then move every object the process holds into the collector's
    permanent generation (``gc.freeze``): modules, classes, the started services.

    A full collection walks every tracked object, and a bookie holds ~45,000 after
    start-up: each one that ran while serving stopped the event loop for tens of
    milliseconds, which under load lands in the add latency's tail. Frozen objects are never walked again; what serving
    creates is collected as before. The process's own objects only: a library leaves
    its host's heap alone, so the client does not do this."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info("heap_settled", extra=fields(frozen=gc.get_freeze_count(),
                                          seconds=round(time.perf_counter() - started, 4)))


def run_bookie(config: BookieConfig) -> int:
    """Run a bookie until SIGTERM/SIGINT; returns the exit code."""
    native_faults.install_from_env()  # only with LEDGERD_FAULT_PLAN set (fault tests)
    return trio.run(_main, config)


async def _autorecovery_main(config: BookieConfig, worker_id: str) -> int:
    from dataclasses import asdict

    from ledgerd.appliance.autorecovery import (
        AutoRecoveryStats,
        register_autorecovery_metrics,
        require_secret,
        run_autorecovery,
    )
    from ledgerd.appliance.handlers import AdminHooks, ServingState
    from ledgerd.appliance.http import AdminHttp
    from ledgerd.appliance.metrics import BookieMetrics
    from ledgerd.appliance.sdnotify import notify, wait_stop_signal, watchdog_service
    from ledgerd.appliance.supervisor import leaves

    require_secret(config)  # a missing or bad secret is a one-line error before connecting
    store = await connect_metadata(config)
    if store is None:
        raise ConfigError("zk_servers", "", "a ZooKeeper connection string: autorecovery "
                          "works on the cluster's metadata")
    stats = AutoRecoveryStats()
    metrics = BookieMetrics()
    register_autorecovery_metrics(metrics, stats)
    hooks = AdminHooks(trigger=lambda _kind: False,
                       status=lambda: {"autorecovery": worker_id, **{
                           k: v for k, v in asdict(stats).items() if k != "marked_event"}},
                       secret=config.admin_secret)
    http = AdminHttp(metrics, ServingState(), hooks, host=config.admin_address,
                     port=config.admin_port, metrics_enabled=config.metrics_enabled)
    stopping = False
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(http.run)
            await nursery.start(partial(run_autorecovery, store, config, worker_id,
                                        stats=stats))
            nursery.start_soon(partial(watchdog_service, lambda: True))
            notify("READY=1")
            log.info("autorecovery_ready", extra=fields(worker=worker_id,
                                                        admin_port=http.bound_port))
            await wait_stop_signal()
            notify("STOPPING=1")
            stopping = True
            nursery.cancel_scope.cancel()
    except Exception as raised:
        # Copies the stop cut short may fail as they are cancelled (appliance.supervisor):
        # one line, exit 0, as a bookie's autorecovery service stops.
        if not stopping:
            raise
        errors = leaves(raised)
        log.warning("autorecovery_stopped_with_error", extra=fields(
            worker=worker_id, error=repr(errors[0]), errors=len(errors)))
    finally:
        with trio.CancelScope(shield=True):
            await store.close()
    return 0


def run_autorecovery_process(config: BookieConfig, worker_id: str) -> int:
    """``ledgerd autorecovery --conf F``: auditor candidacy and workers until SIGTERM."""
    return trio.run(_autorecovery_main, config, worker_id)
