"""Kafka's admin command lines, for the gateway: ``ledgerd kafka-topics``, ``kafka-acls``
and ``kafka-configs``.

Operators of Kafka script their clusters with ``kafka-topics.sh``, ``kafka-acls.sh`` and
``kafka-configs.sh`` (Java programs of Kafka's distribution). These commands take the
same options for what they cover and speak the same Kafka protocol to a gateway named by
``--bootstrap-server`` (through ``kafka/client.py``: CreateTopics, DeleteTopics,
CreatePartitions, Metadata, DescribeConfigs, IncrementalAlterConfigs, CreateAcls,
DescribeAcls, DeleteAcls, DescribeUserScramCredentials, AlterUserScramCredentials), so
they work the same against Kafka itself. What they print follows Kafka's tools
(``Created topic X.``, ``Adding ACLs for resource ...``); ``--json`` prints one JSON
document instead.

A script written for Kafka's tools runs unchanged where ``kafka-topics.sh`` is a two-line
wrapper: ``exec ledgerd kafka-topics "$@"`` (``docs/kafka.md``, "Kafka's command-line
tools"; the conformance harness makes such a ``KAFKA_PATH/bin``).

Security comes from ``--command-config FILE``, Kafka's client properties:
``security.protocol`` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), ``sasl.mechanism``
PLAIN with ``sasl.jaas.config`` (``username="..." password="..."``) or
``sasl.username``/``sasl.password``, PEM files for TLS (``ssl.ca.location`` or a PEM
``ssl.truststore.location``; ``ssl.certificate.location`` + ``ssl.key.location``, or a
PEM ``ssl.keystore.location``; an empty ``ssl.endpoint.identification.algorithm`` turns
host-name checks off). Not covered, each refused with a message that says so: Java
keystores (JKS, PKCS12), SCRAM and GSSAPI logins, encrypted keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
import trio

from ledgerd import __version__
from ledgerd.kafka.api import ApiKey, ErrorCode
from ledgerd.metadata.kafka_acls import AclOperation, AclPermission, PatternType, ResourceType

__all__ = ["kafka_acls", "kafka_configs", "kafka_topics"]

T = TypeVar("T")
TIMEOUT_MS = 30_000
_CONFIG_TYPES = {"topics": 2, "brokers": 4}  # the resources the gateway keeps configs of
_SOURCES = {1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
            3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG",
            5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG",
            7: "CLIENT_METRICS_CONFIG", 8: "GROUP_CONFIG"}


class ToolError(click.ClickException):
    """One line naming what was wrong; exit status 1."""


class BadValueError(ToolError):
    """An option's value is malformed (not host:port, not key=value, an invalid
    regex, an unreadable properties file): exit status 2, as click gives an option
    whose value it cannot convert."""

    exit_code = 2


# -- connecting ---------------------------------------------------------------------------

def _properties(path: Path | None, option: str = "--command-config") -> dict[str, str]:
    """A Java properties file (Kafka's client properties), read as the bookie reads
    ``bk_server.conf`` (``base/properties.py``: comments, continuations, escapes,
    ``key=value``, ``key: value``, ``key value``)."""
    from ledgerd.base.properties import PropertiesError, parse_properties

    if path is None:
        return {}
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadValueError(f"{option} {path}: {exc.strerror or exc}") from None
    try:
        return {k: v.strip() for k, (_, v) in parse_properties(text).items()}
    except PropertiesError as exc:
        raise BadValueError(f"{option} {path}, {exc}") from None


def _jaas_field(jaas: str, name: str) -> str:
    m = re.search(rf'\b{name}\s*=\s*"((?:[^"\\]|\\.)*)"', jaas)
    return m.group(1).replace('\\"', '"') if m else ""


def _pem(props: dict[str, str], location: str, kind: str) -> str:
    path = props.get(location, "")
    if path and props.get(kind, "PEM" if path.endswith((".pem", ".crt")) else "JKS"
                          ).upper() != "PEM":
        raise ToolError(f"{location}={path}: a Java keystore ({kind} "
                        f"{props.get(kind, 'JKS')}); this tool reads PEM files: give "
                        f"{kind}=PEM with a PEM file, or ssl.ca.location / "
                        "ssl.certificate.location + ssl.key.location")
    return path


_CLIENT_KEYS = {
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.jaas.config",
    "sasl.username", "sasl.password", "ssl.ca.location", "ssl.truststore.location",
    "ssl.truststore.type", "ssl.truststore.password", "ssl.certificate.location",
    "ssl.key.location", "ssl.key.password", "ssl.keystore.location", "ssl.keystore.type",
    "ssl.keystore.password", "ssl.endpoint.identification.algorithm", "client.id",
    "request.timeout.ms", "default.api.timeout.ms"}


def security_from(props: dict[str, str]) -> Any:
    """The ClientSecurity the properties describe; ToolError for what is not covered.
    A key this tool does not read is named on stderr (as Kafka's clients log "supplied
    but isn't a known config"), so a typo does not pass for a setting."""
    from ledgerd.base.tls import client_context
    from ledgerd.errors import LedgerdError
    from ledgerd.kafka.client import ClientSecurity

    for key in sorted(set(props) - _CLIENT_KEYS):
        click.echo(f"note: --command-config: {key!r} is not a setting this tool reads; "
                   "ignored", err=True)
    if "sasl.mechanisms" in props and "sasl.mechanism" not in props:  # librdkafka's name
        props = {**props, "sasl.mechanism": props["sasl.mechanisms"]}
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise ToolError(f"security.protocol={protocol}: not PLAINTEXT, SSL, SASL_PLAINTEXT "
                        "or SASL_SSL")
    user, password = "", b""
    if protocol.startswith("SASL"):
        mechanism = props.get("sasl.mechanism", "GSSAPI").upper()
        if mechanism != "PLAIN":
            raise ToolError(f"sasl.mechanism={mechanism}: this tool logs in with PLAIN only")
        jaas = props.get("sasl.jaas.config", "")
        user = props.get("sasl.username") or _jaas_field(jaas, "username")
        password = (props.get("sasl.password") or _jaas_field(jaas, "password")).encode()
        if not user:
            raise ToolError("sasl.mechanism=PLAIN needs sasl.jaas.config with username=\"...\" "
                            "password=\"...\" (or sasl.username and sasl.password)")
    tls = None
    if protocol.endswith("SSL"):
        if props.get("ssl.key.password"):
            raise ToolError("ssl.key.password: encrypted keys are not read by this tool; "
                            "give an unencrypted ssl.key.location")
        trust = props.get("ssl.ca.location") or _pem(props, "ssl.truststore.location",
                                                     "ssl.truststore.type")
        cert = props.get("ssl.certificate.location") or _pem(
            props, "ssl.keystore.location", "ssl.keystore.type")
        if not trust:
            raise ToolError(f"security.protocol={protocol} needs ssl.ca.location (the CA "
                            "that signed the gateway's certificate, PEM)")
        try:
            tls = client_context(
                trust, certificate=cert, key=props.get("ssl.key.location", ""),
                verify_hostname=props.get("ssl.endpoint.identification.algorithm",
                                          "https") != "")
        except (LedgerdError, OSError) as exc:
            text = str(exc)
            for label, prop in (("tls_trust_path", "ssl.ca.location"),
                                ("tls_certificate_path", "ssl.certificate.location"),
                                ("tls_key_path", "ssl.key.location")):
                text = text.replace(label, prop)
            raise ToolError(text) from None
    return ClientSecurity(tls=tls, user=user, password=password)


def _reason(exc: BaseException) -> str:
    """What went wrong, never empty (trio's exceptions often carry no text)."""
    import ssl

    if isinstance(exc, trio.TooSlowError):
        return "no answer in time (not a Kafka listener?)"
    if isinstance(exc, ssl.SSLError) or isinstance(exc.__cause__, ssl.SSLError):
        err = exc if isinstance(exc, ssl.SSLError) else exc.__cause__
        return f"TLS handshake failed: {getattr(err, 'reason', None) or err}"
    if isinstance(exc, trio.BrokenResourceError):
        text = str(exc) or str(exc.__cause__ or "")
        return (text or "the connection broke") + (
            " (not a Kafka listener, or one that needs TLS or SASL, which closes a "
            "connection that does not bring them: then give --command-config with "
            "security.protocol)")
    from ledgerd.kafka.schema import KafkaDecodeError

    if isinstance(exc, KafkaDecodeError):
        return f"its answer is not Kafka's (not a Kafka listener?): {exc}"
    return str(exc) or type(exc).__name__


def _servers(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise BadValueError(f"--bootstrap-server {bootstrap!r}: {item.strip()!r} is not "
                            "host:port")
        out.append((host.strip("[]"), int(port)))
    return out


def _run(bootstrap: str, command_config: Path | None,
         work: Callable[[Any], Awaitable[T]]) -> T:
    """Connect to the first server of ``bootstrap`` that answers and run ``work`` on the
    connection; every failure becomes one ToolError line."""
    from ledgerd.kafka.client import KafkaClientError, KafkaConnection
    from ledgerd.kafka.schema import KafkaDecodeError

    servers = _servers(bootstrap)
    security = security_from(_properties(command_config))

    async def main() -> T:
        problems = []
        for host, port in servers:
            try:
                with trio.fail_after(10):
                    conn = await KafkaConnection.open(host, port, security)
            except (OSError, trio.BrokenResourceError, trio.TooSlowError,
                    KafkaDecodeError) as exc:
                problems.append(f"{host}:{port}: {_reason(exc)}")
                continue
            async with conn:
                with trio.fail_after(TIMEOUT_MS / 1000 + 10):
                    return await work(conn)
        raise ToolError("no Kafka server answered at --bootstrap-server " + bootstrap
                        + " (" + "; ".join(problems) + ")")

    try:
        return trio.run(main)
    except (KafkaClientError, KafkaDecodeError, trio.BrokenResourceError, OSError) as exc:
        raise ToolError(_reason(exc)) from None
    except trio.TooSlowError:
        raise ToolError(f"no answer from {bootstrap} within {TIMEOUT_MS // 1000 + 10} s") \
            from None


def _source(code: int) -> str:
    return _SOURCES.get(code, "UNKNOWN" if code < 0 else str(code))


def _error(code: int, message: str | None = None) -> str:
    try:
        name = ErrorCode(code).name
    except ValueError:
        name = f"error {code}"
    return f"{name}: {message}" if message else name


def _common(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.version_option(
        __version__, "--version", message="ledgerd %(version)s")(fn)
    fn = click.option("--json", "as_json", is_flag=True,
                      help="One JSON document instead of Kafka's text.")(fn)
    fn = click.option("--command-config", "command_config", default=None,
                      type=click.Path(dir_okay=False, path_type=Path),
                      help="Kafka client properties: security.protocol, sasl.*, ssl.*.")(fn)
    return click.option("--bootstrap-server", "bootstrap", required=True,
                        help="host:port[,host:port...] of the gateways (or Kafka).")(fn)


def _one_action(**flags: bool) -> str:
    chosen = [name for name, on in flags.items() if on]
    if len(chosen) != 1:
        raise ToolError("give exactly one of " + ", ".join(f"--{n}" for n in flags)
                        + (f" (not {', '.join('--' + c for c in chosen)})" if chosen else ""))
    return chosen[0]


def _configs(pairs: Sequence[str], option: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BadValueError(f"{option} {pair!r}: not key=value")
        out[key.strip()] = value.strip()
    return out


# -- kafka-topics -------------------------------------------------------------------------

async def _metadata(conn: Any, topics: list[str] | None) -> dict[str, Any]:
    body = {"topics": None if topics is None else [{"name": t} for t in topics],
            "allow_auto_topic_creation": False}
    return await conn.call(ApiKey.METADATA, body)


def topic_filter(pattern: str) -> re.Pattern[str]:
    """Kafka's ``--topic`` for all but --create (``TopicFilter``): a regular expression
    matched against whole names, commas standing for ``|``, spaces and surrounding
    quotes left out (so ``a.b`` also matches ``aXb``, as with Kafka's tool)."""
    text = pattern.strip().replace(",", "|").replace(" ", "").strip("'\"")
    try:
        return re.compile(text)
    except re.error as exc:
        raise BadValueError(f"--topic {pattern!r} is an invalid regex: {exc}") from None


async def _matching(conn: Any, pattern: str, exclude_internal: bool) -> list[str]:
    rx = topic_filter(pattern)
    md = await _metadata(conn, None)
    return sorted(t["name"] for t in md["topics"]
                  if not t["error_code"] and not (exclude_internal and t["is_internal"])
                  and rx.fullmatch(t["name"]))


@click.command("kafka-topics")
@_common
@click.option("--create", is_flag=True, help="Create a topic.")
@click.option("--delete", is_flag=True, help="Delete the topics --topic matches.")
@click.option("--alter", is_flag=True, help="Add partitions (--partitions).")
@click.option("--list", "list_", is_flag=True, help="Topic names, one per line.")
@click.option("--describe", is_flag=True, help="Partitions, leaders and configs.")
@click.option("--topic", default=None,
              help="A topic name; for all but --create also a regular expression.")
@click.option("--partitions", type=click.IntRange(1, 2**31 - 1), default=None)
@click.option("--replication-factor", "replication", type=click.IntRange(1, 2**15 - 1),
              default=None)
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE",
              help="A topic config for --create (repeatable).")
@click.option("--if-not-exists", is_flag=True, help="--create: no error if it exists.")
@click.option("--if-exists", is_flag=True, help="--delete/--alter/--describe: no error if "
              "no topic matches.")
@click.option("--exclude-internal", is_flag=True, help="Leave out internal topics.")
@click.option("--replica-assignment", "assignment", default=None,
              metavar="B:B,B:B,...", help="--create: each partition's brokers (gateways), "
              "partitions separated by commas, brokers by colons; --alter: those of the "
              "partitions added.")
@click.option("--under-replicated-partitions", "under_replicated", is_flag=True,
              help="--describe: only partitions whose ISR is smaller than their replicas.")
@click.option("--unavailable-partitions", "unavailable", is_flag=True,
              help="--describe: only partitions without a live leader.")
@click.option("--under-min-isr-partitions", "under_min_isr", is_flag=True,
              help="--describe: only partitions whose ISR is below min.insync.replicas.")
@click.option("--at-min-isr-partitions", "at_min_isr", is_flag=True,
              help="--describe: only partitions whose ISR is at min.insync.replicas.")
@click.option("--topics-with-overrides", "with_overrides", is_flag=True,
              help="--describe: only topics with configs set, without their partitions.")
def kafka_topics(bootstrap: str, command_config: Path | None, as_json: bool, create: bool,
                 delete: bool, alter: bool, list_: bool, describe: bool, topic: str | None,
                 partitions: int | None, replication: int | None, configs: tuple[str, ...],
                 if_not_exists: bool, if_exists: bool, exclude_internal: bool,
                 assignment: str | None, under_replicated: bool, unavailable: bool,
                 under_min_isr: bool, at_min_isr: bool, with_overrides: bool) -> None:
    """Create, delete, list, describe and add partitions to topics (Kafka's
    kafka-topics.sh)."""
    action = _one_action(create=create, delete=delete, alter=alter, list=list_,
                         describe=describe)
    if action in ("create", "delete", "alter") and not topic:
        raise ToolError(f"--{action} needs --topic")
    if configs and action != "create":
        raise ToolError("--config goes with --create; change a topic's configs with "
                        "`ledgerd kafka-configs --alter`")
    if action == "alter" and partitions is None:
        raise ToolError("--alter needs --partitions (the new partition count)")
    filters = {name: on for name, on in (
        ("under-replicated-partitions", under_replicated),
        ("unavailable-partitions", unavailable), ("under-min-isr-partitions", under_min_isr),
        ("at-min-isr-partitions", at_min_isr), ("topics-with-overrides", with_overrides))
        if on}
    if filters and action != "describe":
        raise ToolError(f"--{next(iter(filters))} goes with --describe")
    if len(filters) > 1:
        raise ToolError("give at most one of " + ", ".join(f"--{f}" for f in filters))
    assigned = None
    if assignment is not None:
        if action not in ("create", "alter"):
            raise ToolError("--replica-assignment goes with --create or --alter")
        if action == "create" and (partitions is not None or replication is not None):
            raise ToolError("--replica-assignment gives the partitions and their replicas: "
                            "not with --partitions or --replication-factor")
        assigned = replica_assignment(assignment)
    wanted = _configs(configs, "--config")
    if topic and action != "create":
        topic_filter(topic)

    async def work(conn: Any) -> Any:
        if action == "create":
            return await _create_topic(conn, str(topic), partitions, replication, wanted,
                                       if_not_exists, assigned)
        names = await _matching(conn, topic, exclude_internal) if topic else None
        if names == [] and action != "list" and not if_exists:
            raise ToolError(f"Topic '{topic}' does not exist as expected")
        if action == "list":
            md = await _metadata(conn, None)
            return sorted(t["name"] for t in md["topics"] if not t["error_code"]
                          and not (exclude_internal and t["is_internal"])
                          and (names is None or t["name"] in names))
        if action == "delete":
            return await _delete_topics(conn, names or [])
        if action == "alter":
            return await _add_partitions(conn, names or [], int(partitions or 0), assigned)
        found = await _describe_topics(conn, names, exclude_internal)
        return described(found, next(iter(filters), None))

    out = _run(bootstrap, command_config, work)
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
    elif action == "list":
        for name in out:
            click.echo(name)
    elif action == "describe":
        if out:
            click.echo(_describe_text(out, topic_lines=not filters or with_overrides,
                                      partition_lines=not with_overrides))
    elif action == "create":
        for name in out:
            click.echo(f"Created topic {name}.")
    # (--delete and --alter print nothing, as Kafka's tool; --json lists the topics,
    # for --create the one created: none if --if-not-exists found it)


def replica_assignment(text: str) -> list[list[int]]:
    """Kafka's ``--replica-assignment``: partitions' broker lists separated by commas,
    the brokers of one by colons (``0:1,1:2``); each list the same length, no broker
    twice in one."""
    out: list[list[int]] = []
    for i, part in enumerate(text.split(",")):
        try:
            brokers = [int(b) for b in part.split(":")]
        except ValueError:
            raise BadValueError(f"--replica-assignment {text!r}: partition {i}'s {part!r} is "
                            "not broker ids separated by colons") from None
        wrong = [b for b in brokers if not 0 <= b < 2**31]
        if wrong:
            raise BadValueError(f"--replica-assignment: partition {i}'s broker id {wrong[0]} "
                                f"is not one (0 to {2**31 - 1})")
        if len(set(brokers)) != len(brokers):
            raise BadValueError(f"--replica-assignment: partition {i} lists a broker twice "
                            f"({part})")
        if out and len(brokers) != len(out[0]):
            raise BadValueError(f"--replica-assignment: partition {i} has {len(brokers)} "
                            f"replicas, partition 0 has {len(out[0])}")
        out.append(brokers)
    return out


async def _create_topic(conn: Any, topic: str, partitions: int | None,
                        replication: int | None, configs: dict[str, str],
                        if_not_exists: bool, assigned: list[list[int]] | None = None,
                        ) -> list[str]:
    got = await conn.call(ApiKey.CREATE_TOPICS, {"topics": [{
        "name": topic, "num_partitions": -1 if partitions is None else partitions,
        "replication_factor": -1 if replication is None else replication,
        "assignments": [{"partition_index": i, "broker_ids": b}
                        for i, b in enumerate(assigned or [])],
        "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
        "timeout_ms": TIMEOUT_MS})
    for t in got["topics"]:
        if t["error_code"] == ErrorCode.TOPIC_ALREADY_EXISTS and if_not_exists:
            return []
        if t["error_code"]:
            raise ToolError(f"creating topic {topic!r}: "
                            f"{_error(t['error_code'], t.get('error_message'))}")
    if replication is not None and replication > 1:
        click.echo(f"note: --replication-factor {replication}: a gateway keeps each "
                   "partition's records on its ledgers' write quorum of bookies (the "
                   "gateway's write_quorum_size); Metadata's replicas are the live "
                   "gateways, the partition's leader first", err=True)
    return [topic]


async def _delete_topics(conn: Any, names: list[str]) -> list[str]:
    if not names:
        return []
    got = await conn.call(ApiKey.DELETE_TOPICS, {"topic_names": names,
                                                 "timeout_ms": TIMEOUT_MS})
    failed = [f"{r['name']}: {_error(r['error_code'])}" for r in got["responses"]
              if r["error_code"]]
    if failed:
        raise ToolError("deleting topics: " + "; ".join(failed))
    return names


async def _add_partitions(conn: Any, names: list[str], count: int,
                          assigned: list[list[int]] | None = None) -> list[str]:
    if not names:
        return []
    got = await conn.call(ApiKey.CREATE_PARTITIONS, {
        "topics": [{"name": n, "count": count, "assignments": None if assigned is None
                    else [{"broker_ids": b} for b in assigned]} for n in names],
        "timeout_ms": TIMEOUT_MS, "validate_only": False})
    failed = [f"{r['name']}: {_error(r['error_code'], r['error_message'])}"
              for r in got["results"] if r["error_code"]]
    if failed:
        raise ToolError("adding partitions: " + "; ".join(failed))
    return names


async def _describe_topics(conn: Any, names: list[str] | None,
                           exclude_internal: bool) -> list[dict[str, Any]]:
    md = await _metadata(conn, names)
    topics = [t for t in md["topics"] if not t["error_code"]
              and not (exclude_internal and t["is_internal"])]
    topics.sort(key=lambda t: t["name"])
    configs: dict[str, dict[str, str]] = {}
    min_isr: dict[str, int] = {}
    if topics:
        got = await conn.call(ApiKey.DESCRIBE_CONFIGS, {"resources": [
            {"resource_type": 2, "resource_name": t["name"], "configuration_keys": None}
            for t in topics]})
        for r in got["results"]:
            if r["error_code"]:
                raise ToolError(f"describing the configs of topic {r['resource_name']}: "
                                f"{_error(r['error_code'], r['error_message'])}")
            # Kafka's tool shows every config that is not a default
            configs[r["resource_name"]] = {c["name"]: c["value"] for c in r["configs"]
                                           if c.get("config_source") != 5}
            for c in r["configs"]:
                if c["name"] == "min.insync.replicas" and str(c["value"]).isdigit():
                    min_isr[r["resource_name"]] = int(c["value"])
    live = {b["node_id"] for b in md["brokers"]}
    out = []
    for t in topics:
        parts = sorted(t["partitions"], key=lambda p: p["partition_index"])
        out.append({
            "topic": t["name"], "topic_id": _uuid(t["topic_id"]),
            "partition_count": len(parts),
            "replication_factor": len(parts[0]["replica_nodes"]) if parts else 0,
            "configs": configs.get(t["name"], {}),
            "min_insync_replicas": min_isr.get(t["name"], 1),
            "partitions": [{"partition": p["partition_index"], "leader": p["leader_id"],
                            "leader_live": p["leader_id"] in live,
                            "replicas": list(p["replica_nodes"]), "isr": list(p["isr_nodes"])}
                           for p in parts]})
    return out


def described(topics: list[dict[str, Any]], only: str | None) -> list[dict[str, Any]]:
    """The topics, or those ``only`` (a --describe filter of Kafka's tool) keeps: the
    topics with configs set, or the topics with their partitions that are
    under-replicated (ISR smaller than replicas), unavailable (no live leader), under or
    at min.insync.replicas."""
    if only is None:
        return topics
    if only == "topics-with-overrides":
        return [t for t in topics if t["configs"]]

    def keep(t: dict[str, Any], p: dict[str, Any]) -> bool:
        isr, floor = len(p["isr"]), t["min_insync_replicas"]
        return {"under-replicated-partitions": isr < len(p["replicas"]),
                "unavailable-partitions": p["leader"] < 0 or not p["leader_live"],
                "under-min-isr-partitions": isr < floor,
                "at-min-isr-partitions": isr == floor}[only]

    out = []
    for t in topics:
        parts = [p for p in t["partitions"] if keep(t, p)]
        if parts:
            out.append({**t, "partitions": parts})
    return out


def _uuid(raw: bytes) -> str:
    """A topic id as Kafka prints it (``Uuid.toString``: URL-safe base64, no padding);
    empty for none."""
    import base64

    if not raw or raw == bytes(16):
        return ""
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _describe_text(topics: list[dict[str, Any]], topic_lines: bool = True,
                   partition_lines: bool = True) -> str:
    """Kafka's --describe: a topic's line, then a line per partition (a partition
    filter prints only the partitions' lines; --topics-with-overrides only the
    topics')."""
    lines = []
    for t in topics:
        cfg = ",".join(f"{k}={v}" for k, v in sorted(t["configs"].items()))
        tid = f"TopicId: {t['topic_id']}\t" if t["topic_id"] else ""
        if topic_lines:
            lines.append(f"Topic: {t['topic']}\t{tid}"
                         f"PartitionCount: {t['partition_count']}\t"
                         f"ReplicationFactor: {t['replication_factor']}\tConfigs: {cfg}")
        for p in t["partitions"] if partition_lines else ():
            lines.append(f"\tTopic: {t['topic']}\tPartition: {p['partition']}\t"
                         f"Leader: {'none' if p['leader'] < 0 else p['leader']}\t"
                         f"Replicas: {','.join(map(str, p['replicas']))}\t"
                         f"Isr: {','.join(map(str, p['isr']))}")
    return "\n".join(lines)


# -- kafka-configs ------------------------------------------------------------------------

def _split_outside_brackets(text: str, sep: str, option: str) -> list[str]:
    pieces, cur, depth = [], [], 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise BadValueError(f"{option} {text!r}: a ']' without its '['")
        if ch == sep and depth == 0:
            pieces.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise BadValueError(f"{option} {text!r}: a '[' without its ']'")
    return [*pieces, "".join(cur)]


def _config_list(text: str, option: str) -> dict[str, str]:
    """Kafka's ``--add-config 'k1=v1,k2=[v2,v3]'``: ``,`` and ``=`` inside brackets belong
    to the value (which loses its brackets); every piece must be ``key=value``, as
    Kafka's ConfigCommand requires."""
    out: dict[str, str] = {}
    if not text.strip():
        return out
    for piece in _split_outside_brackets(text, ",", option):
        parts = _split_outside_brackets(piece, "=", option)
        if len(parts) != 2 or not parts[0].strip():
            raise BadValueError(f"{option}: {piece.strip()!r} is not key=value (every "
                                "config to add is key=val or key=[val1,val2])")
        value = parts[1].strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        out[parts[0].strip()] = value
    return out


@click.command("kafka-configs")
@_common
@click.option("--describe", is_flag=True,
              help="The entity's configs (without --entity-name: every topic's or broker's).")
@click.option("--alter", is_flag=True, help="Change them (--add-config, --delete-config).")
@click.option("--entity-type", "entity_type",
              type=click.Choice([*sorted(_CONFIG_TYPES), "users"]), default=None)
@click.option("--entity-name", "entity_name", default=None)
@click.option("--entity-default", "entity_default", is_flag=True,
              help="The brokers' cluster-wide default (with --entity-type brokers).")
@click.option("--topic", default=None, help="Short for --entity-type topics --entity-name.")
@click.option("--broker", default=None, help="Short for --entity-type brokers --entity-name.")
@click.option("--user", default=None, help="Short for --entity-type users --entity-name: "
              "a user's SCRAM credentials.")
@click.option("--add-config", "add_config", default="", metavar="K=V[,K=V...]",
              help="Configs to set; a value with commas goes in brackets: k=[a,b].")
@click.option("--add-config-file", "add_config_file", default=None,
              type=click.Path(dir_okay=False, path_type=Path),
              help="A properties file of configs to set.")
@click.option("--delete-config", "delete_config", default="", metavar="K[,K...]",
              help="Configs to return to their defaults.")
@click.option("--all", "all_", is_flag=True,
              help="--describe: every config, defaults included.")
def kafka_configs(bootstrap: str, command_config: Path | None, as_json: bool, describe: bool,
                  alter: bool, entity_type: str | None, entity_name: str | None,
                  entity_default: bool, topic: str | None, broker: str | None,
                  user: str | None, add_config: str, add_config_file: Path | None,
                  delete_config: str, all_: bool) -> None:
    """Describe and change topic and broker configs, and users' SCRAM credentials
    (Kafka's kafka-configs.sh)."""
    action = _one_action(describe=describe, alter=alter)
    for kind, given in (("topics", topic), ("brokers", broker), ("users", user)):
        if given is not None:
            if entity_type not in (None, kind):
                raise ToolError(f"--{kind[:-1]} and --entity-type {entity_type} disagree")
            entity_type, entity_name = kind, given
    if entity_type is None:
        raise ToolError("give --entity-type (topics, brokers or users), or --topic, --broker "
                        "or --user")
    if entity_type == "users":
        if entity_default:
            raise ToolError("--entity-default goes with --entity-type brokers (the gateway "
                            "keeps no default user configs)")
        _user_configs(bootstrap, command_config, as_json, action, entity_name,
                      add_config, add_config_file, delete_config)
        return
    if entity_default:
        if entity_type != "brokers":
            raise ToolError("--entity-default goes with --entity-type brokers")
        entity_name = ""
    if entity_type == "brokers" and entity_name and not entity_name.isdigit():
        raise BadValueError(f"--entity-name {entity_name!r}: a broker is named by its "
                            "integer id (--entity-default for the cluster-wide default)")
    if action == "alter" and entity_name is None:
        raise ToolError(f"--alter --entity-type {entity_type} needs --entity-name"
                        + (" or --entity-default" if entity_type == "brokers" else ""))
    if action == "describe" and (add_config or add_config_file or delete_config):
        raise ToolError("--add-config, --add-config-file and --delete-config go with --alter")
    rtype = _CONFIG_TYPES[entity_type]
    adds = _config_list(add_config, "--add-config")
    if add_config_file:
        adds.update(_properties(add_config_file, "--add-config-file"))
    deletes = [k.strip() for k in delete_config.split(",") if k.strip()]
    if action == "alter" and not adds and not deletes:
        raise ToolError("--alter needs --add-config, --add-config-file or --delete-config")
    if set(adds) & set(deletes):
        raise ToolError("a config both added and deleted: " + ", ".join(sorted(set(adds) &
                                                                            set(deletes))))

    def label(name: str) -> str:
        return f"{entity_type[:-1]} {name}" if name else "the default broker"  # type: ignore[index]

    def dynamic(name: str) -> int:
        """What a describe without --all shows (Kafka's ConfigCommand): the entity's
        own dynamic configs."""
        return 1 if entity_type == "topics" else 2 if name else 3

    security = security_from(_properties(command_config))
    brokers: dict[str, tuple[str, int]] = {}  # id -> address, from the bootstrap's Metadata

    async def on_broker(conn: Any, name: str, call: Callable[[Any], Awaitable[T]]) -> T:
        """``call`` on the connection that must carry a request about ``name``: a
        broker's own configs go to that broker (as Kafka's AdminClient routes them),
        the rest to the bootstrap connection."""
        from ledgerd.kafka.client import KafkaConnection

        if entity_type != "brokers" or not name:
            return await call(conn)
        if not brokers:
            for b in (await _metadata(conn, []))["brokers"]:
                brokers[str(b["node_id"])] = (b["host"], b["port"])
        if name not in brokers:
            raise ToolError(f"broker {name} is not in the cluster (its brokers: "
                            f"{', '.join(sorted(brokers, key=int)) or 'none'})")
        host, port = brokers[name]
        try:
            with trio.fail_after(10):
                other = await KafkaConnection.open(host, port, security)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
            raise ToolError(f"broker {name} at {host}:{port}: {_reason(exc)}") from None
        async with other:
            return await call(other)

    async def describe_one(conn: Any, name: str) -> list[dict[str, Any]]:
        return await on_broker(conn, name, lambda c: _describe_one(c, name))

    async def _describe_one(conn: Any, name: str) -> list[dict[str, Any]]:
        got = await conn.call(ApiKey.DESCRIBE_CONFIGS, {"resources": [{
            "resource_type": rtype, "resource_name": name, "configuration_keys": None}],
            "include_synonyms": True})
        r = got["results"][0]
        if r["error_code"]:
            raise ToolError(f"describing the configs of {label(name)}: "
                            f"{_error(r['error_code'], r['error_message'])}")
        return [{"name": c["name"], "value": c["value"], "sensitive": c["is_sensitive"],
                 "source": _source(c["config_source"]),
                 "synonyms": [{"name": y["name"], "value": y["value"],
                               "source": _source(y["source"])} for y in c["synonyms"]]}
                for c in r["configs"] if all_ or c["config_source"] == dynamic(name)]

    async def work(conn: Any) -> Any:
        if action == "alter":
            name = str(entity_name)
            if deletes:  # as Kafka's tool: only configs the entity has may be deleted
                have = {c["name"] for c in await describe_one(conn, name)
                        if c["source"] == _source(dynamic(name))}
                missing = [k for k in deletes if k not in have]
                if missing:
                    raise ToolError(f"Invalid config(s): {', '.join(missing)} (not set on "
                                    f"{label(name)})")
            got = await on_broker(conn, name, lambda c: c.call(
                ApiKey.INCREMENTAL_ALTER_CONFIGS, {"resources": [{
                    "resource_type": rtype, "resource_name": name, "configs": [
                        *({"name": k, "config_operation": 0, "value": v}
                          for k, v in adds.items()),
                        *({"name": k, "config_operation": 1, "value": None}
                          for k in deletes)]}],
                    "validate_only": False}))
            for r in got["responses"]:
                if r["error_code"]:
                    raise ToolError(f"altering the configs of {label(name)}: "
                                    f"{_error(r['error_code'], r['error_message'])}")
            return {"altered": name, "set": adds, "deleted": deletes}
        if entity_name is not None:
            names = [entity_name]
        else:  # every topic, or every broker (gateway)
            md = await _metadata(conn, None)
            names = (sorted(t["name"] for t in md["topics"] if not t["error_code"])
                     if entity_type == "topics"
                     else [str(b["node_id"]) for b in sorted(md["brokers"],
                                                             key=lambda b: b["node_id"])])
        return {name: await describe_one(conn, name) for name in names}

    out = _run(bootstrap, command_config, work)
    if action == "alter":
        if as_json:
            click.echo(json.dumps(out, sort_keys=True))
        else:
            click.echo(f"Completed updating config for {label(out['altered'])}.")
        return
    if as_json:
        click.echo(json.dumps(out if entity_name is None else out[entity_name],
                              sort_keys=True))
        return
    for name, configs in out.items():
        click.echo(f"{'All' if all_ else 'Dynamic'} configs for {label(name)} are:")
        for c in configs:
            value = "null" if c["sensitive"] else c["value"]
            synonyms = ", ".join(
                f"{y['source']}:{y['name']}={'null' if c['sensitive'] else y['value']}"
                for y in c["synonyms"])
            click.echo(f"  {c['name']}={value} sensitive={str(c['sensitive']).lower()} "
                       f"synonyms={{{synonyms}}}")


def _scram_adds(name: str, adds: dict[str, str]) -> list[dict[str, Any]]:
    """Kafka's ``SCRAM-SHA-256=[iterations=8192,password=secret]`` as upsertions: the
    salted password made here (PBKDF2 with a random salt, as Kafka's ConfigCommand
    does), so the password itself is never sent."""
    import secrets

    from ledgerd.kafka.scram import (
        MAX_ITERATIONS,
        MIN_ITERATIONS,
        SALT_BYTES,
        Mechanism,
        salted_password,
    )

    out = []
    for key, value in adds.items():
        mech = Mechanism.from_sasl_name(key)
        if mech is None:
            raise BadValueError(f"--add-config {key}: a user's configs here are "
                                "SCRAM-SHA-256 and SCRAM-SHA-512 (the gateway serves no "
                                "client quotas)")
        fields_ = _config_list(value, f"--add-config {key}")
        unknown = sorted(set(fields_) - {"iterations", "password"})
        if unknown or "password" not in fields_:
            raise BadValueError(f"--add-config {key}=[{value}]: give password=... and "
                                "optionally iterations=N" + (f", not {', '.join(unknown)}"
                                                              if unknown else ""))
        try:
            iterations = int(fields_.get("iterations", MIN_ITERATIONS))
        except ValueError:
            raise BadValueError(f"--add-config {key}: iterations="
                                f"{fields_['iterations']!r} is not a number") from None
        # checked here, before the salting (PBKDF2) that would take as long as asked
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise BadValueError(f"--add-config {key}: iterations={iterations} is not in "
                                f"the range {MIN_ITERATIONS}..{MAX_ITERATIONS}")
        if not fields_["password"]:
            raise BadValueError(f"--add-config {key}: empty password")
        salt = secrets.token_bytes(SALT_BYTES)
        out.append({"name": name, "mechanism": int(mech), "iterations": iterations,
                    "salt": salt, "salted_password": salted_password(
                        mech, fields_["password"], salt, iterations)})
    return out


def _user_configs(bootstrap: str, command_config: Path | None, as_json: bool, action: str,
                  name: str | None, add_config: str, add_config_file: Path | None,
                  delete_config: str) -> None:
    """``kafka-configs --entity-type users``: SCRAM credentials through
    DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554), printed as
    Kafka's tool prints them."""
    from ledgerd.kafka.scram import Mechanism

    if action == "alter":
        if not name:
            raise ToolError("--alter --entity-type users needs --entity-name (or --user)")
        adds = _config_list(add_config, "--add-config")
        if add_config_file:
            adds.update(_properties(add_config_file, "--add-config-file"))
        upserts = _scram_adds(name, adds)
        deletions = []
        for key in (k.strip() for k in delete_config.split(",") if k.strip()):
            mech = Mechanism.from_sasl_name(key)
            if mech is None:
                raise BadValueError(f"--delete-config {key}: a user's configs here are "
                                    "SCRAM-SHA-256 and SCRAM-SHA-512")
            deletions.append({"name": name, "mechanism": int(mech)})
        if not upserts and not deletions:
            raise ToolError("--alter needs --add-config, --add-config-file or --delete-config")
    elif add_config or add_config_file or delete_config:
        raise ToolError("--add-config, --add-config-file and --delete-config go with --alter")

    async def work(conn: Any) -> Any:
        if action == "alter":
            got = await conn.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
                                  {"deletions": deletions, "upsertions": upserts})
            for r in got["results"]:
                if r["error_code"]:
                    raise ToolError(f"altering the SCRAM credentials of user "
                                    f"{r['user']!r}: "
                                    f"{_error(r['error_code'], r['error_message'])}")
            return {"altered": name, "set": [Mechanism(u["mechanism"]).sasl_name
                                             for u in upserts],
                    "deleted": [Mechanism(d["mechanism"]).sasl_name for d in deletions]}
        got = await conn.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
                              {"users": None if name is None else [{"name": name}]})
        if got["error_code"]:
            raise ToolError("describing SCRAM credentials: "
                            f"{_error(got['error_code'], got['error_message'])}")
        out = []
        for r in got["results"]:
            if r["error_code"] == ErrorCode.RESOURCE_NOT_FOUND:
                out.append({"user": r["user"], "credentials": []})
                continue
            if r["error_code"]:
                raise ToolError(f"describing the SCRAM credentials of user {r['user']!r}: "
                                f"{_error(r['error_code'], r['error_message'])}")
            out.append({"user": r["user"], "credentials": [
                {"mechanism": Mechanism(c["mechanism"]).sasl_name,
                 "iterations": c["iterations"]} for c in r["credential_infos"]]})
        return sorted(out, key=lambda u: u["user"])

    out = _run(bootstrap, command_config, work)
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
    elif action == "alter":
        click.echo(f"Completed updating config for user {name}.")
    else:
        for u in out:
            creds = ", ".join(f"{c['mechanism']}=iterations={c['iterations']}"
                              for c in u["credentials"])
            click.echo(f"SCRAM credential configs for user-principal '{u['user']}' are "
                       f"{creds}")


# -- kafka-acls ---------------------------------------------------------------------------

_OPERATIONS = {op.name.replace("_", "").lower(): op for op in AclOperation
               if op not in (AclOperation.UNKNOWN, AclOperation.ANY)}
_PATTERNS = {p.name.lower(): p for p in PatternType if p is not PatternType.UNKNOWN}


def _operation(name: str) -> AclOperation:
    op = _OPERATIONS.get(name.replace("_", "").replace("-", "").lower())
    if op is None:
        raise BadValueError(f"--operation {name!r}: not one of " + ", ".join(
            "".join(w.capitalize() for w in o.name.split("_")) for o in _OPERATIONS.values()))
    return op


def _principal(value: str, option: str) -> str:
    kind, sep, name = value.partition(":")
    if not sep or not kind or not name:
        raise BadValueError(f"{option} {value!r}: a principal is Type:name, such as User:alice "
                        "or User:*")
    return value


Pattern = tuple[ResourceType, str, PatternType]
Binding = tuple[ResourceType, str, PatternType, str, str, AclOperation, AclPermission]


def _resources(topics: Sequence[str], groups: Sequence[str], cluster: bool,
               txn_ids: Sequence[str], pattern: PatternType) -> list[Pattern]:
    """The resource patterns the options name; the cluster's is always LITERAL, as
    with Kafka's tool."""
    return ([(ResourceType.TOPIC, t, pattern) for t in topics]
            + [(ResourceType.GROUP, g, pattern) for g in groups]
            + ([(ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL)]
               if cluster else [])
            + [(ResourceType.TRANSACTIONAL_ID, t, pattern) for t in txn_ids])


def _pattern_text(rtype: int, name: str | None, pattern: int) -> str:
    return (f"ResourcePattern(resourceType={ResourceType(rtype).name}, name={name}, "
            f"patternType={PatternType(pattern).name})")


def _acl_text(acl: dict[str, Any]) -> str:
    return (f"(principal={acl['principal']}, host={acl['host']}, "
            f"operation={AclOperation(acl['operation']).name}, "
            f"permissionType={AclPermission(acl['permission_type']).name})")


@click.command("kafka-acls")
@_common
@click.option("--add", is_flag=True, help="Add ACLs.")
@click.option("--remove", is_flag=True, help="Remove ACLs.")
@click.option("--list", "list_", is_flag=True, help="List ACLs.")
@click.option("--topic", "topics", multiple=True, help="A topic (repeatable; * for all).")
@click.option("--group", "groups", multiple=True, help="A consumer group (repeatable).")
@click.option("--cluster", is_flag=True, help="The cluster resource.")
@click.option("--transactional-id", "txn_ids", multiple=True,
              help="A transactional id (repeatable).")
@click.option("--resource-pattern-type", "pattern", default=None,
              type=click.Choice(sorted(_PATTERNS), case_sensitive=False),
              help="literal or prefixed (--add); also any or match for --list/--remove.")
@click.option("--allow-principal", "allow_principals", multiple=True, metavar="TYPE:NAME")
@click.option("--deny-principal", "deny_principals", multiple=True, metavar="TYPE:NAME")
@click.option("--allow-host", "allow_hosts", multiple=True,
              help="Host for --allow-principal (default *).")
@click.option("--deny-host", "deny_hosts", multiple=True,
              help="Host for --deny-principal (default *).")
@click.option("--principal", "principals", multiple=True,
              help="--list: only ACLs of this principal.")
@click.option("--operation", "operations", multiple=True,
              help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
              "DescribeConfigs, AlterConfigs, IdempotentWrite, All (repeatable; default All).")
@click.option("--producer", is_flag=True,
              help="Write, Describe and Create on the topics (and the transactional ids).")
@click.option("--consumer", is_flag=True, help="Read and Describe on the topics, Read on "
              "the groups.")
@click.option("--idempotent", is_flag=True, help="With --producer: IdempotentWrite on the "
              "cluster.")
@click.option("--force", is_flag=True, help="--remove without asking.")
def kafka_acls(bootstrap: str, command_config: Path | None, as_json: bool, add: bool,
               remove: bool, list_: bool, topics: tuple[str, ...], groups: tuple[str, ...],
               cluster: bool, txn_ids: tuple[str, ...], pattern: str | None,
               allow_principals: tuple[str, ...], deny_principals: tuple[str, ...],
               allow_hosts: tuple[str, ...], deny_hosts: tuple[str, ...],
               principals: tuple[str, ...], operations: tuple[str, ...], producer: bool,
               consumer: bool, idempotent: bool, force: bool) -> None:
    """Add, remove and list ACLs (Kafka's kafka-acls.sh)."""
    action = _one_action(add=add, remove=remove, list=list_)
    pattern_type = _PATTERNS[(pattern or "literal").lower()]
    if action == "add" and pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise ToolError(f"--resource-pattern-type {pattern}: --add takes literal or prefixed")
    resources = _resources(topics, groups, cluster, txn_ids, pattern_type)
    if action != "list" and not resources:
        raise ToolError(f"--{action} needs a resource: --topic, --group, --cluster or "
                        "--transactional-id")
    if idempotent and not producer:
        raise ToolError("--idempotent goes with --producer")
    if producer or consumer:  # as Kafka's AclCommand
        which = "--producer" if producer else "--consumer"
        for option, given in (("--operation", operations), ("--deny-principal",
                                                            deny_principals),
                              ("--deny-host", deny_hosts)):
            if given:
                raise ToolError(f"{which} cannot be combined with {option}")
        if consumer and action == "add" and (not topics or not groups):
            raise ToolError("--consumer needs --topic and --group")
    for option, values in (("--allow-principal", allow_principals),
                           ("--deny-principal", deny_principals), ("--principal", principals)):
        for p in values:
            _principal(p, option)
    grants: list[tuple[str, str, AclPermission]] = [
        (p, h, AclPermission.ALLOW) for p in allow_principals for h in (allow_hosts or ("*",))
    ] + [(p, h, AclPermission.DENY) for p in deny_principals for h in (deny_hosts or ("*",))]
    if action == "add" and not grants:
        raise ToolError("You must specify one of: --allow-principal, --deny-principal when "
                        "trying to add ACLs.")
    ops = [_operation(o) for o in operations]
    for rtype, _, _ in resources:
        wrong = [o for o in ops if o not in _VALID_OPS[rtype]]
        if wrong:
            raise ToolError(f"ResourceType {rtype.name} only supports operations "
                            + ", ".join(_op_name(o) for o in _VALID_OPS[rtype])
                            + f" (not {', '.join(_op_name(o) for o in wrong)})")
    bindings = _bindings(resources, grants, ops, producer, consumer, idempotent)
    if action == "remove" and not force:
        # as Kafka's tool, the answer is read from stdin (`yes | ...` works)
        what = ", ".join(_pattern_text(*r) for r in resources)
        try:
            sure = click.confirm(f"Are you sure you want to remove ACLs from {what}?",
                                 err=True)
        except click.Abort:
            raise ToolError("no answer on stdin to the question before --remove; give "
                            "--force") from None
        if not sure:
            return
    if action == "add" and any(b[0] is ResourceType.CLUSTER for b in bindings):
        click.echo("note: a binding on the cluster resource: principals it does not name "
                   "now need another binding (or gateway_super_users) for the cluster's "
                   "DESCRIBE and ALTER, which the ACL and config APIs need; `ledgerd shell "
                   "kafka acls` reads and deletes bindings in ZooKeeper", err=True)

    async def work(conn: Any) -> Any:
        added: list[dict[str, Any]] = []
        removed: list[dict[str, Any]] = []
        if action == "add":
            added = await _add_acls(conn, bindings)
        elif action == "remove":
            removed = await _remove_acls(conn, bindings if grants else None, resources)
        try:
            current = await _list_acls(conn, resources, principals)
        except ToolError as exc:
            if action == "list":
                raise
            # the change is made; only the listing after it was refused
            return {"added": added, "removed": removed, "current": None,
                    "listing_failed": str(exc)}
        return {"added": added, "removed": removed, "current": current}

    out = _run(bootstrap, command_config, work)
    if as_json:
        named = {k: _named(v) if isinstance(v, list) else v for k, v in out.items()}
        click.echo(json.dumps(named["current"] if action == "list" else named,
                              sort_keys=True))
    else:
        # as Kafka's tool: what was added, then the ACLs of the resources named now
        for p in principals if action == "list" else ():
            click.echo(f"ACLs for principal `{p}`")
        for verb, groups_ in (("Adding ACLs for", out["added"]),
                              ("Current ACLs for", out["current"] or [])):
            for res in groups_:
                where = _pattern_text(res["resource_type"], res["name"], res["pattern_type"])
                click.echo(f"{verb} resource `{where}`: ")
                for acl in res["acls"]:
                    click.echo(f" \t{_acl_text(acl)} ")
                click.echo("")
    if out.get("listing_failed"):
        click.echo(f"note: the ACLs were {'added' if action == 'add' else 'removed'}; "
                   f"listing them after was refused: {out['listing_failed']}", err=True)


def _op_name(op: AclOperation) -> str:
    return "".join(w.capitalize() for w in op.name.split("_"))


_O = AclOperation
# the operations each resource type has (Kafka's AclCommand / AclEntry.supportedOperations)
_VALID_OPS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (_O.READ, _O.WRITE, _O.CREATE, _O.DESCRIBE, _O.DELETE, _O.ALTER,
                         _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS, _O.ALL),
    ResourceType.GROUP: (_O.READ, _O.DESCRIBE, _O.DELETE, _O.DESCRIBE_CONFIGS,
                         _O.ALTER_CONFIGS, _O.ALL),
    ResourceType.CLUSTER: (_O.CREATE, _O.CLUSTER_ACTION, _O.DESCRIBE_CONFIGS,
                           _O.ALTER_CONFIGS, _O.IDEMPOTENT_WRITE, _O.ALTER, _O.DESCRIBE,
                           _O.CREATE_TOKENS, _O.DESCRIBE_TOKENS, _O.ALL),
    ResourceType.TRANSACTIONAL_ID: (_O.DESCRIBE, _O.WRITE, _O.ALL),
}


def _named(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ACL groups with Kafka's names instead of the protocol's numbers (``--json``)."""
    return [{"resource_type": ResourceType(g["resource_type"]).name, "name": g["name"],
             "pattern_type": PatternType(g["pattern_type"]).name,
             "acls": [{"principal": a["principal"], "host": a["host"],
                       "operation": AclOperation(a["operation"]).name,
                       "permission": AclPermission(a["permission_type"]).name}
                      for a in g["acls"]]} for g in groups]


def _bindings(resources: list[Pattern], grants: list[tuple[str, str, AclPermission]],
              ops: list[AclOperation], producer: bool, consumer: bool,
              idempotent: bool) -> list[Binding]:
    """Every ACL to add or remove: the named operations (default All) on every resource,
    or --producer / --consumer's (which leave --operation aside, as Kafka's tool)."""
    out: list[Binding] = []
    for principal, host, perm in grants:
        for rtype, name, pattern in resources:
            if producer or consumer:
                wanted: list[AclOperation] = []
                if producer:
                    wanted += {ResourceType.TOPIC: [AclOperation.WRITE, AclOperation.DESCRIBE,
                                                    AclOperation.CREATE],
                               ResourceType.TRANSACTIONAL_ID: [AclOperation.WRITE,
                                                               AclOperation.DESCRIBE]
                               }.get(rtype, [])
                if consumer:
                    wanted += {ResourceType.TOPIC: [AclOperation.READ, AclOperation.DESCRIBE],
                               ResourceType.GROUP: [AclOperation.READ]}.get(rtype, [])
            else:
                wanted = ops or [AclOperation.ALL]
            for op in dict.fromkeys(wanted):
                out.append((rtype, name, pattern, principal, host, op, perm))
        if producer and idempotent:
            out.append((ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL,
                        principal, host, AclOperation.IDEMPOTENT_WRITE, perm))
    if (producer or consumer) and grants and not out:
        raise ToolError("--producer needs --topic (or --transactional-id); --consumer needs "
                        "--topic or --group")
    return out


def _grouped(acls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for a in acls:
        by.setdefault((a["resource_type"], a["resource_name"], a["pattern_type"]), []).append(
            {k: a[k] for k in ("principal", "host", "operation", "permission_type")})
    return [{"resource_type": rt, "name": n, "pattern_type": pt, "acls": v}
            for (rt, n, pt), v in sorted(by.items())]


async def _add_acls(conn: Any, bindings: list[Binding]) -> list[dict[str, Any]]:
    creations = [{"resource_type": int(rt), "resource_name": n,
                  "resource_pattern_type": int(pt), "principal": p, "host": h,
                  "operation": int(op), "permission_type": int(perm)}
                 for rt, n, pt, p, h, op, perm in bindings]
    got = await conn.call(ApiKey.CREATE_ACLS, {"creations": creations})
    if len(got["results"]) != len(creations):
        raise ToolError(f"CreateAcls answered {len(got['results'])} results for "
                        f"{len(creations)} ACLs")
    for c, r in zip(creations, got["results"], strict=True):
        if r["error_code"]:
            where = _pattern_text(c["resource_type"], c["resource_name"],
                                  c["resource_pattern_type"])
            raise ToolError(f"adding {_acl_text(c)} on {where}: "
                            f"{_error(r['error_code'], r['error_message'])}")
    return _grouped([{**c, "pattern_type": c["resource_pattern_type"]} for c in creations])


async def _remove_acls(conn: Any, bindings: list[Binding] | None,
                       resources: list[Pattern]) -> list[dict[str, Any]]:
    """Delete ``bindings`` (None: every ACL of the resources)."""
    if bindings is not None:
        filters = [{"resource_type_filter": int(rt), "resource_name_filter": n,
                    "pattern_type_filter": int(pt), "principal_filter": p,
                    "host_filter": h, "operation": int(op), "permission_type": int(perm)}
                   for rt, n, pt, p, h, op, perm in bindings]
    else:
        filters = [{"resource_type_filter": int(rt), "resource_name_filter": n,
                    "pattern_type_filter": int(pt), "principal_filter": None,
                    "host_filter": None, "operation": int(AclOperation.ANY),
                    "permission_type": int(AclPermission.ANY)} for rt, n, pt in resources]
    got = await conn.call(ApiKey.DELETE_ACLS, {"filters": filters})
    removed = []
    for r in got["filter_results"]:
        if r["error_code"]:
            raise ToolError(f"removing ACLs: {_error(r['error_code'], r['error_message'])}")
        for m in r["matching_acls"]:
            if m["error_code"]:
                raise ToolError("removing " + _acl_text(m) + " from " + _pattern_text(
                    m["resource_type"], m["resource_name"], m["pattern_type"]) + ": "
                    + _error(m["error_code"], m["error_message"]))
            removed.append(m)
    return _grouped(removed)


async def _list_acls(conn: Any, resources: list[Pattern],
                     principals: Sequence[str]) -> list[dict[str, Any]]:
    """The ACLs of the resource patterns (none named: every ACL), of ``principals``
    only when given."""
    filters: list[tuple[int, str | None, int]] = [
        (int(rt), n, int(pt)) for rt, n, pt in resources
    ] or [(int(ResourceType.ANY), None, int(PatternType.ANY))]
    acls = []
    for principal in principals or (None,):
        for rt, name, pt in filters:
            got = await conn.call(ApiKey.DESCRIBE_ACLS, {
                "resource_type_filter": rt, "resource_name_filter": name,
                "pattern_type_filter": pt, "principal_filter": principal,
                "host_filter": None, "operation": int(AclOperation.ANY),
                "permission_type": int(AclPermission.ANY)})
            if got["error_code"]:
                raise ToolError("listing ACLs: "
                                f"{_error(got['error_code'], got['error_message'])}")
            for res in got["resources"]:
                for a in res["acls"]:
                    acls.append({"resource_type": res["resource_type"],
                                 "resource_name": res["resource_name"],
                                 "pattern_type": res["pattern_type"], **a})
    unique = {json.dumps(a, sort_keys=True): a for a in acls}
    return _grouped(list(unique.values()))
