"""Process entry for ``ledgerd bookie --conf FILE``: signals, logging, exit codes."""

from __future__ import annotations

import logging
import signal

import trio

from appliance.bookie import Bookie
from appliance.config import BookieConfig
from disk.storage import LedgerStorage
from ledgerd.base.logs import fields
from metadata.store import MetadataStore
from metadata.zookeeper import ZooKeeperStore

__all__ = ["connect_metadata", "run_bookie"]

log = logging.getLogger(__name__)


async def connect_metadata(config: BookieConfig) -> MetadataStore | None:
    """The cluster's metadata store for ``config`` (None when ``zk_servers`` is empty)."""
    if not config.zk_servers:
        return None
    return await ZooKeeperStore.connect(config.zk_servers,
                                        session_timeout=config.zk_timeout_ms / 1000)


async def _main(config: BookieConfig) -> int:
    store = await connect_metadata(config)
    try:
        return await _serve(Bookie(config, LedgerStorage(config.storage_options()), store))
    finally:
        if store is not None:
            with trio.CancelScope(shield=True):
                await store.close()


async def _serve(bookie: Bookie) -> int:
    async with trio.open_nursery() as nursery:
        async def on_signals() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info("signal", extra=fields(signal=signal.Signals(signum).name))
                    bookie.request_stop()
        nursery.start_soon(on_signals)
        code = await bookie.run()
        nursery.cancel_scope.cancel()
    return code


def run_bookie(config: BookieConfig) -> int:
    """Run a bookie until SIGTERM/SIGINT; returns the exit code."""
    return trio.run(_main, config)
