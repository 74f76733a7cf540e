"""Process entry for ``ledgerd bookie --conf FILE``: signals, logging, exit codes."""

from __future__ import annotations

import logging
import signal

import trio

from appliance.bookie import Bookie
from appliance.config import BookieConfig
from ledgerd.logs import fields

__all__ = ["run_bookie"]

log = logging.getLogger(__name__)


async def _main(config: BookieConfig) -> int:
    bookie = Bookie(config)
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
