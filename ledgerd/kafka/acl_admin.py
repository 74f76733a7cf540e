"""The gateway's ACLs: CreateAcls, DescribeAcls and DeleteAcls, and the authorizer each
request is judged by.

The bindings live in ZooKeeper (``metadata/kafka_acls.py``, one record changed by
compare-and-set); the decisions are ``acls.py``'s and what each request needs is
``authorization.py``'s. Each gateway judges requests with the bindings as read within
``TTL_S`` (a binding created or deleted through another gateway applies here by then,
as Kafka's brokers apply ACL changes when their change notification arrives); the
gateway that changes them applies the change at once. DescribeAcls and DeleteAcls
read the record itself, never the cache. A failed read keeps the set last read (and
is logged): requests are judged by the last known ACLs rather than refused wholesale.

A connection's principal is ``User:<name>`` of the principal its certificate or SASL
PLAIN proved, ``User:ANONYMOUS`` otherwise; its host is its peer address.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import trio

from ledgerd.base.logs import fields
from ledgerd.base.tls import Principal
from ledgerd.kafka.acls import (
    ANONYMOUS_PRINCIPAL,
    AclFilter,
    AclSettings,
    Authorizer,
    Resource,
    cluster,
)
from ledgerd.kafka.api import ErrorCode
from ledgerd.metadata.errors import ChangeRejectedError, MetadataError
from ledgerd.metadata.kafka_acls import (
    AclBinding,
    AclOperation,
    AclPermission,
    AclStore,
    InvalidAclError,
    PatternType,
    ResourceType,
)
from ledgerd.metadata.store import MetadataStore

__all__ = ["TTL_S", "GatewayAcls", "client_address", "principal_name"]

log = logging.getLogger(__name__)

TTL_S = 1.0  # the bindings a gateway judges by are read again after this long
E = TypeVar("E", ResourceType, PatternType, AclOperation, AclPermission)


class _Connection(Protocol):
    peer: str
    principal: Principal


def principal_name(principal: Principal) -> str:
    """The Kafka principal of a connection: ``User:<name>`` once proved."""
    return f"User:{principal.name}" if principal.authenticated else ANONYMOUS_PRINCIPAL


def client_address(peer: str) -> str:
    """The host an ACL names: the peer's address without its port."""
    return peer.rsplit(":", 1)[0].strip("[]")


def _enum(cls: type[E], value: int) -> E:
    try:
        return cls(value)
    except ValueError:
        return cls(0)  # UNKNOWN


def _filter(f: dict[str, Any]) -> AclFilter:
    return AclFilter(resource_type=_enum(ResourceType, f["resource_type_filter"]),
                     resource_name=f["resource_name_filter"],
                     pattern_type=_enum(PatternType, f["pattern_type_filter"]),
                     principal=f["principal_filter"], host=f["host_filter"],
                     operation=_enum(AclOperation, f["operation"]),
                     permission=_enum(AclPermission, f["permission_type"]))


def _binding(c: dict[str, Any]) -> AclBinding:
    """Raises InvalidAclError."""
    return AclBinding(resource_type=_enum(ResourceType, c["resource_type"]),
                      resource_name=c["resource_name"],
                      pattern_type=_enum(PatternType, c["resource_pattern_type"]),
                      principal=c["principal"], host=c["host"],
                      operation=_enum(AclOperation, c["operation"]),
                      permission=_enum(AclPermission, c["permission_type"]))


def _topic(name: str) -> Resource:
    return Resource(ResourceType.TOPIC, name)


def _entry(b: AclBinding) -> dict[str, Any]:
    return {"principal": b.principal, "host": b.host, "operation": int(b.operation),
            "permission_type": int(b.permission)}


class GatewayAcls:
    """The ACL bindings of the gateways under ``kafka_root``, their authorizer and the
    ACL admin APIs."""

    def __init__(self, store: MetadataStore, kafka_root: str, settings: AclSettings) -> None:
        self.store = AclStore(store, kafka_root)
        self.settings = settings
        self._authorizer = Authorizer((), settings)
        self._read_at = -math.inf

    async def current(self) -> Authorizer:
        """The authorizer over the bindings as read within ``TTL_S``. If cancelled,
        the cached one stays."""
        now = trio.current_time()
        if now - self._read_at >= TTL_S:
            try:
                self._set(await self.store.bindings())
            except MetadataError as exc:
                log.warning("kafka_acls_unread", extra=fields(error=str(exc)))
            self._read_at = now
        return self._authorizer

    def _set(self, bindings: tuple[AclBinding, ...]) -> None:
        self._authorizer = Authorizer(bindings, self.settings)
        self._read_at = trio.current_time()

    @property
    def cached(self) -> Authorizer:
        return self._authorizer

    def allows(self, conn: _Connection) -> Callable[[AclOperation, Resource], bool]:
        """The cached authorizer's decision for ``conn``'s principal and host."""
        principal, host = principal_name(conn.principal), client_address(conn.peer)
        authorizer = self._authorizer
        return lambda op, resource: authorizer.authorize(principal, host, op, resource)

    def authorized_operations(self, principal: Principal, resource: Resource, *,
                              peer: str = "") -> int:
        """Kafka's authorized-operations bitfield of ``resource`` for ``principal``
        (connected from ``peer``), by the bindings last read: what DescribeGroups,
        DescribeCluster and Metadata v8+ (its topics and cluster) answer when asked."""
        return self._authorizer.authorized_operations(
            principal_name(principal), client_address(peer) if peer else "", resource)

    async def authorized_metadata(
            self, handler: Callable[[Any, int, dict[str, Any]], Awaitable[dict[str, Any]]],
            conn: _Connection, version: int, body: dict[str, Any]) -> dict[str, Any]:
        """Metadata as Kafka authorizes it, around the gateway's ``handler``: a topic
        named without DESCRIBE is answered TOPIC_AUTHORIZATION_FAILED (and not
        created), a listing of every topic leaves out those without DESCRIBE, and a
        topic that would be auto-created without CREATE (on the topic or the cluster)
        is answered TOPIC_AUTHORIZATION_FAILED instead of UNKNOWN_TOPIC_OR_PARTITION."""
        authorizer = await self.current()
        if authorizer.is_open:
            return self._with_operations(conn, version, body,
                                         await handler(conn, version, body))
        allowed = self.allows(conn)
        wanted = body["topics"]
        hidden = {t["name"] for t in wanted or ()  # (None: an id no topic has)
                  if t["name"] is not None
                  and not allowed(AclOperation.DESCRIBE, _topic(t["name"]))}
        if hidden:
            body = {**body, "topics": [t for t in wanted if t["name"] not in hidden]}
        reply = await handler(conn, version, body)
        # every named topic refused: the reply lists none (Metadata v0 reads an empty
        # list as "every topic")
        served = [] if hidden and not body["topics"] else reply["topics"]
        topics = []
        for t in served:
            if wanted is None or (version == 0 and not wanted):  # a listing
                if allowed(AclOperation.DESCRIBE, _topic(t["name"])):
                    topics.append(t)
                continue
            if t["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and not (
                    allowed(AclOperation.CREATE, _topic(t["name"]))
                    or allowed(AclOperation.CREATE, cluster())):
                t = {**t, "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
            topics.append(t)
        topics += [{"error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "name": n,
                    "partitions": []} for n in sorted(hidden)]
        return self._with_operations(conn, version, body, {**reply, "topics": topics})

    def _with_operations(self, conn: _Connection, version: int, body: dict[str, Any],
                         reply: dict[str, Any]) -> dict[str, Any]:
        """Metadata v8+: the topics' (and, v8-10, the cluster's) authorized operations,
        where the request asks for them (KIP-430); a topic refused keeps the "not
        requested" value, as Kafka answers it."""
        if version < 8:
            return reply
        if body.get("include_topic_authorized_operations"):
            reply = {**reply, "topics": [
                t if t["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED else {
                    **t, "topic_authorized_operations": self.authorized_operations(
                        conn.principal, _topic(t["name"]), peer=conn.peer)}
                for t in reply["topics"]]}
        if version <= 10 and body.get("include_cluster_authorized_operations"):
            reply = {**reply, "cluster_authorized_operations": self.authorized_operations(
                conn.principal, cluster(), peer=conn.peer)}
        return reply

    async def authorized_list_groups(
            self, handler: Callable[[Any, int, dict[str, Any]], Awaitable[dict[str, Any]]],
            conn: _Connection, version: int, body: dict[str, Any]) -> dict[str, Any]:
        """ListGroups as Kafka authorizes it, around the gateway's ``handler``: every
        group for DESCRIBE on the cluster, else those the principal may DESCRIBE."""
        reply = await handler(conn, version, body)
        authorizer = await self.current()
        allowed = self.allows(conn)
        if authorizer.is_open or allowed(AclOperation.DESCRIBE, cluster()):
            return reply
        return {**reply, "groups": [
            g for g in reply["groups"]
            if allowed(AclOperation.DESCRIBE, Resource(ResourceType.GROUP, g["group_id"]))]}

    # -- the ACL APIs -------------------------------------------------------------------

    async def create_acls(self, conn: _Connection, version: int, body: dict[str, Any],
                          ) -> dict[str, Any]:
        results: list[dict[str, Any]] = []
        wanted: list[AclBinding] = []
        for c in body["creations"]:
            try:
                wanted.append(_binding(c))
                results.append({"error_code": 0, "error_message": None})
            except InvalidAclError as exc:
                results.append({"error_code": ErrorCode.INVALID_REQUEST,
                                "error_message": str(exc)})
        if wanted:
            try:
                self._set(await self.store.add(wanted))
            except ChangeRejectedError as exc:
                for r in results:
                    if not r["error_code"]:
                        r.update(error_code=ErrorCode.POLICY_VIOLATION,
                                 error_message=str(exc))
            else:
                log.info("kafka_acls_created", extra=fields(
                    principal=principal_name(conn.principal), count=len(wanted)))
        return {"results": results}

    async def describe_acls(self, conn: _Connection, version: int, body: dict[str, Any],
                            ) -> dict[str, Any]:
        f = _filter(body)
        why = f.invalid()
        if why is not None:
            return {"error_code": ErrorCode.INVALID_REQUEST, "error_message": why}
        bindings = await self.store.bindings()
        self._set(bindings)
        resources: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
        for b in bindings:
            if f.matches(b):
                key = (int(b.resource_type), b.resource_name, int(b.pattern_type))
                resources.setdefault(key, []).append(_entry(b))
        return {"error_code": 0, "error_message": None, "resources": [
            {"resource_type": rt, "resource_name": name, "pattern_type": pt, "acls": acls}
            for (rt, name, pt), acls in resources.items()]}

    async def delete_acls(self, conn: _Connection, version: int, body: dict[str, Any],
                          ) -> dict[str, Any]:
        filters = [_filter(f) for f in body["filters"]]
        valid = [f for f in filters if f.invalid() is None]
        removed = await self.store.remove(lambda b: any(f.matches(b) for f in valid)) \
            if valid else ()
        if removed:
            self._set(await self.store.bindings())
            log.info("kafka_acls_deleted", extra=fields(
                principal=principal_name(conn.principal), count=len(removed)))
        out = []
        for f in filters:
            why = f.invalid()
            if why is not None:
                out.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": why})
                continue
            out.append({"error_code": 0, "error_message": None, "matching_acls": [
                {"error_code": 0, "error_message": None,
                 "resource_type": int(b.resource_type), "resource_name": b.resource_name,
                 "pattern_type": int(b.pattern_type), **_entry(b)}
                for b in removed if f.matches(b)]})
        return {"filter_results": out}
