"""The Kafka gateway's authorizer: ACL bindings in, a decision out.

It decides as Kafka's ``AclAuthorizer`` (``kafka.security.authorizer``) does, for a
principal (``User:alice``), the host it connects from, an operation and a resource:

1. A super user (``gateway_super_users``) may do anything.
2. The bindings that apply to the resource are those of its type whose pattern
   matches its name: LITERAL of the name, LITERAL ``*``, PREFIXED of a prefix of it.
3. None at all (for any principal): ``gateway_allow_everyone_if_no_acl_found``
   decides (Kafka's ``allow.everyone.if.no.acl.found``; ledgerd's default is true, so
   a cluster without ACLs serves everyone as it did before ACLs existed; Kafka's is
   false).
4. A DENY binding for the principal (or ``User:*``), the host (or ``*``) and the
   operation (or ALL) refuses, whatever allows it.
5. An ALLOW binding so for the operation allows; DESCRIBE is implied by READ, WRITE,
   DELETE or ALTER, DESCRIBE_CONFIGS by ALTER_CONFIGS (Kafka's implied operations).
6. Otherwise refused.

``AclFilter`` is a DescribeAcls / DeleteAcls filter: ANY matches any value, a null
string any string, and the pattern type MATCH every binding that would apply to the
filter's name (rule 2). ``authorized_operations`` is the bitfield DescribeGroups,
DescribeCluster and Metadata (v8+) carry: bit ``op`` set for each operation of the
resource type's that ``authorize`` allows.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ledgerd.metadata.kafka_acls import (
    CLUSTER_NAME,
    WILDCARD,
    AclBinding,
    AclOperation,
    AclPermission,
    PatternType,
    ResourceType,
)

__all__ = ["ANONYMOUS_PRINCIPAL", "SUPPORTED_OPERATIONS", "AclFilter", "AclSettings",
           "Authorizer", "Resource", "cluster", "parse_super_users"]

ANONYMOUS_PRINCIPAL = "User:ANONYMOUS"  # Kafka's name for an unauthenticated client
_ANY_PRINCIPAL = "User:*"

# The operations Kafka defines for each resource type (AclEntry.supportedOperations):
# an authorized-operations bitfield has a bit for each one allowed.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE,
                         AclOperation.DESCRIBE, AclOperation.DELETE, AclOperation.ALTER,
                         AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS),
    # (DESCRIBE_CONFIGS and ALTER_CONFIGS since Kafka 4.0: group configs)
    ResourceType.GROUP: (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE,
                         AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS),
    ResourceType.CLUSTER: (AclOperation.CREATE, AclOperation.CLUSTER_ACTION,
                           AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
                           AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
                           AclOperation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.DESCRIBE, AclOperation.WRITE),
    ResourceType.DELEGATION_TOKEN: (AclOperation.DESCRIBE,),
    ResourceType.USER: (AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS),
}

_IMPLIED: dict[AclOperation, tuple[AclOperation, ...]] = {
    AclOperation.DESCRIBE: (AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE,
                            AclOperation.DELETE, AclOperation.ALTER),
    AclOperation.DESCRIBE_CONFIGS: (AclOperation.DESCRIBE_CONFIGS,
                                    AclOperation.ALTER_CONFIGS),
}


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource a request acts on: a topic, group, transactional id or the cluster."""

    type: ResourceType
    name: str


def cluster() -> Resource:
    return Resource(ResourceType.CLUSTER, CLUSTER_NAME)


def parse_super_users(value: str) -> frozenset[str]:
    """Kafka's ``super.users``: principals separated by semicolons."""
    return frozenset(p.strip() for p in value.split(";") if p.strip())


@dataclass(frozen=True, slots=True, kw_only=True)
class AclSettings:
    allow_if_no_acl: bool = True
    super_users: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True, kw_only=True)
class AclFilter:
    """A DescribeAcls / DeleteAcls filter; None strings and ANY enums match anything."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermission = AclPermission.ANY

    def invalid(self) -> str | None:
        """Why Kafka refuses the filter (an UNKNOWN value), or None."""
        for name, value in (("resource type", self.resource_type),
                            ("pattern type", self.pattern_type),
                            ("operation", self.operation),
                            ("permission", self.permission)):
            if value.name == "UNKNOWN":
                return f"{name} UNKNOWN matches nothing"
        return None

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type is not ResourceType.ANY and \
                self.resource_type is not b.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and \
                self.pattern_type is not b.pattern_type:
            return False
        if self.resource_name is not None:
            if self.pattern_type in (PatternType.ANY, b.pattern_type):
                if self.resource_name != b.resource_name:
                    return False
            elif not _applies(b, self.resource_name):  # MATCH
                return False
        return ((self.principal is None or self.principal == b.principal)
                and (self.host is None or self.host == b.host)
                and self.operation in (AclOperation.ANY, b.operation)
                and self.permission in (AclPermission.ANY, b.permission))


def _applies(b: AclBinding, name: str) -> bool:
    """Whether ``b``'s resource pattern covers the resource ``name`` (rule 2)."""
    if b.pattern_type is PatternType.LITERAL:
        return b.resource_name in (name, WILDCARD)
    return name.startswith(b.resource_name)


class Authorizer:
    """Decisions over one set of bindings (rebuild it when the bindings change)."""

    def __init__(self, bindings: Iterable[AclBinding], settings: AclSettings) -> None:
        self.settings = settings
        self.by_type: dict[ResourceType, list[AclBinding]] = {}
        for b in bindings:
            self.by_type.setdefault(b.resource_type, []).append(b)

    @property
    def is_open(self) -> bool:
        """No binding at all and everyone allowed then: every decision is yes."""
        return not self.by_type and self.settings.allow_if_no_acl

    def bindings_for(self, resource: Resource) -> list[AclBinding]:
        """The bindings whose pattern covers ``resource``, any principal."""
        return [b for b in self.by_type.get(resource.type, ())
                if _applies(b, resource.name)]

    def authorize(self, principal: str, host: str, operation: AclOperation,
                  resource: Resource) -> bool:
        if principal in self.settings.super_users:
            return True
        acls = self.bindings_for(resource)
        if not acls:
            return self.settings.allow_if_no_acl
        mine = [b for b in acls if b.principal in (principal, _ANY_PRINCIPAL)
                and b.host in (host, WILDCARD)]
        if any(b.permission is AclPermission.DENY
               and b.operation in (operation, AclOperation.ALL) for b in mine):
            return False
        allowed_by = _IMPLIED.get(operation, (operation,))
        return any(b.permission is AclPermission.ALLOW
                   and (b.operation is AclOperation.ALL or b.operation in allowed_by)
                   for b in mine)

    def authorized_operations(self, principal: str, host: str, resource: Resource) -> int:
        """Kafka's authorized-operations bitfield: bit ``op`` for each of the resource
        type's operations (``SUPPORTED_OPERATIONS``) that ``principal`` may do."""
        bits = 0
        for op in SUPPORTED_OPERATIONS.get(resource.type, ()):
            if self.authorize(principal, host, op, resource):
                bits |= 1 << op
        return bits
