"""Which roles may make which request (pure: a request's api and flags in, roles out).

With ``authorization_enabled``, every connection has a principal (its TLS client
certificate's, or the anonymous one with ``anonymous_roles``) and each request needs
one of the roles below; anything else is answered UNAUTHORIZED and logged with the
principal. The ledger password (master key) is still checked as before: a role says
what kind of caller may ask, the key which ledger it may touch.

- ``client``: reads and writes of ledgers (the key decides which), including a
  client's own ledger recovery (recovery adds and fencing reads carrying the key);
- ``recovery``: reads, fencing reads and recovery adds (autorecovery, which holds the
  cluster's recovery credential instead of ledger keys), not plain adds;
- ``admin``: garbage collection and compaction triggers, the admin status, the
  listing of held ledgers (metadata rebuild);
- ``bookie``: bookie-to-bookie calls (none today; reserved, as BookKeeper has it).

ApiVersions, StartTls and Auth are open to everyone: they come before anyone is known.
"""

from __future__ import annotations

from ledgerd.base.principals import ROLES, parse_roles
from ledgerd.wire.messages import AddFlags, AddRequest, ApiKey, Message

__all__ = ["ROLES", "allowed", "needed_roles", "parse_roles"]


_OPEN: frozenset[str] = frozenset()  # no role needed
_READERS = frozenset({"client", "recovery"})
_BY_API: dict[int, frozenset[str]] = {
    ApiKey.API_VERSIONS: _OPEN,
    ApiKey.START_TLS: _OPEN,
    ApiKey.AUTH: _OPEN,
    ApiKey.READ: _READERS,
    ApiKey.READ_RANGE: _READERS,
    ApiKey.READ_STRIDE: _READERS,
    ApiKey.READ_LAC: _READERS,
    ApiKey.WRITE_LAC: frozenset({"client"}),
    ApiKey.FORCE_LEDGER: frozenset({"client"}),
    ApiKey.GET_BOOKIE_INFO: frozenset({"client", "recovery", "admin", "bookie"}),
    ApiKey.ADMIN_TRIGGER: frozenset({"admin"}),
    ApiKey.ADMIN_STATUS: frozenset({"admin"}),
    ApiKey.LEDGER_HOLDINGS: frozenset({"admin"}),
}
assert set(_BY_API) | {ApiKey.ADD} == set(ApiKey)


def needed_roles(api_key: int, message: Message | None = None) -> frozenset[str]:
    """The roles any one of which lets a caller make this request (empty: anyone)."""
    if api_key == ApiKey.ADD:
        if isinstance(message, AddRequest) and message.flags & AddFlags.RECOVERY_ADD:
            return _READERS  # recovery adds: a client recovering its ledger, or autorecovery
        return frozenset({"client"})
    return _BY_API.get(api_key, frozenset({"admin"}))


def allowed(roles: frozenset[str], api_key: int, message: Message | None = None) -> bool:
    need = needed_roles(api_key, message)
    return not need or not need.isdisjoint(roles)


