"""The Kafka ACL record (``metadata/kafka_acls.py``) on the in-memory twin and on
ZooKeeper: adds and removes by compare-and-set, concurrent changes all kept."""

from __future__ import annotations

import pytest
import trio

from ledgerd.metadata.errors import ChangeRejectedError, CorruptMetadataError
from ledgerd.metadata.kafka_acls import (
    AclBinding,
    AclOperation,
    AclPermission,
    AclStore,
    PatternType,
    ResourceType,
)
from tests.metadata.conftest import StoreFactory

ROOT = "/ledgers/kafka"


def _acl(name: str, principal: str = "User:alice",
         op: AclOperation = AclOperation.READ) -> AclBinding:
    return AclBinding(resource_type=ResourceType.TOPIC, resource_name=name,
                      pattern_type=PatternType.LITERAL, principal=principal, host="*",
                      operation=op, permission=AclPermission.ALLOW)


async def test_bindings_are_added_once_and_removed_by_predicate(stores: StoreFactory) -> None:
    acls = AclStore(await stores.open(), ROOT)
    assert await acls.bindings() == ()
    assert await acls.remove(lambda b: True) == ()  # no record yet: nothing to delete
    a, b, c = _acl("t1"), _acl("t2"), _acl("t2", "User:bob")
    assert await acls.add([a, b]) == (a, b)
    assert await acls.add([b, c, c]) == (a, b, c)  # b kept once, c added once
    other = AclStore(await stores.open(), ROOT)  # another gateway reads the same set
    assert await other.bindings() == (a, b, c)
    assert await other.remove(lambda x: x.resource_name == "t2") == (b, c)
    assert await acls.bindings() == (a,)


async def test_concurrent_adds_from_two_gateways_are_all_kept(stores: StoreFactory) -> None:
    one, two = AclStore(await stores.open(), ROOT), AclStore(await stores.open(), ROOT)
    wanted = [_acl(f"t{i}") for i in range(20)]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i, binding in enumerate(wanted):
                nursery.start_soon((one if i % 2 else two).add, [binding])
    assert sorted(await one.bindings(), key=lambda b: b.resource_name) == \
        sorted(wanted, key=lambda b: b.resource_name)


async def test_a_set_past_the_record_limit_is_refused_and_unchanged(
        stores: StoreFactory) -> None:
    acls = AclStore(await stores.open(), ROOT)
    acls.MAX_BYTES = 2000
    await acls.add([_acl("first")])
    with pytest.raises(ChangeRejectedError):
        await acls.add([_acl(f"topic-{i}") for i in range(100)])
    assert await acls.bindings() == (_acl("first"),)


async def test_a_record_that_does_not_parse_is_corrupt_metadata(stores: StoreFactory) -> None:
    store = await stores.open()
    await store.create(f"{ROOT}/acls", b'{"format": 1, "acls": [[2, "t", 9, "User:a"]]}',
                       make_parents=True)
    with pytest.raises(CorruptMetadataError):
        await AclStore(store, ROOT).bindings()
