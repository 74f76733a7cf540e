"""The ZooKeeper settings, declared once for every process that talks to the cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ledgerd.base.bknames import BkName, metadata_service_uri
from ledgerd.base.settings import ConfigError, setting

__all__ = ["ZOOKEEPER_NAMES", "ZooKeeperSettings"]


def _servers(value: object) -> dict[str, object]:
    """zkServers as a comma string (a TOML list of host:port is joined)."""
    if isinstance(value, (list, tuple)):
        return {"zk_servers": ",".join(str(v).strip() for v in value)}
    return {"zk_servers": str(value).strip()}


# BookKeeper's names for these keys (ledgerd.base.bknames). metadataServiceUri wins over
# zkServers and zkLedgersRootPath when a file has both, as in BookKeeper.
ZOOKEEPER_NAMES: tuple[BkName, ...] = (
    BkName(name="zkServers", key="zk_servers", weak=True, convert=_servers,
           note="comma list of host:port; metadataServiceUri wins"),
    BkName(name="metadataServiceUri", key="zk_servers",
           also=("zk_ledgers_root_path", "ledger_manager_type"), convert=metadata_service_uri,
           note="zk+LAYOUT://h1:2181;h2:2181/ROOT: the hosts, the root znode and the "
                "layout"),
    BkName(name="zkTimeout", key="zk_timeout_ms", unit="ms"),
    BkName(name="zkLedgersRootPath", key="zk_ledgers_root_path", weak=True,
           note="metadataServiceUri's path wins"),
    BkName(name="zkEnableSecurity", key="zk_enable_security"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ZooKeeperSettings:
    """Where the cluster's metadata lives (the bookie's and the client's first keys)."""

    bookkeeper_names: ClassVar[tuple[BkName, ...]] = ZOOKEEPER_NAMES

    zk_servers: str = setting(
        "127.0.0.1:2181", bk="zkServers",
        doc="ZooKeeper connection string, host:port[,host:port...][/chroot].")
    zk_timeout_ms: int = setting(
        10000, bk="zkTimeout", minimum=1000, maximum=600000,
        doc="ZooKeeper session timeout in milliseconds.")
    zk_ledgers_root_path: str = setting(
        "/ledgers", bk="zkLedgersRootPath", doc="Root znode of the cluster's metadata.")
    zk_enable_security: bool = setting(
        False, bk="zkEnableSecurity",
        doc="Create every znode with an ACL that gives all rights to the digest user of "
            "zk_digest_auth_file and nothing to anyone else (BookKeeper's CREATOR_ALL_ACL). "
            "`ledgerd shell zkacl --apply` moves an existing cluster over.")
    zk_digest_auth_file: str = setting(
        "", bk="(JAAS Client section)",
        doc="File holding user:password for ZooKeeper digest authentication; the session "
            "authenticates with it when set (needed to read a secured cluster).")

    def zk_credentials(self) -> tuple[str, str] | None:
        """(user, password) from zk_digest_auth_file, or None when it is empty."""
        if not self.zk_digest_auth_file:
            if self.zk_enable_security:
                raise ConfigError("zk_enable_security", True,
                                  "zk_digest_auth_file set (the user the ACLs name)")
            return None
        try:
            text = open(self.zk_digest_auth_file, encoding="utf-8").read().strip()
        except OSError as exc:
            raise ConfigError("zk_digest_auth_file", self.zk_digest_auth_file,
                              f"a readable file ({exc.strerror})") from None
        user, sep, password = text.partition(":")
        if not sep or not user or not password or "\n" in text:
            raise ConfigError("zk_digest_auth_file", self.zk_digest_auth_file,
                              "one line user:password")
        return user, password
