"""Dynamic broker configs without sockets: which names a client may change (and the
refusals naming the others), the incremental operations, the topic defaults they
set, the DescribeConfigs entries through the codec at every version, and the record
in ZooKeeper's JSON and the in-memory store."""

from __future__ import annotations

import pytest
import trio

from ledgerd.kafka.api import RESPONSES, SUPPORTED, ApiKey, ErrorCode
from ledgerd.kafka.broker_configs import (
    BROKER_SPECS,
    broker_altered,
    broker_entries,
    broker_incrementally_altered,
    effective_topic_configs,
    topic_defaults,
)
from ledgerd.kafka.schema import Reader, decode, encode
from ledgerd.kafka.topic_admin import BrokerConfigCache
from ledgerd.kafka.topic_configs import ConfigRefusedError, OpType, TopicPolicy, topic_entries
from ledgerd.metadata.errors import ChangeRejectedError
from ledgerd.metadata.kafka_broker_configs import BrokerConfigRecord, BrokerConfigStore
from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore

LIMIT = 1 << 20
STATIC = {"num.partitions": "1", "message.max.bytes": str(LIMIT), "log.retention.ms": "-1",
          "log.cleanup.policy": "delete"}


def _refused(pairs: list[tuple[str, str | None]]) -> ConfigRefusedError:
    with pytest.raises(ConfigRefusedError) as info:
        broker_altered(pairs, STATIC, max_batch_bytes=LIMIT)
    return info.value


def test_dynamic_broker_configs_are_checked_and_the_others_refused_naming_them() -> None:
    got = broker_altered([("log.retention.ms", " 600000 "), ("background.threads", "9"),
                          ("sasl.kerberos.min.time.before.relogin", "58000")],
                         STATIC, max_batch_bytes=LIMIT)
    assert got == {"log.retention.ms": "600000", "background.threads": "9",
                   "sasl.kerberos.min.time.before.relogin": "58000"}
    static = _refused([("num.partitions", "3")])
    assert static.code == ErrorCode.INVALID_REQUEST and "num.partitions" in static.message
    assert "run time" in static.message
    unknown = _refused([("no.such.config", "1")])
    assert unknown.code == ErrorCode.INVALID_CONFIG and "no.such.config" in unknown.message
    # a topic default is checked as its topic config is, and says which
    bad = _refused([("log.retention.ms", "soon")])
    assert bad.code == ErrorCode.INVALID_CONFIG and "log.retention.ms" in bad.message
    assert "retention.ms" in bad.message
    over = _refused([("message.max.bytes", str(LIMIT + 1))])
    assert over.code == ErrorCode.INVALID_CONFIG and "max_batch_bytes" in over.message
    assert _refused([("background.threads", "0")]).code == ErrorCode.INVALID_CONFIG
    assert _refused([("background.threads", None)]).code == ErrorCode.INVALID_CONFIG


def test_incremental_operations_on_broker_configs() -> None:
    def apply(current: dict[str, str], *ops: tuple[str, OpType, str | None]) -> dict[str, str]:
        return broker_incrementally_altered(current, [(n, int(o), v) for n, o, v in ops],
                                            STATIC, max_batch_bytes=LIMIT)

    now = apply({}, ("background.threads", OpType.SET, "9"),
                ("log.retention.bytes", OpType.SET, "1000"))
    assert now == {"background.threads": "9", "log.retention.bytes": "1000"}
    assert apply(now, ("background.threads", OpType.DELETE, "")) == \
        {"log.retention.bytes": "1000"}
    # APPEND / SUBTRACT on the list config start from the file's value
    assert apply({}, ("log.cleanup.policy", OpType.SUBTRACT, "delete")) == {}
    with pytest.raises(ConfigRefusedError) as info:
        apply({}, ("background.threads", OpType.APPEND, "3"))
    assert "list configs only" in info.value.message
    with pytest.raises(ConfigRefusedError) as info:
        apply({}, ("num.partitions", OpType.DELETE, None))
    assert info.value.code == ErrorCode.INVALID_REQUEST
    with pytest.raises(ConfigRefusedError) as info:
        apply({}, ("background.threads", OpType.SET, "2"),
              ("background.threads", OpType.SET, "3"))
    assert "twice" in info.value.message


def test_topic_defaults_come_from_the_broker_then_the_cluster_default() -> None:
    default = {"log.retention.ms": "1000", "log.retention.bytes": "5000",
               "background.threads": "4"}
    own = {"log.retention.ms": "2000"}
    levels = topic_defaults(default, own)
    assert levels["retention.ms"] == [("log.retention.ms", "2000", 2),
                                      ("log.retention.ms", "1000", 3)]
    assert levels["retention.bytes"] == [("log.retention.bytes", "5000", 3)]
    assert set(levels) == {"retention.ms", "retention.bytes"}
    configs = effective_topic_configs({"retention.bytes": "7"}, default, own)
    assert configs == {"retention.ms": "2000", "retention.bytes": "7"}  # the topic's own wins
    policy = TopicPolicy.of(configs, max_batch_bytes=LIMIT)
    assert policy.retention_ms == 2000 and policy.retention_bytes == 7


@pytest.mark.parametrize("version", range(SUPPORTED[ApiKey.DESCRIBE_CONFIGS][1] + 1))
def test_describe_configs_shows_where_each_value_comes_from(version: int) -> None:
    msg = RESPONSES[ApiKey.DESCRIBE_CONFIGS]

    def through_codec(entries: list[dict[str, object]]) -> dict[str, dict[str, object]]:
        body = {"results": [{"error_code": 0, "error_message": None, "resource_type": 4,
                             "resource_name": "1", "configs": entries}]}
        got = decode(msg, version, Reader(b"".join(encode(msg, version, body))))
        return {c["name"]: c for c in got["results"][0]["configs"]}

    default, own = {"log.retention.ms": "1000"}, {"background.threads": "9"}
    broker = through_codec(broker_entries(version, STATIC, default, own, None,
                                          include_synonyms=True))
    assert broker["log.retention.ms"]["value"] == "1000"
    assert broker["background.threads"]["value"] == "9"
    assert broker["num.partitions"]["read_only"]
    assert not broker["log.retention.ms"]["read_only"]
    assert set(BROKER_SPECS) <= set(broker)
    if version >= 1:
        assert broker["log.retention.ms"]["config_source"] == 3  # DYNAMIC_DEFAULT_BROKER
        assert broker["background.threads"]["config_source"] == 2  # DYNAMIC_BROKER_CONFIG
        assert broker["num.partitions"]["config_source"] == 4  # STATIC_BROKER_CONFIG
        assert broker["sasl.kerberos.min.time.before.relogin"]["config_source"] == 5
        assert [s["source"] for s in broker["log.retention.ms"]["synonyms"]] == [3, 4]
    # the cluster-wide default resource lists only the defaults set
    only = broker_entries(version, STATIC, default, None, None)
    assert [e["name"] for e in only] == ["log.retention.ms"]
    # a topic without its own value shows the broker's
    topic = through_codec(topic_entries(version, {}, None, max_batch_bytes=LIMIT,
                                        include_synonyms=True,
                                        broker_defaults=topic_defaults(default, own)))
    assert topic["retention.ms"]["value"] == "1000"
    if version >= 1:
        assert topic["retention.ms"]["config_source"] == 3
        assert topic["retention.ms"]["synonyms"][0]["name"] == "log.retention.ms"
        assert topic["retention.bytes"]["config_source"] == 5


def test_the_record_round_trips_and_the_store_changes_by_compare_and_set() -> None:
    async def main() -> None:
        store = BrokerConfigStore(InMemoryStore(InMemoryCluster()), "/ledgers/kafka")
        assert await store.get() == (BrokerConfigRecord(), -1)
        await store.update(None, lambda cur: {**cur, "log.retention.ms": "5"})
        _, version = await store.update(3, lambda cur: {**cur, "background.threads": "2"})
        record, read_version = await store.get()
        assert read_version == version
        assert record.of(None) == {"log.retention.ms": "5"}
        assert record.of(3) == {"background.threads": "2"} and record.of(4) == {}
        await store.update(3, lambda cur: {})
        assert (await store.get())[0].brokers == {}
        with pytest.raises(ChangeRejectedError):
            await store.update(None, lambda cur: {f"k{i}": "x" * 100 for i in range(5000)})
        assert (await store.get())[0].of(None) == {"log.retention.ms": "5"}

        # a gateway's cache: a read that began before its own change and ended after
        # it does not undo the change
        cache = BrokerConfigCache(store.store, "/ledgers/kafka")
        stale = await store.get()
        cache.keep(*await store.update(None, lambda cur: {"log.retention.ms": "7"}))
        cache.keep(*stale)
        assert cache.record.of(None) == {"log.retention.ms": "7"}
        await cache.refresh()
        assert cache.record.of(None) == {"log.retention.ms": "7"}

    trio.run(main)
