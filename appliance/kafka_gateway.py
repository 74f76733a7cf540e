"""``ledgerd gateway --conf F``: the Kafka gateway as a supervised process (systemd
notify, SIGTERM/SIGINT stop); the gateway itself is ``ledgerd.kafka.gateway``."""

from __future__ import annotations

import logging

import trio

from ledgerd.appliance.handlers import AdminHooks, ServingState
from ledgerd.appliance.http import AdminHttp
from ledgerd.appliance.sdnotify import notify, wait_stop_signal, watchdog_service
from ledgerd.base.principals import load_principals
from ledgerd.client import open_client
from ledgerd.kafka.config import GatewayConfig
from ledgerd.kafka.gateway import serve_gateway

__all__ = ["run_gateway"]

log = logging.getLogger("ledgerd.kafka.gateway")


async def _gateway_main(config: GatewayConfig) -> int:
    async with open_client(config=config) as client:
        async with trio.open_nursery() as nursery:
            gw = await nursery.start(serve_gateway, client, config)
            admin = ""
            if config.gateway_admin_port >= 0:
                hooks = AdminHooks(trigger=lambda _kind: False, status=gw.status)
                http = AdminHttp(gw.metrics, ServingState(), hooks,
                                 host=config.gateway_admin_address,
                                 port=config.gateway_admin_port)
                await nursery.start(http.run)
                admin = (f", metrics http://{config.gateway_admin_address}:"
                         f"{http.bound_port}/metrics")
            nursery.start_soon(watchdog_service, lambda: True)  # pings from the event loop
            notify("READY=1")
            print(f"kafka gateway on {config.gateway_host}:{gw.port} (node {gw.node_id})"
                  f"{admin}", flush=True)
            await wait_stop_signal()
            notify("STOPPING=1")
            nursery.cancel_scope.cancel()
    return 0


def run_gateway(config: GatewayConfig) -> int:
    """``ledgerd gateway --conf F``: serve Kafka clients until SIGTERM or SIGINT. The
    files the configuration names are checked first (one line naming a bad one), before
    anything connects."""
    if config.gateway_principals_file:
        load_principals(config.gateway_principals_file, "gateway_principals_file")
    config.tls_server_context()
    config.tls_context()
    config.auth_token()
    return trio.run(_gateway_main, config)
