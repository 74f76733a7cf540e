"""Kafka SCRAM credentials (KIP-554): ``<root>/kafka/scram``, one record holding every
user's credentials. JSON::

    {"format": 1, "users": {"<user>": {"<mechanism>": [salt_b64, iterations,
                                                       stored_key_b64, server_key_b64]}}}

with ``mechanism`` Kafka's number (1 SCRAM-SHA-256, 2 SCRAM-SHA-512). The record keeps
what RFC 5802's server keeps, StoredKey and ServerKey, never the salted password
(``ledgerd/kafka/scram.py`` derives them when AlterUserScramCredentials stores one).
One record, as the ACLs: a gateway authenticating reads all at once (cached), and a
change is one compare-and-set (:meth:`ScramStore.update`), so two admins altering at
once never undo each other. Bounded: at most ``MAX_USERS`` users and ``MAX_BYTES``
(below ZooKeeper's 1 MiB node limit); a change past either is refused.

Pure record types and a thin store; no trio.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ledgerd.metadata.cas import cas_update
from ledgerd.metadata.errors import ChangeRejectedError, NodeExistsError, NoNodeError
from ledgerd.metadata.jsondoc import Codec, decode, encode, json_field
from ledgerd.metadata.paths import kafka_scram_path
from ledgerd.metadata.store import MetadataStore

__all__ = ["Credentials", "ScramCredential", "ScramRecord", "ScramStore"]


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the server keeps for one user and mechanism (RFC 5802)."""
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


# user -> mechanism (Kafka's number) -> credential
Credentials = Mapping[str, Mapping[int, ScramCredential]]


def _dump(creds: Credentials) -> dict[str, Any]:
    b64 = base64.b64encode
    return {user: {str(int(m)): [b64(c.salt).decode(), c.iterations,
                                 b64(c.stored_key).decode(), b64(c.server_key).decode()]
                   for m, c in sorted(mechs.items())}
            for user, mechs in sorted(creds.items())}


def _load(value: object) -> Credentials:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object of users, got {value!r}")
    out: dict[str, dict[int, ScramCredential]] = {}
    for user, mechs in value.items():
        if not isinstance(mechs, dict):
            raise TypeError(f"user {user!r}: expected an object of mechanisms")
        one: dict[int, ScramCredential] = {}
        for m, item in mechs.items():
            salt, iterations, stored, server = item
            if not isinstance(iterations, int):
                raise TypeError(f"user {user!r}: iterations {iterations!r}")
            one[int(m)] = ScramCredential(
                base64.b64decode(salt, validate=True), iterations,
                base64.b64decode(stored, validate=True),
                base64.b64decode(server, validate=True))
        out[str(user)] = one
    return out


CREDENTIALS: Codec[Credentials] = Codec(_dump, _load)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScramRecord:
    FORMAT: ClassVar[int] = 1
    UNVERSIONED: ClassVar[int | None] = None

    users: Mapping[str, Mapping[int, ScramCredential]] = json_field("users", CREDENTIALS)


def _decode(raw: bytes, path: str) -> Credentials:
    return decode(ScramRecord, raw, path).users


def _encode(creds: Credentials) -> bytes:
    return encode(ScramRecord(users=creds))


class ScramStore:
    """The SCRAM credentials under ``kafka_root``."""

    MAX_BYTES = 1000 << 10  # below ZooKeeper's jute.maxbuffer (1 MiB)
    MAX_USERS = 2000

    def __init__(self, store: MetadataStore, kafka_root: str) -> None:
        self.store = store
        self.path = kafka_scram_path(kafka_root)

    async def credentials(self) -> Credentials:
        """Every user's credentials (none: no record yet)."""
        try:
            raw, _ = await self.store.get(self.path)
        except NoNodeError:
            return {}
        return _decode(raw, self.path)

    async def update(self, change: Callable[[Credentials], Credentials]) -> Credentials:
        """Apply the pure ``change`` under compare-and-set (it may run more than once,
        on each version read); returns the credentials after. Raises
        ChangeRejectedError if the result passes ``MAX_USERS`` or ``MAX_BYTES``."""

        def bounded(current: Credentials) -> Credentials:
            out = change(current)
            if out is current:
                return current
            if len(out) > self.MAX_USERS:
                raise ChangeRejectedError(f"{self.path}: {len(out)} SCRAM users pass "
                                          f"the limit of {self.MAX_USERS}")
            if len(_encode(out)) > self.MAX_BYTES:
                raise ChangeRejectedError(f"{self.path}: the SCRAM credentials pass the "
                                          f"{self.MAX_BYTES}-byte record")
            return out

        try:
            await self.store.create(self.path, _encode({}), make_parents=True)
        except NodeExistsError:
            pass
        result, _ = await cas_update(self.store, self.path, bounded, decode=_decode,
                                     encode=_encode)
        return result
