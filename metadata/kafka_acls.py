"""Kafka ACL bindings: ``<root>/kafka/acls``, one record holding every binding.

The Kafka gateway's authorizer (``ledgerd/kafka/acls.py`` decides, ``acl_admin.py``
serves CreateAcls, DescribeAcls and DeleteAcls) keeps the ACLs Kafka's ``AclAuthorizer``
keeps: a binding is a resource pattern (resource type, name, LITERAL or PREFIXED) and an
access control entry (principal ``Type:name``, host, operation, ALLOW or DENY). JSON::

    {"format": 1, "acls": [[resource_type, name, pattern_type, principal, host,
                            operation, permission], ...]}

with Kafka's numbers for the enums (those of the wire, ``AclOperation.code()`` ...),
declared once (``AclRecord``, through ``jsondoc``).
One record, not one per resource as Kafka's ZooKeeper layout has: every gateway reads
the whole set at once to authorize (one read per ``TTL``), and a change is one
compare-and-set (``AclStore.add`` / ``remove``), so two admins creating or deleting at
once never undo each other. ZooKeeper's 1 MiB node limit bounds the set at about ten
thousand bindings; a change that would pass it fails (``AclStore.MAX_BYTES``).

Pure record types and a thin store; no trio.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from ledgerd.base.errors import LedgerdError
from ledgerd.metadata.cas import cas_update
from ledgerd.metadata.errors import ChangeRejectedError, NodeExistsError, NoNodeError
from ledgerd.metadata.jsondoc import Codec, decode, encode, json_field
from ledgerd.metadata.paths import kafka_acls_path
from ledgerd.metadata.store import MetadataStore

__all__ = ["CLUSTER_NAME", "WILDCARD", "AclBinding", "AclOperation", "AclPermission",
           "AclStore", "InvalidAclError", "PatternType", "ResourceType"]

WILDCARD = "*"  # a literal resource name, principal name or host that matches any
CLUSTER_NAME = "kafka-cluster"  # the one name of the CLUSTER resource


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only: either kind, the name compared as it is
    MATCH = 2  # filters only: every binding that would apply to the name
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    DENY = 2
    ALLOW = 3


class InvalidAclError(LedgerdError, ValueError):
    """A binding that cannot be stored (Kafka: InvalidRequestException); ``reason``
    names the field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AclBinding:
    """One ACL, as stored: every field concrete (no ANY, MATCH or UNKNOWN)."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str  # "User:alice", "User:*"
    host: str  # an address, or "*"
    operation: AclOperation
    permission: AclPermission

    def __post_init__(self) -> None:
        if self.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            raise InvalidAclError(f"resource type {self.resource_type.name} names no "
                                  "resource")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAclError(f"pattern type {self.pattern_type.name}: a binding is "
                                  "LITERAL or PREFIXED")
        if not self.resource_name:
            raise InvalidAclError("an empty resource name")
        if self.resource_type is ResourceType.CLUSTER and (
                self.resource_name != CLUSTER_NAME
                or self.pattern_type is not PatternType.LITERAL):
            raise InvalidAclError(f"the only valid name for the CLUSTER resource is the "
                                  f"literal {CLUSTER_NAME!r}")
        kind, sep, name = self.principal.partition(":")
        if not sep or not kind or not name:
            raise InvalidAclError(f"principal {self.principal!r}: not of the form "
                                  "Type:name (User:alice)")
        if not self.host:
            raise InvalidAclError("an empty host (use '*' for any)")
        if self.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
            raise InvalidAclError(f"operation {self.operation.name} is not one an ACL "
                                  "grants")
        if self.permission not in (AclPermission.ALLOW, AclPermission.DENY):
            raise InvalidAclError(f"permission {self.permission.name}: ALLOW or DENY")

    def to_list(self) -> list[object]:
        return [int(self.resource_type), self.resource_name, int(self.pattern_type),
                self.principal, self.host, int(self.operation), int(self.permission)]

    @classmethod
    def from_list(cls, item: list[Any]) -> AclBinding:
        rt, name, pt, principal, host, op, perm = item
        return cls(resource_type=ResourceType(int(rt)), resource_name=str(name),
                   pattern_type=PatternType(int(pt)), principal=str(principal),
                   host=str(host), operation=AclOperation(int(op)),
                   permission=AclPermission(int(perm)))


def _load_bindings(value: object) -> tuple[AclBinding, ...]:
    if not isinstance(value, list) or not all(isinstance(b, list) for b in value):
        raise TypeError(f"expected lists of binding fields, got {value!r}")
    return tuple(AclBinding.from_list(item) for item in value)


BINDINGS: Codec[tuple[AclBinding, ...]] = Codec(lambda t: [b.to_list() for b in t],
                                                _load_bindings)


@dataclass(frozen=True, slots=True, kw_only=True)
class AclRecord:
    """The record: every binding, in the order they were created."""

    FORMAT: ClassVar[int] = 1
    UNVERSIONED: ClassVar[int | None] = None

    bindings: tuple[AclBinding, ...] = json_field("acls", BINDINGS, default=())


def _decode(raw: bytes, path: str) -> tuple[AclBinding, ...]:
    return decode(AclRecord, raw, path).bindings


def _encode(bindings: tuple[AclBinding, ...]) -> bytes:
    return encode(AclRecord(bindings=bindings))


class AclStore:
    """The ACL bindings under ``kafka_root``."""

    MAX_BYTES = 1000 << 10  # below ZooKeeper's jute.maxbuffer (1 MiB)

    def __init__(self, store: MetadataStore, kafka_root: str) -> None:
        self.store = store
        self.path = kafka_acls_path(kafka_root)

    async def bindings(self) -> tuple[AclBinding, ...]:
        """Every binding, in the order they were created (none: no record yet)."""
        try:
            raw, _ = await self.store.get(self.path)
        except NoNodeError:
            return ()
        return _decode(raw, self.path)

    async def _ensure(self) -> None:
        try:
            await self.store.create(self.path, _encode(()), make_parents=True)
        except NodeExistsError:
            pass

    async def add(self, new: Iterable[AclBinding]) -> tuple[AclBinding, ...]:
        """Store ``new`` (a binding already stored is kept once); returns the set
        after. Raises ChangeRejectedError if the record would pass ``MAX_BYTES``. If
        cancelled, the bindings may or may not have been stored."""
        wanted = tuple(new)

        def change(current: tuple[AclBinding, ...]) -> tuple[AclBinding, ...]:
            have = set(current)
            added = tuple(b for b in dict.fromkeys(wanted) if b not in have)
            if not added:
                return current
            out = current + added
            if len(_encode(out)) > self.MAX_BYTES:
                raise ChangeRejectedError(f"{self.path}: {len(out)} ACL bindings pass "
                                          f"the {self.MAX_BYTES}-byte record")
            return out

        await self._ensure()
        result, _ = await cas_update(self.store, self.path, change, decode=_decode,
                                     encode=_encode)
        return result

    async def remove(self, doomed: Callable[[AclBinding], bool]) -> tuple[AclBinding, ...]:
        """Delete every binding ``doomed`` picks, under compare-and-set; returns those
        deleted (as found in the version that was changed). If cancelled, they may or
        may not have been deleted."""
        removed: list[AclBinding] = []

        def change(current: tuple[AclBinding, ...]) -> tuple[AclBinding, ...]:
            removed[:] = [b for b in current if doomed(b)]
            if not removed:
                return current
            return tuple(b for b in current if not doomed(b))

        try:
            await cas_update(self.store, self.path, change, decode=_decode, encode=_encode)
        except NoNodeError:
            return ()
        return tuple(removed)
