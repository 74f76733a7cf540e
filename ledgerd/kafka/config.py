"""The Kafka gateway's configuration: the client's keys (ZooKeeper, quorums, TLS to the
bookies) plus the gateway's own, in one file (``ledgerd gateway --conf F``)."""

from __future__ import annotations

import ssl
import zlib
from dataclasses import dataclass

from ledgerd.base.settings import ConfigError, setting
from ledgerd.base.tls import server_context
from ledgerd.config import ClientConfig, read_token_file

__all__ = ["SASL_MECHANISMS", "GatewayConfig"]

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayConfig(ClientConfig):
    """Settings of ``ledgerd gateway``."""

    gateway_host: str = setting(
        "127.0.0.1", bk="(Kafka: listeners)", doc="Address the gateway listens on.")
    gateway_port: int = setting(
        9092, bk="(Kafka: listeners)", minimum=0, maximum=65535,
        doc="Port the gateway listens on (0 = any free port).")
    advertised_host: str = setting(
        "", bk="(Kafka: advertised.listeners)",
        doc="Host name clients are told to connect to (empty = gateway_host).")
    gateway_admin_address: str = setting(
        "127.0.0.1", bk="(ledgerd: admin_address)",
        doc="Address of the gateway's HTTP endpoint (/metrics, /status, /health).")
    gateway_admin_port: int = setting(
        8001, bk="(ledgerd: admin_port)", minimum=-1, maximum=65535,
        doc="Port of that endpoint (0 = any free port, -1 = none).")
    node_id: int = setting(
        -1, bk="(Kafka: node.id)", minimum=-1, maximum=2**31 - 1,
        doc="This gateway's broker id in Metadata (-1 = derived from its advertised "
            "host and port).")
    gateway_rack: str = setting(
        "", bk="(Kafka: broker.rack)",
        doc="The rack (or availability zone) this gateway is in, told to clients in "
            "Metadata and DescribeCluster; with gateway_rack_aware_reads, consumers "
            "that say their client.rack are sent to a gateway in their rack for reads.")
    gateway_rack_aware_reads: bool = setting(
        False, bk="(Kafka: replica.selector.class=RackAwareReplicaSelector)",
        doc="Fetch from follower (KIP-392): a consumer whose client.rack is not the "
            "partition leader's rack is told to fetch from a live gateway in its rack "
            "(preferred read replica), which serves the partition's acknowledged "
            "records from the bookies up to what it has learnt is acknowledged.")
    default_partitions: int = setting(
        1, bk="(Kafka: num.partitions)", minimum=1, maximum=10000,
        doc="Partitions of a topic created automatically or without a count.")
    auto_create_topics: bool = setting(
        True, bk="(Kafka: auto.create.topics.enable)",
        doc="Create a topic the first time a client asks for it in Metadata.")
    log_roll_bytes: int = setting(
        256 << 20, bk="(ledgerd: log roll)", minimum=1 << 20,
        doc="A partition's log moves to a new ledger after this many bytes.")
    retention_check_interval_ms: int = setting(
        300000, bk="(Kafka: log.retention.check.interval.ms)", minimum=1000,
        doc="How often the gateway applies retention (retention.ms, retention.bytes, "
            "DeleteRecords' low watermark, file.delete.delay.ms's deletions) and "
            "compaction to the partitions it leads that no client uses; those in use "
            "get retention every 5 seconds and compaction every compaction_backoff_ms.")
    compaction_map_bytes: int = setting(
        16 << 20, bk="(Kafka: log.cleaner.dedupe.buffer.size)", minimum=128 * 16,
        doc="Memory for a compaction pass's offset map (128 bytes a key, or a "
            "transaction it tracks): a pass over "
            "more distinct keys compacts only the part of the log the keys that fit "
            "cover, the rest on later passes.")
    compaction_backoff_ms: int = setting(
        15000, bk="(Kafka: log.cleaner.backoff.ms)", minimum=10,
        doc="How often the gateway looks for compacted partitions it leads to clean.")
    compaction_orphan_age_s: int = setting(
        3600, bk="(ledgerd)", minimum=10,
        doc="A ledger a compaction pass wrote but never listed (the gateway died before "
            "the swap) is deleted once this old; a pass older than half this gives up "
            "before its swap. The age is the creating gateway's clock against the "
            "sweeping one's: keep the gateways' clocks within half this of each other.")
    tail_cache_bytes: int = setting(
        8 << 20, bk="(ledgerd)", minimum=0,
        doc="Recently written batches each partition keeps in memory for consumers at "
            "the tail (per partition this gateway writes; memory is about partitions "
            "written x this + partitions read in the last minute x read_ahead_bytes).")
    read_ahead_bytes: int = setting(
        4 << 20, bk="(ledgerd; BookKeeper: dbStorage_readAheadCacheMaxSizeMb)", minimum=0,
        doc="Batches read from the bookies ahead of a consumer, per partition being read "
            "(0 = off): the next fetch is answered from memory while this one is sent.")
    max_append_bytes: int = setting(
        4 << 20, bk="(ledgerd)", minimum=1 << 16,
        doc="Queued produce batches sent to the bookies as one group append, at most.")
    max_batch_bytes: int = setting(
        1 << 20, bk="(Kafka: message.max.bytes)", minimum=1024, maximum=1 << 30,
        doc="Largest record batch accepted (a larger one gets MESSAGE_TOO_LARGE); at most "
            "max_frame_bytes minus the entry header.")
    max_request_bytes: int = setting(
        16 << 20, bk="(Kafka: socket.request.max.bytes)", minimum=1024, maximum=1 << 30,
        doc="Largest request accepted; a larger one closes the connection.")
    max_inflight_requests: int = setting(
        16, bk="(Kafka: queued.max.requests, per connection)", minimum=1, maximum=1024,
        doc="Requests of one connection being handled at once before reading pauses.")
    max_queued_request_bytes: int = setting(
        512 << 20, bk="(Kafka: queued.max.request.bytes)", minimum=1 << 20,
        doc="Bytes of requests being handled at once over every connection; a "
            "connection whose next request does not fit reads nothing more until it "
            "does (at least max_request_bytes + 4).")
    request_read_timeout_ms: int = setting(
        30000, bk="(ledgerd)", minimum=100,
        doc="Time the rest of a request may take to arrive once its size is read (and "
            "its bytes taken from max_queued_request_bytes), plus a second per MiB of "
            "it; a connection past it is closed and the bytes given back, so peers that "
            "announce large requests and send nothing cannot hold the budget from "
            "everyone else.")
    max_held_response_bytes: int = setting(
        512 << 20, bk="(ledgerd)", minimum=1 << 20,
        doc="Bytes of fetched records (Fetch and ShareFetch responses) held at once over "
            "every connection, from their read until the response is written; a fetch "
            "reads no more than is free, waits while not even 1 MiB (or max_batch_bytes) "
            "is, and answers without records if none came by its max_wait (at least "
            "max_batch_bytes: room for one whole batch).")
    response_write_timeout_ms: int = setting(
        30000, bk="(ledgerd)", minimum=100,
        doc="Time a response may take to be written to its client, plus a second per MiB "
            "of it (a Kafka client's own request.timeout.ms is 30 s); a connection past "
            "it is closed and what its responses held given back, so a client that "
            "stops reading holds its room no longer than that.")
    max_connections: int = setting(
        1000, bk="(Kafka: max.connections)", minimum=1,
        doc="Client connections served at once; more are closed on accept.")
    group_initial_rebalance_delay_ms: int = setting(
        3000, bk="(Kafka: group.initial.rebalance.delay.ms)", minimum=0, maximum=300000,
        doc="A new group's first rebalance waits this long for more members.")
    group_min_session_timeout_ms: int = setting(
        6000, bk="(Kafka: group.min.session.timeout.ms)", minimum=1,
        doc="Smallest session timeout a consumer may ask for.")
    group_max_session_timeout_ms: int = setting(
        300000, bk="(Kafka: group.max.session.timeout.ms)", minimum=1,
        doc="Largest session timeout a consumer may ask for.")
    transactional_id_expiration_ms: int = setting(
        604800000, bk="(Kafka: transactional.id.expiration.ms)", minimum=1000,
        doc="A transactional id whose producer has not begun or ended a transaction for "
            "this long, and has none open, is forgotten (its record deleted from "
            "ZooKeeper): a producer using it again starts with a new producer id.")
    transaction_one_phase: bool = setting(
        True, bk="(ledgerd)",
        doc="End a transaction that touched one partition and no consumer group, at a "
            "coordinator that also leads that partition, with its marker alone (no "
            "PREPARE record), and begin the producer's next transactions under the "
            "stored record (docs/kafka.md, Transactions). Each such request checks the "
            "record's version with a read from the gateway's ZooKeeper server; off, "
            "every transaction writes its record twice (two phases), which needs no "
            "such read to be current (with a ZooKeeper ensemble, a follower lagging "
            "its leader can answer one late).")
    gateway_tls_certificate_path: str = setting(
        "", bk="(Kafka: ssl.keystore.location, PEM)",
        doc="PEM certificate chain of the gateway's listener; set, the listener speaks "
            "TLS only (Kafka's SSL / SASL_SSL).")
    gateway_tls_key_path: str = setting(
        "", bk="(Kafka: ssl.keystore.location, PEM)", doc="PEM key of the certificate.")
    gateway_tls_client_auth: str = setting(
        "none", bk="(Kafka: ssl.client.auth)", choices=("none", "optional", "required"),
        doc="Ask Kafka clients for certificates (verified against gateway_tls_trust_path); "
            "a certificate's CN and OU 0:roles make its principal.")
    gateway_tls_trust_path: str = setting(
        "", bk="(Kafka: ssl.truststore.location, PEM)",
        doc="PEM CA certificates Kafka clients' certificates must chain to (tls_trust_path "
            "is for the bookies' certificates).")
    gateway_principals_file: str = setting(
        "", bk="(Kafka: sasl.enabled.mechanisms=PLAIN)",
        doc="A principals file in the bookies' format (ledgerd shell gentoken): set, every "
            "connection must authenticate with SASL PLAIN (user = principal name, "
            "password = its token) or a client certificate before any request but "
            "ApiVersions, and requests need the client role (topics: admin).")
    gateway_sasl_mechanisms: str = setting(
        "PLAIN", bk="(Kafka: sasl.enabled.mechanisms)",
        doc="The SASL mechanisms offered, separated by ',': PLAIN (needs "
            "gateway_principals_file), SCRAM-SHA-256, SCRAM-SHA-512 (credentials made with "
            "AlterUserScramCredentials or ledgerd shell kafka scram set, kept in "
            "ZooKeeper). With a SCRAM mechanism every "
            "connection must authenticate before any request but ApiVersions; a SCRAM "
            "user has the client role, and the admin role too when its User:<name> is in "
            "gateway_super_users; the ACLs are checked after.")
    gateway_connection_failed_authentication_delay_ms: int = setting(
        100, bk="(Kafka: connection.failed.authentication.delay.ms)", minimum=0, maximum=5000,
        doc="A failed authentication is answered this many milliseconds late: the "
            "SaslAuthenticate error, and the TLS alert refusing a client certificate "
            "(as Kafka's brokers do; it slows a client that guesses). 0: at once.")
    gateway_connections_max_reauth_ms: int = setting(
        0, bk="(Kafka: connections.max.reauth.ms)",
        doc="Above 0, an authenticated connection (SASL) must authenticate again within "
            "this many milliseconds (KIP-368): SaslAuthenticate tells the client so "
            "(session_lifetime_ms), and a connection that sends any other request after "
            "that is closed. Re-authentication keeps the principal: another is refused. "
            "0: authentication lasts as long as the connection.")
    gateway_allow_everyone_if_no_acl_found: bool = setting(
        True, bk="(Kafka: allow.everyone.if.no.acl.found)",
        doc="A resource no ACL binding covers is open to every principal (Kafka's "
            "default is false; true keeps a cluster without ACLs serving as before). "
            "The ACLs are checked after the roles of gateway_principals_file.")
    gateway_super_users: str = setting(
        "", bk="(Kafka: super.users)",
        doc="Principals (User:name, separated by ';') the ACLs never refuse; an "
            "unauthenticated client is User:ANONYMOUS.")
    gateway_log_headers: bool = setting(
        True, bk="(Kafka: inter.broker.protocol.version, in spirit)",
        doc="New ledgers of partition logs begin with a log header carrying the topic, "
            "so `metadata rebuild` brings topics back without a snapshot. Set false "
            "while upgrading from a gateway that cannot read headers (it would read "
            "one as a batch); set true once every gateway is upgraded.")
    gateway_peer_token_file: str = setting(
        "", bk="(ledgerd: gateways' transaction markers)",
        doc="File holding (first line) the token this gateway authenticates with to the "
            "other gateways when they require it (gateway_principals_file set): SASL "
            "PLAIN as the principal it names there, which needs the admin role to write "
            "transaction markers (empty: auth_token_file).")

    def peer_token(self) -> bytes | None:
        """The token of gateway_peer_token_file (else auth_token_file's), or None."""
        if not self.gateway_peer_token_file:
            return self.auth_token()
        return read_token_file("gateway_peer_token_file", self.gateway_peer_token_file)

    def tls_server_context(self) -> ssl.SSLContext | None:
        if not self.gateway_tls_certificate_path:
            return None
        return server_context(self.gateway_tls_certificate_path, self.gateway_tls_key_path,
                              trust=self.gateway_tls_trust_path,
                              client_auth=self.gateway_tls_client_auth,
                              protocols=self.tls_enabled_protocols, prefix="gateway_")

    def effective_node_id(self, port: int) -> int:
        if self.node_id >= 0:
            return self.node_id
        return zlib.crc32(f"{self.advertised(port)[0]}:{port}".encode()) & 0x7FFFFFFF

    def advertised(self, port: int) -> tuple[str, int]:
        return (self.advertised_host or self.gateway_host, port)

    def __post_init__(self) -> None:
        ClientConfig.__post_init__(self)
        if self.max_batch_bytes + 4096 > self.max_frame_bytes:
            raise ConfigError("max_batch_bytes", self.max_batch_bytes,
                              f"at most max_frame_bytes - 4096 ({self.max_frame_bytes - 4096})")
        if self.max_queued_request_bytes < self.max_request_bytes + 4:
            raise ConfigError("max_queued_request_bytes", self.max_queued_request_bytes,
                              f"at least max_request_bytes + 4 ({self.max_request_bytes + 4})")
        if self.max_held_response_bytes < self.max_batch_bytes:
            raise ConfigError("max_held_response_bytes", self.max_held_response_bytes,
                              f"at least max_batch_bytes ({self.max_batch_bytes}): room "
                              "for one whole batch")
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ConfigError("group_min_session_timeout_ms", self.group_min_session_timeout_ms,
                              "at most group_max_session_timeout_ms")
        mechanisms = self.sasl_mechanisms()
        unknown = [m for m in mechanisms if m not in SASL_MECHANISMS]
        if unknown or not mechanisms:
            raise ConfigError("gateway_sasl_mechanisms", self.gateway_sasl_mechanisms,
                              "one or more of " + ", ".join(SASL_MECHANISMS))
        if "PLAIN" not in mechanisms and self.gateway_principals_file:
            raise ConfigError("gateway_sasl_mechanisms", self.gateway_sasl_mechanisms,
                              "PLAIN among them when gateway_principals_file is set")

    def sasl_mechanisms(self) -> tuple[str, ...]:
        """The mechanisms gateway_sasl_mechanisms names, in its order."""
        return tuple(dict.fromkeys(m.strip().upper()
                                   for m in self.gateway_sasl_mechanisms.split(",")
                                   if m.strip()))

    def scram_mechanisms(self) -> tuple[str, ...]:
        return tuple(m for m in self.sasl_mechanisms() if m.startswith("SCRAM-"))
