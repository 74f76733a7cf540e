"""The client's configuration (``ledgerd.open_client``): one frozen dataclass.

Declared with ``ledgerd.base.settings`` (loading, validation, defaults file, docs table);
the ZooKeeper keys are the ones the bookie declares too (``metadata.settings``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import ClassVar

from ledgerd.base.bknames import BkName
from ledgerd.base.settings import (
    ConfigError,
    defaults_toml,
    load_config,
    markdown_table,
    setting,
)
from ledgerd.base.tls import client_context
from ledgerd.metadata.settings import ZOOKEEPER_NAMES, ZooKeeperSettings

__all__ = [
    "CLIENT_NAMES",
    "ClientConfig",
    "ConfigError",
    "defaults_toml",
    "load_config",
    "markdown_table",
    "setting",
]


_ONE_LOOP = ("the client runs on the application's trio event loop (SyncClient: one "
             "thread of its own); there is no worker pool to size")

# BookKeeper's client names (seed 001's "BookKeeper Configuration Parameters" and the
# timeouts operators set), read in BookKeeper's units: readTimeout and the *Sec names
# are seconds. readTimeout is BookKeeper's fallback for both the add and the read
# timeout, so it is weak: addEntryTimeoutSec / readEntryTimeoutSec in the same file win.
CLIENT_NAMES: tuple[BkName, ...] = (
    *ZOOKEEPER_NAMES,
    BkName(name="readTimeout", key="read_timeout_ms", also=("add_entry_timeout_ms",),
           unit="s", scale=1000.0, weak=True,
           note="BookKeeper's fallback for both timeouts: addEntryTimeoutSec and "
                "readEntryTimeoutSec win"),
    BkName(name="readEntryTimeoutSec", key="read_timeout_ms", unit="s", scale=1000.0),
    BkName(name="addEntryTimeoutSec", key="add_entry_timeout_ms", unit="s", scale=1000.0),
    BkName(name="clientConnectTimeoutMillis", key="connect_timeout_ms", unit="ms"),
    BkName(name="throttle", key="throttle", unit="adds/s"),
    BkName(name="speculativeReadTimeout", key="speculative_read_timeout_ms", unit="ms"),
    BkName(name="explicitLacInterval", key="explicit_lac_interval_ms", unit="ms"),
    BkName(name="nettyMaxFrameSizeBytes", key="max_frame_bytes", unit="bytes"),
    BkName(name="recoveryReadBatchSize", key="recovery_read_window", unit="entries"),
    BkName(name="reorderReadSequenceEnabled", key="reorder_read_sequence_enabled"),
    BkName(name="digestType", key="digest_type",
           values=(("CRC32", "crc32"), ("CRC32C", "crc32c"), ("MAC", "hmac"),
                   ("DUMMY", "dummy"), ("hmac", "hmac"))),
    BkName(name="clientTrustStore", key="tls_trust_path", note="PEM CA certificates"),
    BkName(name="clientKeyStore", key="tls_key_path", note="a PEM private key"),
    BkName(name="tlsHostnameVerificationEnabled", key="tls_hostname_verification"),
    BkName(name="tlsEnabledProtocols", key="tls_enabled_protocols"),
    BkName(name="numWorkerThreads", why=_ONE_LOOP),
    BkName(name="numIOThreads", why=_ONE_LOOP),
    BkName(name="clientTcpNoDelay",
           why="bookie connections always set TCP_NODELAY (a replicated add waits for "
               "its acks; Nagle would only add latency)"),
    BkName(name="ledgerManagerType",
           why="the client reads the cluster's layout from its metadata in ZooKeeper "
               "(the bookie's ledger_manager_type sets it)"),
    BkName(name="passwd",
           why="ledgerd's recovery and admin tools authenticate with the cluster secret "
               "(cluster_secret_file), not with one password for every ledger"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig(ZooKeeperSettings):
    """Settings of a ledgerd client (``ledgerd.open_client``)."""

    bookkeeper_names: ClassVar[tuple[BkName, ...]] = CLIENT_NAMES

    ensemble_size: int = setting(
        3, bk="(BookKeeper.createLedger argument)", minimum=1, maximum=1024,
        doc="Default ensemble size E for new ledgers.")
    write_quorum_size: int = setting(
        2, bk="(BookKeeper.createLedger argument)", minimum=1, maximum=1024,
        doc="Default write quorum Qw for new ledgers.")
    ack_quorum_size: int = setting(
        2, bk="(BookKeeper.createLedger argument)", minimum=1, maximum=1024,
        doc="Default ack quorum Qa for new ledgers.")
    digest_type: str = setting(
        "crc32c", bk="digestType", choices=("crc32c", "crc32", "hmac", "dummy"),
        doc="Default digest type of new ledgers.")
    add_entry_timeout_ms: int = setting(
        5000, bk="addEntryTimeoutSec", minimum=10, maximum=3600000,
        doc="An add not acknowledged by a bookie within this time triggers an ensemble change.")
    read_timeout_ms: int = setting(
        5000, bk="readTimeout", minimum=10, maximum=3600000,
        doc="A read not answered within this time moves to the next replica.")
    connect_timeout_ms: int = setting(
        10000, bk="clientConnectTimeoutMillis", minimum=10, maximum=600000,
        doc="TCP connect timeout to a bookie.")
    throttle: int = setting(
        5000, bk="throttle", minimum=0,
        doc="Maximum adds per second per ledger handle (0 = unlimited).")
    speculative_read_timeout_ms: int = setting(
        2000, bk="speculativeReadTimeout", minimum=0,
        doc="Send a read to the next replica if the first has not answered in this time (0 = off).")
    explicit_lac_interval_ms: int = setting(
        200, bk="explicitLacInterval", minimum=0,
        doc="Write the LAC explicitly to bookies when a ledger is idle this long, so "
            "readers see the last entry within about this time (0 = off: the last entry "
            "stays invisible until another follows; BookKeeper's default).")
    max_frame_bytes: int = setting(
        8 * 1024 * 1024, bk="nettyMaxFrameSizeBytes", minimum=1024, maximum=1 << 30,
        doc="Largest frame sent or accepted on a bookie connection.")
    max_inflight_per_bookie: int = setting(
        10000, bk="(ledgerd)", minimum=1,
        doc="Requests in flight on one bookie connection before sends wait.")
    recovery_read_window: int = setting(
        128, bk="recoveryReadBatchSize", minimum=1, maximum=65536,
        doc="Entries whose recovery reads are in flight at once while a recovery reads "
            "forward (1 = one entry per round trip).")
    unbounded_fragment_entries: int = setting(
        100000, bk="(ledgerd: unbounded ledgers)", minimum=0,
        doc="An unbounded ledger's writer opens a new fragment on a fresh ensemble once "
            "the current one holds this many entries (0 = only on failures); fragments "
            "are the unit of retention (trim) and of spreading load.")
    reorder_read_sequence_enabled: bool = setting(
        True, bk="reorderReadSequenceEnabled",
        doc="Read first from the replicas that have failed least recently.")
    tls_trust_path: str = setting(
        "", bk="clientTrustStore (PEM)",
        doc="PEM CA certificates the bookies' certificates must chain to; set, it turns "
            "TLS on: every bookie connection starts with START_TLS.")
    tls_certificate_path: str = setting(
        "", bk="clientKeyStore (PEM)",
        doc="PEM certificate chain this client presents (mutual TLS; its OU 0:roles "
            "gives its roles where bookies authorize).")
    tls_key_path: str = setting(
        "", bk="clientKeyStore (PEM)", doc="PEM private key of tls_certificate_path.")
    tls_hostname_verification: bool = setting(
        True, bk="tlsHostnameVerificationEnabled",
        doc="Check a bookie's certificate names the host (or IP address) of its id; "
            "BookKeeper's default is false, ledgerd's true.")
    tls_enabled_protocols: str = setting(
        "TLSv1.2,TLSv1.3", bk="tlsEnabledProtocols",
        doc="TLS versions allowed (comma list; the lowest and highest named count).")

    auth_token_file: str = setting(
        "", bk="(ledgerd)",
        doc="File holding this client's token (its first line): every bookie connection "
            "authenticates with it (AUTH, after START_TLS), for bookies that authorize "
            "by principal without client certificates.")

    def auth_token(self) -> bytes | None:
        """The token of auth_token_file, or None."""
        return read_token_file("auth_token_file", self.auth_token_file)

    def tls_context(self) -> ssl.SSLContext | None:
        """The client TLS context, or None when tls_trust_path is empty (plaintext)."""
        if not self.tls_trust_path:
            return None
        return client_context(self.tls_trust_path, certificate=self.tls_certificate_path,
                              key=self.tls_key_path,
                              verify_hostname=self.tls_hostname_verification,
                              protocols=self.tls_enabled_protocols)

    def __post_init__(self) -> None:
        if self.tls_certificate_path and not self.tls_trust_path:
            raise ConfigError("tls_certificate_path", self.tls_certificate_path,
                              "tls_trust_path set as well (a client certificate is for TLS)")
        if not (self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size >= 1):
            raise ConfigError(
                "ensemble_size/write_quorum_size/ack_quorum_size",
                (self.ensemble_size, self.write_quorum_size, self.ack_quorum_size),
                "ensemble_size >= write_quorum_size >= ack_quorum_size >= 1",
            )


def read_token_file(key: str, path: str) -> bytes | None:
    """The token in the first line of ``path`` (the setting ``key``), or None when the
    setting is empty; ConfigError naming the setting when it cannot be read."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except OSError as exc:
        raise ConfigError(key, path, f"a readable file ({exc.strerror})") from None
    if not token:
        raise ConfigError(key, path, "a file whose first line is the token")
    return token.encode()
