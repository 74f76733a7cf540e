"""One ``SyncClient`` per Python worker process and cluster, reused across tasks.

Spark reuses Python workers between tasks (``spark.python.worker.reuse``), so the
ZooKeeper session and bookie connections a task opens serve the next one too. Clients
close when the process exits.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Mapping

from ledgerd.spark.options import client_config
from ledgerd.sync import SyncClient

__all__ = ["client_for", "close_clients"]

_lock = threading.Lock()
_clients: dict[tuple[tuple[str, str], ...], SyncClient] = {}


def client_for(options: Mapping[str, str]) -> SyncClient:
    """The process's client for these client options (``zk``, ``client.*``)."""
    key = tuple(sorted(options.items()))
    with _lock:
        client = _clients.get(key)
        if client is None or client.closed:
            client = _clients[key] = SyncClient(config=client_config(options))
        return client


@atexit.register
def close_clients() -> None:
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        try:
            client.close()
        except Exception:  # best effort: the process is ending
            pass
