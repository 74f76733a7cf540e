"""The ZooKeeper settings, declared once for every process that talks to the cluster."""

from __future__ import annotations

from dataclasses import dataclass

from ledgerd.base.settings import setting

__all__ = ["ZooKeeperSettings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ZooKeeperSettings:
    """Where the cluster's metadata lives (the bookie's and the client's first keys)."""

    zk_servers: str = setting(
        "127.0.0.1:2181", bk="metadataServiceUri / zkServers",
        doc="ZooKeeper connection string, host:port[,host:port...][/chroot].")
    zk_timeout_ms: int = setting(
        10000, bk="zkTimeout", minimum=1000, maximum=600000,
        doc="ZooKeeper session timeout in milliseconds.")
    zk_ledgers_root_path: str = setting(
        "/ledgers", bk="zkLedgersRootPath", doc="Root znode of the cluster's metadata.")
