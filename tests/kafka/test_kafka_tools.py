"""``ledgerd kafka-topics`` / ``kafka-acls`` / ``kafka-configs`` against a real gateway:
what Kafka's shell tools do, checked through a stock client (confluent-kafka), and the
KAFKA_PATH scripts the conformance harness gives librdkafka's tests."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from ledgerd.tools.cli import cli
from ledgerd.tools.kafka_tools import (
    ToolError,
    _config_list,
    _properties,
    described,
    replica_assignment,
    security_from,
    topic_filter,
)
from tests.conformance.runner import make_kafka_path
from tests.kafka.conftest import KafkaCluster
from tests.kafka.crash_kit import wait_until

BOUND_S = 60


def _tool(cluster: KafkaCluster, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, [args[0], "--bootstrap-server", cluster.bootstrap,
                                    *args[1:]], input=stdin)


def _produce_error(cluster: KafkaCluster, topic: str) -> KafkaError | None:
    got: list[KafkaError | None] = []
    p = Producer({"bootstrap.servers": cluster.bootstrap, "message.timeout.ms": 20_000,
                  "retries": 0})
    p.produce(topic, b"v", on_delivery=lambda err, _msg: got.append(err))
    p.flush(BOUND_S)
    assert len(got) == 1
    return got[0]


def test_kafka_topics_creates_describes_alters_and_deletes(kafka_cluster: KafkaCluster) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    made = _tool(kafka_cluster, "kafka-topics", "--create", "--topic", "tools-ts",
                 "--replication-factor", "2", "--partitions", "2",
                 "--config", "message.timestamp.type=LogAppendTime",
                 "--config", "retention.ms=3600000")
    assert made.exit_code == 0, made.output
    assert made.stdout == "Created topic tools-ts.\n"
    assert "--replication-factor 2" in made.stderr  # the note on what it means here
    res = ConfigResource("topic", "tools-ts")
    configs = admin.describe_configs([res])[res].result(BOUND_S)
    assert configs["message.timestamp.type"].value == "LogAppendTime"
    assert configs["retention.ms"].value == "3600000"

    as_json = _tool(kafka_cluster, "kafka-topics", "--create", "--topic", "tools-json",
                    "--json")
    assert json.loads(as_json.stdout) == ["tools-json"]
    again = _tool(kafka_cluster, "kafka-topics", "--create", "--topic", "tools-ts")
    assert again.exit_code == 1 and "TOPIC_ALREADY_EXISTS" in again.output
    assert _tool(kafka_cluster, "kafka-topics", "--create", "--topic", "tools-ts",
                 "--if-not-exists").exit_code == 0

    listed = _tool(kafka_cluster, "kafka-topics", "--list")
    assert "tools-ts" in listed.output.split()
    described = _tool(kafka_cluster, "kafka-topics", "--describe", "--topic", "tools-t.",
                      "--json")
    (topic,) = json.loads(described.output)
    assert (topic["topic"], topic["partition_count"]) == ("tools-ts", 2)
    # Kafka's replication factor: the replicas Metadata lists (here the one gateway;
    # the entries' own copies are the ledgers' write quorum)
    assert topic["replication_factor"] == len(topic["partitions"][0]["replicas"]) == 1
    assert topic["configs"] == {"message.timestamp.type": "LogAppendTime",
                                "retention.ms": "3600000"}
    text = _tool(kafka_cluster, "kafka-topics", "--describe", "--topic", "tools-ts").output
    assert text.startswith("Topic: tools-ts\t") and "\tPartition: 1\t" in text

    grown = _tool(kafka_cluster, "kafka-topics", "--alter", "--topic", "tools-ts",
                  "--partitions", "4")
    assert grown.exit_code == 0, grown.output
    assert len(admin.list_topics("tools-ts", timeout=BOUND_S).topics["tools-ts"].partitions) == 4

    gone = _tool(kafka_cluster, "kafka-topics", "--delete", "--topic", "tools-ts")
    assert (gone.exit_code, gone.output) == (0, ""), gone.output  # as Kafka's: silent
    assert "tools-ts" not in admin.list_topics(timeout=BOUND_S).topics
    missing = _tool(kafka_cluster, "kafka-topics", "--delete", "--topic", "tools-ts")
    assert missing.exit_code == 1
    assert "Topic 'tools-ts' does not exist as expected" in missing.output
    assert _tool(kafka_cluster, "kafka-topics", "--delete", "--topic", "tools-ts",
                 "--if-exists").exit_code == 0


def test_kafka_topics_assigns_replicas_and_filters_descriptions(
        kafka_cluster: KafkaCluster) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    (node,) = admin.list_topics(timeout=BOUND_S).brokers
    made = _tool(kafka_cluster, "kafka-topics", "--create", "--topic", "tools-ra",
                 "--replica-assignment", f"{node},{node}")
    assert made.exit_code == 0, made.output
    parts = admin.list_topics("tools-ra", timeout=BOUND_S).topics["tools-ra"].partitions
    assert sorted(parts) == [0, 1] and all(p.replicas == [node] for p in parts.values())
    far = _tool(kafka_cluster, "kafka-topics", "--create", "--topic", "tools-ra2",
                "--replica-assignment", "4242")
    assert far.exit_code == 1 and "INVALID_REPLICA_ASSIGNMENT" in far.output
    grown = _tool(kafka_cluster, "kafka-topics", "--alter", "--topic", "tools-ra",
                  "--partitions", "3", "--replica-assignment", str(node))
    assert grown.exit_code == 0, grown.output

    def describe(*flag: str) -> str:
        got = _tool(kafka_cluster, "kafka-topics", "--describe", "--topic", "tools-ra", *flag)
        assert got.exit_code == 0, got.output
        return got.output

    # one replica, in sync, led by the live gateway: nothing under-replicated
    assert describe("--under-replicated-partitions") == ""
    assert describe("--unavailable-partitions") == ""
    at_min = describe("--at-min-isr-partitions").splitlines()  # min.insync.replicas 1
    assert [line.split("\t")[2] for line in at_min] == [f"Partition: {i}" for i in range(3)]
    assert describe("--topics-with-overrides") == ""
    assert _tool(kafka_cluster, "kafka-configs", "--alter", "--topic", "tools-ra",
                 "--add-config", "retention.ms=7200000").exit_code == 0
    wait_until(lambda: describe("--topics-with-overrides"), "the override described")
    (line,) = describe("--topics-with-overrides").splitlines()
    assert line.startswith("Topic: tools-ra\t") and "retention.ms=7200000" in line
    assert _tool(kafka_cluster, "kafka-topics", "--version").output.startswith("ledgerd ")


def test_min_insync_replicas_is_held_against_the_ack_quorum(kafka_cluster: KafkaCluster,
                                                             ) -> None:
    """Kafka scripts set min.insync.replicas and unclean.leader.election.enable: both
    are taken. An acks=all produce is refused with NOT_ENOUGH_REPLICAS (nothing
    written) while the gateway's ledgers acknowledge on fewer bookies than asked;
    acks=1 is not held to it, as on Kafka."""
    from confluent_kafka import Consumer, TopicPartition

    from ledgerd.kafka.config import GatewayConfig

    quorum = GatewayConfig().ack_quorum_size  # what the test cluster's gateway runs with
    for topic, floor in (("tools-isr-ok", quorum), ("tools-isr-high", quorum + 1)):
        made = _tool(kafka_cluster, "kafka-topics", "--create", "--topic", topic,
                     "--config", f"min.insync.replicas={floor}",
                     "--config", "unclean.leader.election.enable=false")
        assert made.exit_code == 0, made.output
    assert _produce_error(kafka_cluster, "tools-isr-ok") is None
    err = _produce_error(kafka_cluster, "tools-isr-high")
    assert err is not None and err.code() == KafkaError.NOT_ENOUGH_REPLICAS, err
    got: list[KafkaError | None] = []
    p = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "acks": 1})
    p.produce("tools-isr-high", b"one", on_delivery=lambda e, _m: got.append(e))
    p.flush(BOUND_S)
    assert got == [None]
    c = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "isr"})
    try:  # the refused batch was not written: only acks=1's record is there
        assert c.get_watermark_offsets(TopicPartition("tools-isr-high", 0),
                                       BOUND_S) == (0, 1)
    finally:
        c.close()
    bad = _tool(kafka_cluster, "kafka-topics", "--create", "--topic", "tools-isr-bad",
                "--config", "unclean.leader.election.enable=maybe")
    assert bad.exit_code == 1 and "unclean.leader.election.enable" in bad.output


def test_describe_filters_keep_what_kafkas_tool_keeps() -> None:
    def part(i: int, leader: int, live: bool, isr: list[int]) -> dict[str, object]:
        return {"partition": i, "leader": leader, "leader_live": live,
                "replicas": [1, 2], "isr": isr}

    topic = {"topic": "t", "configs": {}, "min_insync_replicas": 2, "partitions": [
        part(0, 1, True, [1, 2]), part(1, 1, True, [1]), part(2, -1, False, []),
        part(3, 7, False, [1, 2])]}
    plain = {**topic, "topic": "u", "partitions": [part(0, 1, True, [1, 2])]}

    def kept(only: str | None) -> list[tuple[str, list[int]]]:
        return [(t["topic"], [p["partition"] for p in t["partitions"]])
                for t in described([topic, plain], only)]

    assert kept(None) == [("t", [0, 1, 2, 3]), ("u", [0])]
    assert kept("under-replicated-partitions") == [("t", [1, 2])]
    assert kept("unavailable-partitions") == [("t", [2, 3])]
    assert kept("under-min-isr-partitions") == [("t", [1, 2])]
    assert kept("at-min-isr-partitions") == [("t", [0, 3]), ("u", [0])]
    assert kept("topics-with-overrides") == []
    assert [t["topic"] for t in described([{**topic, "configs": {"a": "1"}}, plain],
                                          "topics-with-overrides")] == ["t"]
    assert replica_assignment("0:1,1:2") == [[0, 1], [1, 2]]
    for bad, says in (("0:1,1", "partition 1 has 1 replicas"), ("0:0", "a broker twice"),
                      ("0:x", "not broker ids")):
        with pytest.raises(ToolError, match=says):
            replica_assignment(bad)


def test_kafka_topics_refuses_a_config_the_gateway_refuses(kafka_cluster: KafkaCluster) -> None:
    bad = _tool(kafka_cluster, "kafka-topics", "--create", "--topic", "tools-bad",
                "--config", "cleanup.policy=sometimes")
    assert bad.exit_code == 1
    assert "INVALID_CONFIG" in bad.output and "cleanup.policy" in bad.output


def test_kafka_configs_sets_and_deletes_topic_configs(kafka_cluster: KafkaCluster) -> None:
    assert _tool(kafka_cluster, "kafka-topics", "--create", "--topic", "tools-cfg").exit_code == 0
    set_ = _tool(kafka_cluster, "kafka-configs", "--alter", "--entity-type", "topics",
                 "--entity-name", "tools-cfg",
                 "--add-config", "retention.ms=60000,cleanup.policy=[compact,delete]")
    assert set_.exit_code == 0, set_.output
    assert set_.output == "Completed updating config for topic tools-cfg.\n"
    described = json.loads(_tool(kafka_cluster, "kafka-configs", "--describe", "--topic",
                                 "tools-cfg", "--json").output)
    assert {c["name"]: c["value"] for c in described} == {  # only the topic's own
        "retention.ms": "60000", "cleanup.policy": "compact,delete"}
    assert _tool(kafka_cluster, "kafka-configs", "--alter", "--topic", "tools-cfg",
                 "--delete-config", "retention.ms").exit_code == 0
    text = _tool(kafka_cluster, "kafka-configs", "--describe", "--topic", "tools-cfg").output
    assert text == ("Dynamic configs for topic tools-cfg are:\n"
                    "  cleanup.policy=compact,delete sensitive=false "
                    "synonyms={DYNAMIC_TOPIC_CONFIG:cleanup.policy=compact,delete, "
                    "DEFAULT_CONFIG:cleanup.policy=delete}\n")


def test_kafka_acls_scripts_deny_and_allow_again(kafka_cluster: KafkaCluster,
                                                 tmp_path: Path) -> None:
    """The harness's KAFKA_PATH/bin/kafka-acls.sh, as librdkafka's 0115 runs it."""
    topic = "tools-acl"
    assert _tool(kafka_cluster, "kafka-topics", "--create", "--topic", topic).exit_code == 0
    assert _produce_error(kafka_cluster, topic) is None
    bin_dir = make_kafka_path(tmp_path / "kafka") / "bin"
    deny = ["--deny-principal", "User:*", "--operation", "All", "--deny-host", "*",
            "--topic", topic]
    added = subprocess.run(
        [bin_dir / "kafka-acls.sh", "--bootstrap-server", kafka_cluster.bootstrap, "--add",
         *deny], capture_output=True, text=True, timeout=BOUND_S, stdin=subprocess.DEVNULL)
    assert added.returncode == 0, added.stderr
    assert ("Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name=tools-acl, "
            "patternType=LITERAL)`: \n \t(principal=User:*, host=*, operation=ALL, "
            "permissionType=DENY) \n") in added.stdout
    err = _produce_error(kafka_cluster, topic)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    listed = json.loads(_tool(kafka_cluster, "kafka-acls", "--list", "--topic", topic,
                              "--json").output)
    # --list --topic T: the LITERAL bindings of T (Kafka's default pattern type)
    assert listed == [{"resource_type": "TOPIC", "name": topic, "pattern_type": "LITERAL",
                       "acls": [{"principal": "User:*", "host": "*", "operation": "ALL",
                                 "permission": "DENY"}]}]

    unforced = _tool(kafka_cluster, "kafka-acls", "--remove", *deny)
    assert unforced.exit_code == 1 and "--force" in unforced.output
    removed = subprocess.run(
        [bin_dir / "kafka-acls.sh", "--bootstrap-server", kafka_cluster.bootstrap,
         "--remove", "--force", *deny], capture_output=True, text=True, timeout=BOUND_S)
    assert removed.returncode == 0, removed.stderr
    assert json.loads(_tool(kafka_cluster, "kafka-acls", "--list", "--topic", topic,
                            "--json").output) == []
    assert _produce_error(kafka_cluster, topic) is None


def test_kafka_acls_producer_shorthand(kafka_cluster: KafkaCluster) -> None:
    added = _tool(kafka_cluster, "kafka-acls", "--add", "--allow-principal", "User:alice",
                  "--producer", "--topic", "tools-prod", "--json")
    assert added.exit_code == 0, added.output
    out = json.loads(added.output)
    (res,) = out["added"]
    assert sorted(a["operation"] for a in res["acls"]) == ["CREATE", "DESCRIBE", "WRITE"]
    assert out["current"] == out["added"]
    gone = _tool(kafka_cluster, "kafka-acls", "--remove", "--force", "--topic", "tools-prod",
                 "--json")
    assert len(json.loads(gone.output)["removed"][0]["acls"]) == 3
    assert json.loads(gone.output)["current"] == []


@pytest.mark.parametrize(("args", "says"), [
    (["kafka-topics", "--bootstrap-server", "nowhere", "--list"], "is not host:port"),
    (["kafka-topics", "--bootstrap-server", "127.0.0.1:1", "--list"],
     "no Kafka server answered"),
    (["kafka-topics", "--bootstrap-server", "127.0.0.1:1", "--list", "--delete"],
     "give exactly one of"),
    (["kafka-topics", "--bootstrap-server", "127.0.0.1:1", "--create"], "needs --topic"),
    (["kafka-acls", "--bootstrap-server", "127.0.0.1:1", "--add", "--topic", "t",
      "--allow-principal", "User:a", "--operation", "Fly"], "--operation 'Fly'"),
    (["kafka-acls", "--bootstrap-server", "127.0.0.1:1", "--add", "--topic", "t"],
     "--allow-principal, --deny-principal"),
    (["kafka-acls", "--bootstrap-server", "127.0.0.1:1", "--add", "--topic", "t",
      "--allow-principal", "alice"], "Type:name"),
    (["kafka-configs", "--bootstrap-server", "127.0.0.1:1", "--alter", "--topic", "t"],
     "--alter needs --add-config"),
    (["kafka-configs", "--bootstrap-server", "127.0.0.1:1", "--alter", "--topic", "t",
      "--add-config", "a=1,garbage"], "'garbage' is not key=value"),
    (["kafka-topics", "--bootstrap-server", "127.0.0.1:1", "--delete", "--topic", "a[("],
     "is an invalid regex"),
    (["kafka-topics", "--bootstrap-server", "127.0.0.1:1", "--create", "--topic", "t",
      "--replication-factor", "40000"], "40000 is not in the range"),
    (["kafka-acls", "--bootstrap-server", "127.0.0.1:1", "--add", "--topic", "t",
      "--deny-principal", "bob"], "--deny-principal 'bob'"),
    (["kafka-acls", "--bootstrap-server", "127.0.0.1:1", "--add", "--topic", "t",
      "--allow-principal", "User:a", "--idempotent"], "--idempotent goes with --producer"),
    (["kafka-acls", "--bootstrap-server", "127.0.0.1:1", "--add", "--topic", "t",
      "--allow-principal", "User:a", "--operation", "ClusterAction"],
     "ResourceType TOPIC only supports operations"),
    (["kafka-acls", "--bootstrap-server", "127.0.0.1:1", "--add", "--topic", "t",
      "--allow-principal", "User:a", "--consumer"], "--consumer needs --topic and --group"),
    (["kafka-acls", "--bootstrap-server", "127.0.0.1:1", "--add", "--topic", "t",
      "--allow-principal", "User:a", "--producer", "--operation", "Write"],
     "--producer cannot be combined with --operation"),
    (["kafka-configs", "--bootstrap-server", "127.0.0.1:1", "--alter", "--topic", "t",
      "--add-config-file", "/nonexistent.properties"], "--add-config-file /nonexistent"),
    (["kafka-configs", "--bootstrap-server", "127.0.0.1:1", "--describe", "--topic", "t",
      "--add-config", "a=1"], "go with --alter"),
    (["kafka-configs", "--bootstrap-server", "127.0.0.1:1", "--describe", "--broker", "x"],
     "integer id"),
    (["kafka-topics", "--bootstrap-server", "127.0.0.1:1", "--list",
      "--under-replicated-partitions"], "--under-replicated-partitions goes with --describe"),
    (["kafka-topics", "--bootstrap-server", "127.0.0.1:1", "--describe",
      "--unavailable-partitions", "--topics-with-overrides"], "at most one of"),
    (["kafka-topics", "--bootstrap-server", "127.0.0.1:1", "--create", "--topic", "t",
      "--replica-assignment", "0", "--partitions", "2"], "not with --partitions"),
    (["kafka-topics", "--bootstrap-server", "127.0.0.1:1", "--delete", "--topic", "t",
      "--replica-assignment", "0"], "goes with --create or --alter"),
    (["kafka-topics", "--bootstrap-server", "127.0.0.1:1", "--create", "--topic", "t",
      "--replica-assignment", "99999999999999999999"], "is not one (0 to 2147483647)"),
    (["kafka-configs", "--bootstrap-server", "127.0.0.1:1", "--alter", "--user", "eve",
      "--add-config", "SCRAM-SHA-256=[iterations=0,password=x]"],
     "iterations=0 is not in the range 4096..16384"),
    # refused before salting: 10^8 PBKDF2 rounds would run for minutes
    (["kafka-configs", "--bootstrap-server", "127.0.0.1:1", "--alter", "--user", "eve",
      "--add-config", "SCRAM-SHA-256=[iterations=100000000,password=x]"],
     "not in the range 4096..16384"),
    (["kafka-configs", "--bootstrap-server", "127.0.0.1:1", "--alter", "--user", "eve",
      "--add-config", "SCRAM-SHA-256=[password=]"], "empty password"),
])
def test_bad_invocations_say_what_is_wrong(args: list[str], says: str) -> None:
    got = CliRunner().invoke(cli, args)
    assert got.exit_code != 0
    assert says in got.output


@pytest.mark.parametrize(("args", "code"), [
    (["--bootstrap-server", "127.0.0.1", "--list"], 2),  # a malformed value
    (["--bootstrap-server", "127.0.0.1:1", "--list", "--command-config", "/nonexistent"], 2),
    (["--bootstrap-server", "127.0.0.1:1", "--create", "--topic", "t",
      "--replica-assignment", "0:x"], 2),
    (["--bootstrap-server", "127.0.0.1:1", "--list", "--bogus"], 2),  # unknown option
    (["--bootstrap-server", "127.0.0.1:1", "--list", "--delete"], 1),  # usage
])
def test_malformed_values_exit_2_as_unknown_options_do(args: list[str], code: int) -> None:
    assert CliRunner().invoke(cli, ["kafka-topics", *args]).exit_code == code


def test_command_config_properties(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("# comment\nsecurity.protocol = SASL_PLAINTEXT\nsasl.mechanism PLAIN\n"
                     'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule'
                     # the file holds \\" and properties read it as \": JAAS's escaped quote
                     ' required username="alice" password="s3=cr\\\\"et";\n')
    sec = security_from(_properties(props))
    assert (sec.user, sec.password, sec.tls) == ("alice", b's3=cr"et', None)
    with pytest.raises(ToolError, match=r"sasl\.mechanism=SCRAM-SHA-256"):
        security_from({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
                       "ssl.ca.location": "x"})
    with pytest.raises(ToolError, match="a Java keystore"):
        security_from({"security.protocol": "SSL",
                       "ssl.truststore.location": "/etc/kafka/truststore.jks"})
    with pytest.raises(ToolError, match=r"security\.protocol=SSL needs ssl\.ca\.location"):
        security_from({"security.protocol": "SSL"})
    bad = tmp_path / "bad.properties"
    bad.write_text("ok=1\nssl.key.location=/keys/\\u12zz\n")  # a broken \\u escape
    with pytest.raises(ToolError, match="line 2: bad unicode escape"):
        _properties(bad)
    cont = tmp_path / "cont.properties"  # a continued line, as Java reads it
    cont.write_text("sasl.jaas.config=a \\\n    b\n")
    assert _properties(cont) == {"sasl.jaas.config": "a b"}


def test_add_config_lists_keep_bracketed_commas() -> None:
    assert _config_list("a=1,b=[x,y],c=", "--add-config") == {"a": "1", "b": "x,y", "c": ""}
    assert _config_list("SCRAM-SHA-256=[iterations=8192,password=s]", "--add-config") == {
        "SCRAM-SHA-256": "iterations=8192,password=s"}
    for bad, says in ((",,,", "not key=value"), ("a=b=c", "not key=value"),
                      ("k=[a,b", "without its ']'"), ("r=1,c:compact", "'c:compact'")):
        with pytest.raises(ToolError, match=re.escape(says)):
            _config_list(bad, "--add-config")


def test_topic_filters_are_kafkas() -> None:
    rx = topic_filter(" 'orders,payments.*' ")
    assert [t for t in ("orders", "payments-eu", "orders2", "x") if rx.fullmatch(t)] == [
        "orders", "payments-eu"]
    assert topic_filter("a.b").fullmatch("aXb")  # a regex, as with Kafka's tool


def test_an_unreachable_server_is_named_with_a_reason() -> None:
    got = CliRunner().invoke(cli, ["kafka-topics", "--bootstrap-server", "127.0.0.1:1",
                                   "--list"])
    assert got.exit_code == 1
    assert re.search(r"127\.0\.0\.1:1: \S", got.output), got.output  # a reason, not empty


@pytest.mark.parametrize(("size", "says"), [(-5, "a reply of -5 bytes"),
                                            (1 << 30, "at most"), (2, "a reply of 2 bytes")])
def test_the_client_refuses_a_reply_size_before_using_it(size: int, says: str) -> None:
    import struct

    import trio
    import trio.testing

    from ledgerd.kafka.client import exchange
    from ledgerd.kafka.schema import KafkaDecodeError

    async def main() -> None:
        ours, theirs = trio.testing.memory_stream_pair()
        # the whole reply, size and more, arrives in the first read
        await theirs.send_all(struct.pack(">i", size) + bytes(64))
        with pytest.raises(KafkaDecodeError, match=re.escape(says)):
            await exchange(ours, b"request", "the server")

    trio.run(main)


def test_kafka_acls_remove_reads_its_answer_from_stdin(kafka_cluster: KafkaCluster) -> None:
    allow = ["--allow-principal", "User:erin", "--operation", "Read", "--topic", "tools-yes"]
    assert _tool(kafka_cluster, "kafka-acls", "--add", *allow).exit_code == 0
    kept = _tool(kafka_cluster, "kafka-acls", "--remove", *allow, stdin="n\n")
    assert kept.exit_code == 0
    assert "User:erin" in _tool(kafka_cluster, "kafka-acls", "--list", "--topic",
                                "tools-yes").output
    gone = _tool(kafka_cluster, "kafka-acls", "--remove", *allow, stdin="y\n")
    assert gone.exit_code == 0, gone.output
    assert "User:erin" not in _tool(kafka_cluster, "kafka-acls", "--list", "--topic",
                                    "tools-yes").output


def test_kafka_configs_describes_every_topic_and_refuses_deleting_what_is_unset(
        kafka_cluster: KafkaCluster) -> None:
    for t in ("tools-all-a", "tools-all-b"):
        assert _tool(kafka_cluster, "kafka-topics", "--create", "--topic", t,
                     "--config", "retention.ms=7000").exit_code == 0
    every = json.loads(_tool(kafka_cluster, "kafka-configs", "--describe", "--entity-type",
                             "topics", "--json").output)
    assert every["tools-all-a"] == every["tools-all-b"] != []
    unset = _tool(kafka_cluster, "kafka-configs", "--alter", "--topic", "tools-all-a",
                  "--delete-config", "retention.bytes")
    assert unset.exit_code == 1 and "Invalid config(s): retention.bytes" in unset.output


def test_a_cluster_binding_that_locks_the_acl_apis_is_undone_in_zookeeper(
        kafka_cluster: KafkaCluster) -> None:
    """A binding on the cluster resource takes DESCRIBE of it from every principal it
    does not name (Kafka's rule), so the ACL APIs refuse User:ANONYMOUS from then on;
    `ledgerd shell kafka acls` reads and deletes bindings in ZooKeeper, past the
    gateway's authorizer."""
    shell = ["shell", "--zk", kafka_cluster.zk, "kafka", "acls"]
    try:
        added = _tool(kafka_cluster, "kafka-acls", "--add", "--allow-principal", "User:dave",
                      "--producer", "--idempotent", "--topic", "tools-orders")
        assert added.exit_code == 0, added.output
        assert "Adding ACLs for resource `ResourcePattern(resourceType=CLUSTER" in \
            added.output
        assert "a binding on the cluster resource" in added.output  # the note
        assert "listing them after was refused" in added.output
        listed = _tool(kafka_cluster, "kafka-acls", "--list")
        assert listed.exit_code == 1 and "CLUSTER_AUTHORIZATION_FAILED" in listed.output
        seen = CliRunner().invoke(cli, [*shell, "list", "--json"])
        assert seen.exit_code == 0, seen.output
        assert {"resource_type": "CLUSTER", "resource_name": "kafka-cluster",
                "pattern_type": "LITERAL", "principal": "User:dave", "host": "*",
                "operation": "IDEMPOTENT_WRITE", "permission": "ALLOW"} in \
            json.loads(seen.output)["bindings"]
    finally:
        undone = CliRunner().invoke(cli, [*shell, "delete", "--all", "--force"])
        assert undone.exit_code == 0, undone.output

    def listing_works() -> bool:
        return _tool(kafka_cluster, "kafka-acls", "--list").exit_code == 0
    wait_until(listing_works, "the gateway read the bindings again", bound=10)


def test_kafka_configs_sends_a_brokers_own_configs_to_that_broker(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    """With two gateways, --broker N through the other one's address: the request goes
    to broker N (a gateway answers only for its own configs), as Kafka's tool does."""
    from tests.kafka.conftest import GatewayProcess

    second = GatewayProcess(kafka_cluster.zk, tmp_path / "gateway2.log")
    second.start()
    try:
        node = second.node_id
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        wait_until(lambda: node in {b.id for b in admin.list_topics(timeout=BOUND_S)
                                    .brokers.values()}, "the second gateway listed")
        done = _tool(kafka_cluster, "kafka-configs", "--alter", "--broker", str(node),
                     "--add-config", "log.retention.ms=5000")
        assert done.exit_code == 0, done.output
        assert f"Completed updating config for broker {node}." in done.output
        got = _tool(kafka_cluster, "kafka-configs", "--describe", "--broker", str(node),
                    "--json")
        assert got.exit_code == 0, got.output
        assert {c["name"]: c["value"] for c in json.loads(got.output)} == {
            "log.retention.ms": "5000"}
        every = _tool(kafka_cluster, "kafka-configs", "--describe", "--entity-type",
                      "brokers", "--json")
        assert every.exit_code == 0 and str(node) in json.loads(every.output), every.output
        undone = _tool(kafka_cluster, "kafka-configs", "--alter", "--broker", str(node),
                       "--delete-config", "log.retention.ms")
        assert undone.exit_code == 0, undone.output
        missing = _tool(kafka_cluster, "kafka-configs", "--describe", "--broker", "12345")
        assert missing.exit_code == 1 and "broker 12345 is not in the cluster" in missing.output
    finally:
        second.stop()


def test_a_partitions_leader_is_among_its_replicas_whatever_the_assignment(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    """A replica assignment places nothing: a partition whose leader (chosen among the
    live gateways) is not in it still lists that leader first among its replicas and
    in-sync replicas, which Kafka's tools and clients take for granted."""
    from tests.kafka.conftest import GatewayProcess

    second = GatewayProcess(kafka_cluster.zk, tmp_path / "gateway2.log")
    second.start()
    try:
        node = second.node_id
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        # (its id, not a count: a gateway another test killed may be listed until its
        # ZooKeeper session expires)
        wait_until(lambda: node in admin.list_topics(timeout=BOUND_S).brokers,
                   "the second gateway listed")
        made = _tool(kafka_cluster, "kafka-topics", "--create", "--topic", "assigned-away",
                     "--replica-assignment", ",".join([str(node)] * 16))
        assert made.exit_code == 0, made.output
        parts = admin.list_topics("assigned-away", timeout=BOUND_S) \
            .topics["assigned-away"].partitions.values()
        leaders = {p.leader for p in parts}
        assert len(leaders) == 2  # some led by the unassigned gateway (all 16 by one: 2^-15)
        for p in parts:
            assert p.replicas[0] == p.leader and p.leader in p.isrs, (p.id, p.leader,
                                                                     p.replicas, p.isrs)
            assert node in p.replicas
    finally:
        second.stop()
