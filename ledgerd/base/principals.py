"""Principals and roles, as bookies and the Kafka gateway read them.

A principals file (TOML; ``ledgerd shell gentoken NAME --roles ...`` writes an entry)
names who may connect without a client certificate::

    [principals.spark-etl]
    token_sha256 = "9f86d0...64 hex digits"
    roles = ["client"]

A bookie accepts the token in AUTH; the Kafka gateway accepts it as the password of SASL
PLAIN with the principal's name as the user. Roles: ``client`` (reads and writes),
``recovery`` (recovery reads and adds, fencing), ``admin`` (administration; topics on
the gateway), ``bookie``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable

from ledgerd.base.settings import ConfigError
from ledgerd.base.tls import Principal

__all__ = ["ROLES", "load_principals", "parse_roles"]

ROLES = frozenset({"client", "recovery", "admin", "bookie"})


def parse_roles(names: Iterable[str], what: str) -> frozenset[str]:
    """Validate role names from configuration (ValueError naming the unknown ones)."""
    roles = frozenset(n.strip() for n in names if n.strip())
    unknown = sorted(roles - ROLES)
    if unknown:
        raise ValueError(f"{what}: unknown role(s) {', '.join(unknown)}; roles are "
                         + ", ".join(sorted(ROLES)))
    return roles


def load_principals(path: str, key: str = "principals_file") -> dict[str, Principal]:
    """token SHA-256 (hex) -> principal, from a principals file (ConfigError naming the
    file and the entry that is wrong)."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(key, path, f"a readable TOML file ({exc})") from None
    out: dict[str, Principal] = {}
    for name, entry in (doc.get("principals") or {}).items():
        digest = str(entry.get("token_sha256", "")).lower() if isinstance(entry, dict) else ""
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ConfigError(key, path,
                              f"[principals.{name}] with token_sha256 = 64 hex digits")
        try:
            roles = parse_roles(entry.get("roles", []), f"[principals.{name}] roles")
        except ValueError as exc:
            raise ConfigError(key, path, str(exc)) from None
        if digest in out:
            raise ConfigError(key, path,
                              f"[principals.{name}]: the same token as {out[digest].name}")
        out[digest] = Principal(name, roles, True)
    return out


