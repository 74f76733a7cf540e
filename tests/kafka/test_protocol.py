"""The gateway's pure parts: message schemas (round trips, hostile bytes), RecordBatch
checks with kafka-python's batch builder as the oracle, and the group state machine."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.kafka.api import REQUESTS, RESPONSES, SUPPORTED, ApiKey, ErrorCode
from ledgerd.kafka.groups import Group, GroupSettings, GroupState
from ledgerd.kafka.records import BatchError, BatchHeader, split_batches, with_base_offset
from ledgerd.kafka.schema import KafkaDecodeError, Reader, decode, encode


def _batch(n: int = 3, compression: int = 0, pid: int = -1) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                  producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                                  base_sequence=0 if pid >= 0 else -1, batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"v" * i,
                 headers=[("h", b"x")])
    return bytes(b.build())


def test_batches_built_by_kafka_python_pass_and_survive_a_new_base_offset() -> None:
    one, two = _batch(3), _batch(5, compression=1)  # plain and gzip
    got = split_batches(one + two, max_batch_bytes=1 << 20)
    assert [h.record_count for h, _ in got] == [3, 5]
    moved = with_base_offset(got[1][1], 1234)
    assert split_batches(moved, max_batch_bytes=1 << 20)[0][0].base_offset == 1234
    from kafka.record.default_records import DefaultRecordBatch

    batch = DefaultRecordBatch(moved)
    assert batch.validate_crc() and batch.base_offset == 1234
    assert [r.offset for r in batch] == [1234, 1235, 1236, 1237, 1238]


@pytest.mark.parametrize(("mangle", "code"), [
    (lambda b: b[:30], ErrorCode.CORRUPT_MESSAGE),  # shorter than its header
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), ErrorCode.CORRUPT_MESSAGE),  # CRC
    (lambda b: b[:16] + b"\x01" + b[17:], ErrorCode.UNSUPPORTED_VERSION),  # magic 1
    (lambda b: b + b"\x00" * 5, ErrorCode.CORRUPT_MESSAGE),  # trailing bytes
    (lambda b: b"", ErrorCode.INVALID_RECORD),
])
def test_bad_batches_name_their_kafka_error(mangle: object, code: int) -> None:
    with pytest.raises(BatchError) as info:
        split_batches(mangle(_batch()), max_batch_bytes=1 << 20)  # type: ignore[operator]
    assert info.value.code == code


def test_oversized_batch_is_message_too_large() -> None:
    with pytest.raises(BatchError) as info:
        split_batches(_batch(50), max_batch_bytes=200)
    assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE


def test_header_parse_reads_the_producer_fields() -> None:
    h = BatchHeader.parse(_batch(2, pid=77))
    assert (h.producer_id, h.base_sequence, h.record_count, h.next_offset) == (77, 0, 2, 2)


@pytest.mark.parametrize("api", list(ApiKey))
def test_every_message_round_trips_at_every_version(api: ApiKey) -> None:
    low, high = SUPPORTED[api]
    for version in range(low, high + 1):
        for message in (REQUESTS[api], RESPONSES[api]):
            empty = b"".join(encode(message, version, _defaults(message.fields)))
            back = decode(message, version, Reader(empty))
            again = b"".join(encode(message, version, back))
            assert again == empty, (api, version)


def _defaults(fields: tuple[object, ...]) -> dict[str, object]:
    from ledgerd.kafka.schema import BYTES, STRING, Array, Field, Struct
    out: dict[str, object] = {}
    for f in fields:
        assert isinstance(f, Field)
        if isinstance(f.kind, Struct):
            out[f.name] = None if f.kind.nullable else _defaults(f.kind.fields)
        elif isinstance(f.kind, Array):
            out[f.name] = [] if f.default is None else list(f.default)
        elif f.kind in (STRING,):
            out[f.name] = f.default if f.default is not None else "s"
        elif f.kind in (BYTES,):
            out[f.name] = f.default if f.default is not None else b"b"
        else:
            out[f.name] = f.default if f.default is not None else (
                0 if f.kind.fmt else None)
    return out


@settings(max_examples=300, deadline=None)
@given(api=st.sampled_from(list(ApiKey)), version=st.integers(0, 17),
       data=st.binary(max_size=200))
def test_hostile_bytes_raise_only_decode_errors(api: ApiKey, version: int, data: bytes) -> None:
    try:
        decode(REQUESTS[api], version, Reader(data))
    except KafkaDecodeError:
        pass


def test_a_huge_array_count_is_refused_without_allocating() -> None:
    body = struct.pack(">i", 2**31 - 1)  # Metadata v1: topics
    with pytest.raises(KafkaDecodeError, match="elements"):
        decode(REQUESTS[ApiKey.METADATA], 1, Reader(body))


# -- the group machine -----------------------------------------------------------------

def _group() -> Group:
    return Group("g", GroupSettings(initial_rebalance_delay_s=1.0))


def _join(g: Group, member: str, now: float) -> object:
    return g.join(member_id=member, client_id="c", protocol_type="consumer",
                  protocols=[("range", b"meta-" + member.encode())],
                  session_timeout_ms=10000, rebalance_timeout_ms=5000, now=now)


def test_first_join_waits_the_initial_delay_then_a_sync_makes_it_stable() -> None:
    g = _group()
    r1 = _join(g, "", 0.0)
    assert r1.value is None and g.state is GroupState.PREPARING_REBALANCE  # type: ignore[attr-defined]
    r2 = _join(g, "", 0.5)
    g.tick(1.1)
    a, b = r1.value, r2.value  # type: ignore[attr-defined]
    assert a["generation_id"] == b["generation_id"] == 1 and a["leader"] == a["member_id"]
    assert len(a["members"]) == 2 and b["members"] == []  # the list goes to the leader only
    follower = g.sync(member_id=b["member_id"], generation=1, assignments=[], now=1.2)
    assert follower.value is None
    g.sync(member_id=a["member_id"], generation=1,
           assignments=[(a["member_id"], b"A"), (b["member_id"], b"B")], now=1.3)
    assert follower.value == {"error_code": 0, "assignment": b"B"}
    assert g.state is GroupState.STABLE
    assert g.heartbeat(member_id=b["member_id"], generation=1, now=2) == 0
    assert g.heartbeat(member_id=b["member_id"], generation=0, now=2) == ErrorCode.ILLEGAL_GENERATION
    assert g.heartbeat(member_id="nobody", generation=1, now=2) == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_leave_rebalances_and_a_silent_member_expires() -> None:
    g = _group()
    r1, r2 = _join(g, "", 0.0), _join(g, "", 0.0)
    g.tick(1.0)
    a, b = r1.value["member_id"], r2.value["member_id"]  # type: ignore[attr-defined]
    g.sync(member_id=a, generation=1, assignments=[(a, b"A"), (b, b"B")], now=1.0)
    assert g.leave(member_id=b, now=2.0) == 0
    assert g.heartbeat(member_id=a, generation=1, now=2.1) == ErrorCode.REBALANCE_IN_PROGRESS
    assert g.check_commit(member_id=a, generation=1) == 0  # may commit before rejoining
    again = _join(g, a, 2.2)
    assert again.value["generation_id"] == 2 and again.value["leader"] == a  # type: ignore[attr-defined]
    g.sync(member_id=a, generation=2, assignments=[(a, b"AB")], now=2.3)
    g.tick(20.0)  # a went silent for longer than its 10 s session
    assert g.members == {} and g.state is GroupState.EMPTY


def test_joins_with_a_bad_session_timeout_or_unknown_protocol_are_refused() -> None:
    g = _group()
    bad = g.join(member_id="", client_id="c", protocol_type="consumer",
                 protocols=[("range", b"")], session_timeout_ms=10, rebalance_timeout_ms=0,
                 now=0)
    assert bad.value["error_code"] == ErrorCode.INVALID_SESSION_TIMEOUT  # type: ignore[index]
    _join(g, "", 0.0)
    other = g.join(member_id="", client_id="c", protocol_type="consumer",
                   protocols=[("sticky", b"")], session_timeout_ms=10000,
                   rebalance_timeout_ms=0, now=0)
    assert other.value["error_code"] == ErrorCode.INCONSISTENT_GROUP_PROTOCOL  # type: ignore[index]
    assert g.check_commit(member_id="", generation=-1) == ErrorCode.UNKNOWN_MEMBER_ID


async def test_idle_partitions_shed_reader_state_and_readers_are_dropped() -> None:
    import trio
    import trio.testing

    from ledgerd.kafka.config import GatewayConfig
    from ledgerd.kafka.gateway import IDLE_S, Gateway

    class Part:
        def __init__(self, writer: object, idle: float) -> None:
            self.writer, self.appending = writer, False
            self.last_used = trio.current_time() - idle
            self.shed_calls = 0

        async def shed(self) -> None:
            self.shed_calls += 1

    class Client:
        store = None

    gw = Gateway(Client(), GatewayConfig())  # type: ignore[arg-type]
    parts = {("read", 0): Part(None, IDLE_S + 1), ("written", 0): Part(object(), IDLE_S + 1),
             ("busy", 0): Part(None, 1.0)}
    gw.partitions.update(parts)  # type: ignore[arg-type]
    await gw._sweep_idle()
    assert set(gw.partitions) == {("written", 0), ("busy", 0)}  # a writer stays
    assert [parts[k].shed_calls for k in (("read", 0), ("written", 0), ("busy", 0))] == [1, 1, 0]


def test_producer_memory_is_bounded_and_recent_producers_stay() -> None:
    from ledgerd.kafka.producer_state import MAX_PRODUCERS, ProducerState

    producers = ProducerState()
    for pid in range(MAX_PRODUCERS + 5):
        producers.note(pid, 0, 0, 0, pid)
        if pid == MAX_PRODUCERS - 1:  # producer 0 heard again just before the limit
            producers.note(0, 0, 1, 1, 100)
    assert len(producers) == MAX_PRODUCERS
    assert 0 in producers and 6 in producers  # the five least recently heard went:
    assert not {1, 2, 3, 4, 5} & set(producers)


# -- declarations against Kafka's own message schemas -----------------------------------

_JSON_NAMES = {ApiKey.OFFSET_FOR_LEADER_EPOCH: "OffsetForLeaderEpoch", ApiKey.FETCH: "Fetch",
               ApiKey.LIST_TRANSACTIONS: "ListTransactions",
               ApiKey.DESCRIBE_TRANSACTIONS: "DescribeTransactions",
               ApiKey.DESCRIBE_PRODUCERS: "DescribeProducers",
               ApiKey.DESCRIBE_LOG_DIRS: "DescribeLogDirs",
               ApiKey.METADATA: "Metadata", ApiKey.LIST_OFFSETS: "ListOffsets",
               ApiKey.OFFSET_COMMIT: "OffsetCommit", ApiKey.DESCRIBE_CLUSTER:
               "DescribeCluster"}


def _kafka_json(name: str) -> dict[str, object]:
    """Kafka's ``clients/src/main/resources/common/message/<name>.json``, as kafka-python
    bundles it (Kafka 4's: versions below each API's new minimum are gone)."""
    import importlib.resources
    import json

    raw = importlib.resources.read_text("kafka.protocol.schemas.resources", name + ".json")
    return json.loads("\n".join(line for line in raw.splitlines()
                                if not line.strip().startswith("//")))


def _in(spec: str, version: int) -> bool:
    if spec == "none":
        return False
    if spec.endswith("+"):
        return version >= int(spec[:-1])
    low, _, high = spec.partition("-")
    return int(low) <= version <= int(high or low)


def _shape_kafka(fields: list[dict[str, object]], version: int,
                 structs: dict[str, list[dict[str, object]]]) -> list[object]:
    """The wire shape of Kafka's fields at ``version``: kinds in order (tagged fields,
    which ride in the tag buffer, left out); strings and bytes by kind, nullable or not
    (the same bytes for a value that is not null)."""
    out: list[object] = []
    for f in fields:
        if not _in(str(f["versions"]), version) or "tag" in f:
            continue
        kind = str(f["type"])
        if kind.startswith("[]"):
            inner = kind[2:]
            sub = f.get("fields") or structs.get(inner)
            out.append(("array", _shape_kafka(sub, version, structs)  # type: ignore[arg-type]
                        if sub is not None else _kind(inner)))
        else:
            out.append(_kind(kind))
    return out


def _kind(kind: str) -> str:
    return {"records": "bytes"}.get(kind, kind)


def _shape_ours(fields: tuple[object, ...], version: int) -> list[object]:
    from ledgerd.kafka.schema import Array, Field
    out: list[object] = []
    for f in fields:
        assert isinstance(f, Field)
        if not f.present(version):
            continue
        if isinstance(f.kind, Array):
            out.append(("array", _shape_ours(f.kind.fields, version) if f.kind.of is None
                        else _kind(f.kind.of.name.replace("nullable_", ""))))
        else:
            out.append(_kind(f.kind.name.replace("nullable_", "")))
    return out


@pytest.mark.parametrize("api", list(_JSON_NAMES))
def test_declarations_match_kafkas_message_schemas(api: ApiKey) -> None:
    """Every version declared of the APIs with leader epochs and topic ids has the
    fields of Kafka's JSON schema, in its order, and is flexible where Kafka's is."""
    from ledgerd.kafka.api import DECLARED
    for suffix, ours in (("Request", REQUESTS[api]), ("Response", RESPONSES[api])):
        doc = _kafka_json(_JSON_NAMES[api] + suffix)
        structs = {str(s["name"]): s["fields"]  # type: ignore[index]
                   for s in doc.get("commonStructs", [])}  # type: ignore[attr-defined]
        first = int(str(doc["validVersions"]).split("-")[0].rstrip("+"))
        for version in range(max(first, DECLARED[api][0]), DECLARED[api][1] + 1):
            assert _in(str(doc["validVersions"]), version), (api, version)
            assert ours.is_flexible(version) == _in(str(doc["flexibleVersions"]), version), (
                api, suffix, version)
            assert _shape_ours(ours.fields, version) == _shape_kafka(
                doc["fields"], version, structs), (api, suffix, version)  # type: ignore[arg-type]


def _sample(fields: tuple[object, ...], version: int, seed: list[int]) -> dict[str, object]:
    """A value for every field present at ``version``, each array holding two elements,
    every scalar distinct (so a field read into its neighbour's place shows)."""
    from ledgerd.kafka.schema import (
        BOOL,
        BYTES,
        NULLABLE_BYTES,
        NULLABLE_STRING,
        STRING,
        UUID,
        Array,
        Field,
        Scalar,
        Struct,
    )

    def scalar(kind: Scalar) -> object:
        seed[0] += 1
        n = seed[0]
        if kind in (STRING, NULLABLE_STRING):
            return f"s{n}"
        if kind in (BYTES, NULLABLE_BYTES):
            return b"b%d" % n
        if kind is UUID:
            return bytes([n % 256]) * 16
        if kind is BOOL:
            return bool(n % 2)
        return n % 100

    out: dict[str, object] = {}
    for f in fields:
        assert isinstance(f, Field)
        if not f.present(version):
            continue
        if isinstance(f.kind, Struct):
            out[f.name] = _sample(f.kind.fields, version, seed)
        elif isinstance(f.kind, Array):
            of = f.kind.of
            out[f.name] = [scalar(of) if of is not None
                           else _sample(f.kind.fields, version, seed) for _ in range(2)]
        else:
            out[f.name] = scalar(f.kind)
    return out


@pytest.mark.parametrize("api", list(ApiKey))
def test_every_declared_version_round_trips_with_every_field_set(api: ApiKey) -> None:
    from ledgerd.kafka.api import DECLARED
    low, high = DECLARED[api]
    for version in range(low, high + 1):
        for message in (REQUESTS[api], RESPONSES[api]):
            value = _sample(message.fields, version, [0])
            back = decode(message, version, Reader(b"".join(encode(message, version, value))))
            assert _present(back, message.fields, version) == value, (api, version)


def _present(value: dict[str, object], fields: tuple[object, ...], version: int,
             ) -> dict[str, object]:
    from ledgerd.kafka.schema import Array, Field, Struct
    out: dict[str, object] = {}
    for f in fields:
        assert isinstance(f, Field)
        if f.present(version):
            v = value[f.name]
            if isinstance(f.kind, Struct) and v is not None:
                v = _present(v, f.kind.fields, version)  # type: ignore[arg-type]
            if isinstance(f.kind, Array) and f.kind.of is None:
                v = [_present(x, f.kind.fields, version) for x in v]  # type: ignore[attr-defined]
            out[f.name] = v
    return out


async def test_a_group_record_stays_deleted_when_a_save_races_delete_groups() -> None:
    """The group tick stores a group whose generation moved (a member left) while
    DeleteGroups deletes it: the record must stay gone, whether the save was half done
    (read, not yet written) when the delete came, or began after it from a stale list."""
    import trio
    import trio.testing

    from ledgerd.kafka.config import GatewayConfig
    from ledgerd.kafka.gateway import Gateway
    from ledgerd.kafka.groups import Group

    class Records:  # the group store: a save reads, waits for the test, then writes
        def __init__(self) -> None:
            self.held: set[str] = set()
            self.saving, self.go = trio.Event(), trio.Event()

        async def save(self, gid: str, generation: int, protocol_type: str) -> None:
            self.saving.set()
            await self.go.wait()
            self.held.add(gid)

        async def delete(self, gid: str) -> bool:
            found = gid in self.held
            self.held.discard(gid)
            return found

        async def get(self, gid: str) -> None:
            return None

    class Client:
        store = None

    gw = Gateway(Client(), GatewayConfig())  # type: ignore[arg-type]
    records = Records()
    gw.group_store = records  # type: ignore[assignment]
    gw.owns = lambda key: True  # type: ignore[method-assign]

    async def no_share_group(gid: str) -> int:  # (9ac63c5: DeleteGroups asks it first)
        return 69  # GROUP_ID_NOT_FOUND

    gw.share.delete_group = no_share_group  # type: ignore[method-assign]

    async def no_pending(gid: str) -> None:  # (no transaction offsets in these tests)
        pass

    gw.txn.forget_group = no_pending  # type: ignore[method-assign]

    async def no_topics() -> list[str]:
        return []

    gw.all_topics = no_topics  # type: ignore[method-assign]

    class NoOffsets:  # the offset index: complete, and the group has no offsets
        async def complete(self) -> bool:
            return True

        async def drop_group(self, group: str) -> int:
            return 0

    gw.offset_index = NoOffsets()  # type: ignore[assignment]
    group = gw.groups.setdefault("g", Group("g", gw.group_settings))
    group.generation, group.persisted = 2, 1
    codes: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gw._store_group, group)
        await records.saving.wait()  # the save has read the record, not written it

        async def delete() -> None:
            codes.append(await gw._delete_group("g"))

        nursery.start_soon(delete)
        await trio.testing.wait_all_tasks_blocked()
        records.go.set()
    assert codes == [0] and "g" not in gw.groups
    assert records.held == set()
    await gw._store_group(group)  # the tick's list, taken before the delete
    assert records.held == set()


async def test_the_groups_of_one_delete_groups_are_deleted_side_by_side_answered_in_order(
        ) -> None:
    """Each group's deletion waits for ZooKeeper: three groups' deletions are in flight
    at once (a client's request timeout covers the whole request). A name given twice
    is deleted once; its second answer, and an unknown group's, is GROUP_ID_NOT_FOUND."""
    import trio

    from ledgerd.kafka.config import GatewayConfig
    from ledgerd.kafka.gateway import Gateway
    from ledgerd.kafka.groups import Group

    class Records:
        async def delete(self, gid: str) -> bool:
            return True

        async def get(self, gid: str) -> None:
            return None

    class Client:
        store = None

    gw = Gateway(Client(), GatewayConfig())  # type: ignore[arg-type]
    gw.group_store = Records()  # type: ignore[assignment]
    gw.owns = lambda key: True  # type: ignore[method-assign]

    async def no_share_group(gid: str) -> int:  # (9ac63c5: DeleteGroups asks it first)
        return 69  # GROUP_ID_NOT_FOUND

    gw.share.delete_group = no_share_group  # type: ignore[method-assign]

    async def no_pending(gid: str) -> None:  # (no transaction offsets in these tests)
        pass

    gw.txn.forget_group = no_pending  # type: ignore[method-assign]
    inside: set[str] = set()
    all_in = trio.Event()

    class Offsets:  # every deletion waits here until all three are inside
        async def complete(self) -> bool:
            return True

        async def drop_group(self, group: str) -> int:
            if group not in {"a", "b", "c"} - inside:
                return 0  # no offsets (left)
            inside.add(group)
            if len(inside) == 3:
                all_in.set()
            await all_in.wait()
            return 1

    gw.offset_index = Offsets()  # type: ignore[assignment]
    for gid in ("a", "b", "c"):
        gw.groups[gid] = Group(gid, gw.group_settings)
        gw.groups[gid].generation = 1
    with trio.fail_after(10):
        reply = await gw.delete_groups(None, 2, {  # type: ignore[arg-type]
            "groups_names": ["c", "a", "zz", "b", "a"]})
    assert reply == {"results": [
        {"group_id": "c", "error_code": 0}, {"group_id": "a", "error_code": 0},
        {"group_id": "zz", "error_code": ErrorCode.GROUP_ID_NOT_FOUND},
        {"group_id": "b", "error_code": 0},
        {"group_id": "a", "error_code": ErrorCode.GROUP_ID_NOT_FOUND}]}
    assert not {"a", "b", "c"} & gw.groups.keys()


async def test_a_partitions_header_topic_is_encoded_again_only_when_it_changed() -> None:
    """The topic cache makes a new record object each time it reads the znode (about a
    second apart, on most requests): the header's topic is encoded again only when what
    it keeps of the record changed, not per request and partition."""
    from dataclasses import replace

    from ledgerd.kafka.config import GatewayConfig
    from ledgerd.kafka.gateway import Gateway
    from ledgerd.metadata.kafka_topics import TopicOrigin, TopicRecord

    class Client:
        store = None

    class Topics:
        record = TopicRecord(partitions=2, configs={"retention.ms": "1"}, log_start={1: 9})

        def cached(self, topic: str) -> TopicRecord:
            return replace(self.record)  # equal, never the same object

    gw = Gateway(Client(), GatewayConfig())  # type: ignore[arg-type]
    topics = Topics()
    gw.topic_store = topics  # type: ignore[assignment]
    first = gw.partition("t", 0).header_extra
    assert gw.partition("t", 0).header_extra is first  # equal record: not encoded again
    topics.record = topics.record.with_start(1, 20)  # another partition's low watermark
    assert gw.partition("t", 0).header_extra is first
    topics.record = replace(topics.record, configs={"retention.ms": "2"})
    changed = gw.partition("t", 0).header_extra
    origin = TopicOrigin.from_extra(changed)
    assert origin is not None and origin.record.configs == {"retention.ms": "2"}
