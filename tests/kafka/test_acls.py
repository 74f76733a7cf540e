"""The authorizer's decisions (``ledgerd/kafka/acls.py``) and what requests need
(``authorization.py``), without sockets: bindings in, decisions out."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.kafka.acls import (
    AclFilter,
    AclSettings,
    Authorizer,
    Resource,
    cluster,
    parse_super_users,
)
from ledgerd.kafka.api import ApiKey, ErrorCode
from ledgerd.kafka.authorization import verdict
from ledgerd.metadata.kafka_acls import (
    AclBinding,
    AclOperation,
    AclPermission,
    InvalidAclError,
    PatternType,
    ResourceType,
)

Op, Perm, Pat, RT = AclOperation, AclPermission, PatternType, ResourceType
ALICE, BOB = "User:alice", "User:bob"


def acl(name: str, op: AclOperation = Op.READ, perm: AclPermission = Perm.ALLOW, *,
        principal: str = ALICE, host: str = "*", pattern: PatternType = Pat.LITERAL,
        rtype: ResourceType = RT.TOPIC) -> AclBinding:
    return AclBinding(resource_type=rtype, resource_name=name, pattern_type=pattern,
                      principal=principal, host=host, operation=op, permission=perm)


def topic(name: str) -> Resource:
    return Resource(RT.TOPIC, name)


def authorizer(*bindings: AclBinding, open_: bool = True,
               supers: str = "") -> Authorizer:
    return Authorizer(bindings, AclSettings(allow_if_no_acl=open_,
                                            super_users=parse_super_users(supers)))


def test_no_acl_on_a_resource_follows_allow_everyone_if_no_acl_found() -> None:
    open_, closed = authorizer(acl("other")), authorizer(acl("other"), open_=False)
    assert open_.authorize(BOB, "10.0.0.1", Op.WRITE, topic("t"))
    assert not closed.authorize(BOB, "10.0.0.1", Op.WRITE, topic("t"))
    assert authorizer().is_open and not authorizer(open_=False).is_open
    assert not authorizer(acl("t")).is_open


def test_once_a_resource_has_acls_only_what_they_allow_is_allowed() -> None:
    a = authorizer(acl("t", Op.READ))
    assert a.authorize(ALICE, "10.0.0.1", Op.READ, topic("t"))
    assert not a.authorize(ALICE, "10.0.0.1", Op.WRITE, topic("t"))
    assert not a.authorize(BOB, "10.0.0.1", Op.READ, topic("t"))  # another principal
    # a group of the same name has no ACLs: open (allow.everyone.if.no.acl.found)
    assert a.authorize(BOB, "10.0.0.1", Op.READ, Resource(RT.GROUP, "t"))


def test_deny_wins_over_allow_and_all_covers_every_operation() -> None:
    a = authorizer(acl("t", Op.ALL), acl("t", Op.WRITE, Perm.DENY))
    assert a.authorize(ALICE, "h", Op.READ, topic("t"))
    assert a.authorize(ALICE, "h", Op.ALTER_CONFIGS, topic("t"))
    assert not a.authorize(ALICE, "h", Op.WRITE, topic("t"))
    everyone_denied = authorizer(acl("t", Op.ALL), acl("t", Op.ALL, Perm.DENY,
                                                         principal="User:*"))
    assert not everyone_denied.authorize(ALICE, "h", Op.READ, topic("t"))


def test_describe_is_implied_by_read_write_delete_alter_and_describe_configs_by_alter() -> None:
    for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        assert authorizer(acl("t", op)).authorize(ALICE, "h", Op.DESCRIBE, topic("t"))
    assert not authorizer(acl("t", Op.CREATE)).authorize(ALICE, "h", Op.DESCRIBE, topic("t"))
    a = authorizer(acl("t", Op.ALTER_CONFIGS))
    assert a.authorize(ALICE, "h", Op.DESCRIBE_CONFIGS, topic("t"))
    # a DENY of READ does not deny DESCRIBE (Kafka: denials are not implied)
    a = authorizer(acl("t", Op.DESCRIBE), acl("t", Op.READ, Perm.DENY))
    assert a.authorize(ALICE, "h", Op.DESCRIBE, topic("t"))


def test_patterns_literal_wildcard_and_prefixed_apply_to_names() -> None:
    a = authorizer(acl("orders-", Op.WRITE, pattern=Pat.PREFIXED), acl("*", Op.READ))
    assert a.authorize(ALICE, "h", Op.WRITE, topic("orders-eu"))
    assert not a.authorize(ALICE, "h", Op.WRITE, topic("order"))
    assert a.authorize(ALICE, "h", Op.READ, topic("anything"))
    assert a.bindings_for(Resource(RT.GROUP, "anything")) == []  # patterns are per type


def test_principal_and_host_wildcards_and_super_users() -> None:
    a = authorizer(acl("t", Op.READ, principal="User:*", host="10.0.0.1"), open_=False,
                   supers="User:root; User:admin")
    assert a.authorize(BOB, "10.0.0.1", Op.READ, topic("t"))
    assert not a.authorize(BOB, "10.0.0.2", Op.READ, topic("t"))
    assert a.authorize("User:admin", "10.0.0.2", Op.DELETE, topic("t"))
    assert a.authorize("User:root", "x", Op.ALTER, cluster())


def test_authorized_operations_is_one_bit_per_allowed_operation() -> None:
    a = authorizer(acl("g", Op.READ, rtype=RT.GROUP))
    bits = a.authorized_operations(ALICE, "h", Resource(RT.GROUP, "g"))
    assert bits == (1 << Op.READ) | (1 << Op.DESCRIBE)  # DESCRIBE implied; not DELETE
    assert a.authorized_operations(BOB, "h", Resource(RT.GROUP, "g")) == 0
    every = authorizer().authorized_operations(BOB, "h", cluster())
    assert every == sum(1 << op for op in (Op.CREATE, Op.CLUSTER_ACTION, Op.DESCRIBE_CONFIGS,
                                           Op.ALTER_CONFIGS, Op.IDEMPOTENT_WRITE, Op.ALTER,
                                           Op.DESCRIBE))


# few operations, so that bindings meet often enough to disagree if the rules do
_OPS = [Op.READ, Op.WRITE, Op.DESCRIBE, Op.ALTER, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS]
_names = st.sampled_from(["t", "t1", "t2", "tx", "*", "u"])
_bindings = st.builds(
    acl, _names, st.sampled_from([*_OPS, Op.ALL]),
    st.sampled_from([Perm.ALLOW, Perm.DENY]),
    principal=st.sampled_from([ALICE, BOB, "User:*"]), host=st.sampled_from(["*", "h1"]),
    pattern=st.sampled_from([Pat.LITERAL, Pat.PREFIXED]))


def _reference(bindings: list[AclBinding], principal: str, host: str, op: AclOperation,
               name: str, allow_if_none: bool) -> bool:
    """The rules as Kafka's documentation states them, written out longhand."""
    def covers(b: AclBinding) -> bool:
        if b.pattern_type is Pat.LITERAL:
            return b.resource_name == name or b.resource_name == "*"
        return name[:len(b.resource_name)] == b.resource_name

    on = [b for b in bindings if b.resource_type is RT.TOPIC and covers(b)]
    if not on:
        return allow_if_none
    mine = [b for b in on if b.principal in (principal, "User:*") and b.host in (host, "*")]
    for b in mine:
        if b.permission is Perm.DENY and (b.operation is op or b.operation is Op.ALL):
            return False
    implied = {Op.DESCRIBE: {Op.DESCRIBE, Op.READ, Op.WRITE, Op.DELETE, Op.ALTER},
               Op.DESCRIBE_CONFIGS: {Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS}}.get(op, {op})
    return any(b.permission is Perm.ALLOW and (b.operation is Op.ALL or b.operation in implied)
               for b in mine)


@settings(max_examples=300, deadline=None)
@given(bindings=st.lists(_bindings, max_size=8), principal=st.sampled_from([ALICE, BOB]),
       host=st.sampled_from(["h1", "h2"]), op=st.sampled_from(_OPS),
       name=st.sampled_from(["t", "t1", "tx2", "u"]), allow_if_none=st.booleans())
def test_decisions_agree_with_the_rules_written_longhand(
        bindings: list[AclBinding], principal: str, host: str, op: AclOperation, name: str,
        allow_if_none: bool) -> None:
    a = authorizer(*bindings, open_=allow_if_none)
    assert a.authorize(principal, host, op, topic(name)) == _reference(
        bindings, principal, host, op, name, allow_if_none)
    bits = a.authorized_operations(principal, host, topic(name))
    for o in (Op.READ, Op.WRITE, Op.DESCRIBE, Op.ALTER_CONFIGS):
        assert bool(bits & (1 << o)) == a.authorize(principal, host, o, topic(name))


def test_filters_any_match_and_exact() -> None:
    lit, pre = acl("orders"), acl("ord", Op.WRITE, pattern=Pat.PREFIXED)
    wild = acl("*", Op.DESCRIBE)
    match = AclFilter(resource_type=RT.TOPIC, resource_name="orders", pattern_type=Pat.MATCH)
    assert [b for b in (lit, pre, wild) if match.matches(b)] == [lit, pre, wild]
    any_ = AclFilter(resource_name="orders", pattern_type=Pat.ANY)
    assert [b for b in (lit, pre, wild) if any_.matches(b)] == [lit]
    exact = AclFilter(resource_name="ord", pattern_type=Pat.PREFIXED, operation=Op.WRITE)
    assert [b for b in (lit, pre, wild) if exact.matches(b)] == [pre]
    by_principal = AclFilter(principal=BOB)
    assert not any(by_principal.matches(b) for b in (lit, pre, wild))
    assert AclFilter().matches(lit) and not AclFilter(resource_type=RT.GROUP).matches(lit)
    assert AclFilter(pattern_type=Pat.UNKNOWN).invalid() is not None


@pytest.mark.parametrize("bad", [
    dict(rtype=RT.ANY), dict(pattern=Pat.MATCH), dict(principal="alice"),
    dict(op=Op.ANY), dict(perm=Perm.ANY), dict(host=""),
    dict(rtype=RT.CLUSTER)])  # the cluster's only name is kafka-cluster
def test_invalid_bindings_are_refused_naming_why(bad: dict[str, object]) -> None:
    args: dict[str, object] = dict(op=Op.READ, perm=Perm.ALLOW, principal=ALICE, host="*",
                                   pattern=Pat.LITERAL, rtype=RT.TOPIC)
    args.update(bad)
    with pytest.raises(InvalidAclError):
        acl("t", **args)  # type: ignore[arg-type]


def test_a_produce_refused_per_topic_and_a_transaction_as_a_whole() -> None:
    a = authorizer(acl("t", Op.WRITE, Perm.DENY, principal="User:*"),
                   acl("tx", Op.WRITE, rtype=RT.TRANSACTIONAL_ID))

    def allows(who: str) -> Callable[[AclOperation, Resource], bool]:
        return lambda op, res: a.authorize(who, "h", op, res)

    produce = {"transactional_id": None, "topic_data": [{"name": "t"}, {"name": "u"}]}
    judged = verdict(ApiKey.PRODUCE, produce, allows(ALICE))
    assert judged.refuse is None and judged.topics == {"t"}
    txn = {**produce, "transactional_id": "tx"}
    assert verdict(ApiKey.PRODUCE, txn, allows(BOB)).refuse == \
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    # CreateTopics: CREATE on the topic or on the cluster
    creator = authorizer(acl("kafka-cluster", Op.CREATE, rtype=RT.CLUSTER), open_=False)
    body = {"topics": [{"name": "new"}]}
    assert verdict(ApiKey.CREATE_TOPICS, body,
                   lambda op, res: creator.authorize(ALICE, "h", op, res)).refuse is None
    assert verdict(ApiKey.CREATE_TOPICS, body,
                   lambda op, res: creator.authorize(BOB, "h", op, res)).refuse == \
        ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert verdict(ApiKey.DELETE_GROUPS, {"groups_names": ["g"]},
                   lambda op, res: False).refuse == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert verdict(ApiKey.CREATE_ACLS, {"creations": []},
                   lambda op, res: False).refuse == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
