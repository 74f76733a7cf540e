"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554), decided
without I/O: :func:`describe` answers from the stored credentials, :func:`alter`
returns the credentials after a request and the per-user results, and
:func:`refusal` says why one change is refused whatever is stored.
:func:`alter_stored` runs :func:`alter` inside the store's compare-and-set
(``metadata/kafka_scram.py``): the gateway's AlterUserScramCredentials and ``ledgerd
shell kafka scram`` (``tools/kafka_cmds.py``) both write through it.

As Kafka's ``ZkAdminManager``:

- Describe: a null or empty user list describes every user with a credential; a user
  named twice is DUPLICATE_RESOURCE, a user without a credential RESOURCE_NOT_FOUND.
- Alter: one result per user named, in the order first named; a user's changes are
  applied all or none. Refused per user: an empty name UNACCEPTABLE_CREDENTIAL; a
  mechanism other than 1 (SCRAM-SHA-256) or 2 (SCRAM-SHA-512) UNSUPPORTED_SASL_MECHANISM;
  the same user and mechanism twice in the request (deletions and upsertions together)
  DUPLICATE_RESOURCE; iterations outside 4096..16384, or an empty salt or salted
  password, UNACCEPTABLE_CREDENTIAL; deleting a credential that does not exist
  RESOURCE_NOT_FOUND. An upsertion stores StoredKey and ServerKey derived from the
  salted password (``scram.credential_from_salted``), never the salted password.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    SALT_BYTES,
    Mechanism,
    credential_from_salted,
    salted_password,
)
from ledgerd.metadata.errors import ChangeRejectedError
from ledgerd.metadata.kafka_scram import Credentials, ScramCredential, ScramStore

__all__ = ["MAX_REQUEST_OPS", "alter", "alter_stored", "describe", "refusal", "upsertion"]

MAX_REQUEST_OPS = 1000  # deletions + upsertions one request may carry


def describe(body: dict[str, Any], creds: Credentials) -> dict[str, Any]:
    asked = body["users"]
    if not asked:
        names = sorted(creds)
        return {"error_code": 0, "error_message": None,
                "results": [_described(n, creds[n]) for n in names]}
    results = []
    counts: dict[str, int] = {}
    for u in asked:
        counts[u["name"]] = counts.get(u["name"], 0) + 1
    for name in dict.fromkeys(u["name"] for u in asked):
        if counts[name] > 1:
            results.append(_failed(name, ErrorCode.DUPLICATE_RESOURCE,
                                   "Cannot describe SCRAM credentials for the same user "
                                   "twice in a single request: " + name))
        elif not creds.get(name):
            results.append(_failed(name, ErrorCode.RESOURCE_NOT_FOUND,
                                   "Attempt to describe a user credential that does not "
                                   "exist: " + name))
        else:
            results.append(_described(name, creds[name]))
    return {"error_code": 0, "error_message": None, "results": results}


def _described(name: str, mechs: Any) -> dict[str, Any]:
    return {"user": name, "error_code": 0, "error_message": None,
            "credential_infos": [{"mechanism": m, "iterations": c.iterations}
                                 for m, c in sorted(mechs.items())]}


def _failed(name: str, code: ErrorCode, message: str) -> dict[str, Any]:
    return {"user": name, "error_code": code, "error_message": message,
            "credential_infos": []}


def refusal(name: str, mechanism: int, iterations: int | None = None,
            ) -> tuple[ErrorCode, str] | None:
    """Why a change to ``name``'s ``mechanism`` credential (an upsertion with
    ``iterations``, a deletion with None) is refused whatever is stored, or None: an
    empty user name, a mechanism other than 1 or 2, iterations outside 4096..16384."""
    if not name:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if mechanism not in {int(m) for m in Mechanism}:
        return ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism {mechanism}"
    if iterations is not None and not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        return (ErrorCode.UNACCEPTABLE_CREDENTIAL,
                f"Iterations {iterations} not in the range {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    return None


def upsertion(name: str, mech: Mechanism, password: str, iterations: int,
              salt: bytes | None = None) -> dict[str, Any]:
    """One AlterUserScramCredentials upsertion, as a Kafka client makes it: a random
    salt and the salted password (PBKDF2; check :func:`refusal` first, as iterations
    past the limit cost that much)."""
    salt = salt if salt is not None else secrets.token_bytes(SALT_BYTES)
    return {"name": name, "mechanism": int(mech), "iterations": iterations, "salt": salt,
            "salted_password": salted_password(mech, password, salt, iterations)}


def alter(body: dict[str, Any], current: Credentials,
          derive: Callable[[Mechanism, bytes, int, bytes], ScramCredential]
          = credential_from_salted) -> tuple[Credentials, list[dict[str, Any]]]:
    """The credentials after ``body`` (``current`` itself when nothing changes) and
    the response's results."""
    deletions, upsertions = body["deletions"], body["upsertions"]
    ops = [("delete", d) for d in deletions] + [("upsert", u) for u in upsertions]
    order = list(dict.fromkeys(op["name"] for _, op in ops))
    if len(ops) > MAX_REQUEST_OPS:
        return current, [{"user": n, "error_code": ErrorCode.UNACCEPTABLE_CREDENTIAL,
                          "error_message": f"more than {MAX_REQUEST_OPS} credential "
                          "changes in one request"} for n in order]
    errors: dict[str, tuple[ErrorCode, str]] = {}
    seen: dict[tuple[str, int], int] = {}
    for _, op in ops:
        seen[(op["name"], op["mechanism"])] = seen.get((op["name"], op["mechanism"]), 0) + 1

    def refuse(name: str, code: ErrorCode, message: str) -> None:
        errors.setdefault(name, (code, message))

    for kind, op in ops:
        name, mech = op["name"], op["mechanism"]
        refused = refusal(name, mech, op["iterations"] if kind == "upsert" else None)
        if refused is not None:
            refuse(name, *refused)
        elif seen[(name, mech)] > 1:
            refuse(name, ErrorCode.DUPLICATE_RESOURCE,
                   "A user credential cannot be altered twice in the same request")
        elif kind == "upsert" and (not op["salt"] or not op["salted_password"]):
            refuse(name, ErrorCode.UNACCEPTABLE_CREDENTIAL,
                   "An empty salt or salted password")
        elif kind == "delete" and mech not in current.get(name, {}):
            refuse(name, ErrorCode.RESOURCE_NOT_FOUND,
                   "Attempt to delete a user credential that does not exist")
    changed: dict[str, dict[int, ScramCredential]] = {}
    for kind, op in ops:
        name = op["name"]
        if name in errors:
            continue
        mechs = changed.setdefault(name, dict(current.get(name, {})))
        if kind == "delete":
            mechs.pop(op["mechanism"], None)
        else:
            mechs[op["mechanism"]] = derive(Mechanism(op["mechanism"]), op["salt"],
                                            op["iterations"], op["salted_password"])
    results = [{"user": n, "error_code": errors[n][0] if n in errors else 0,
                "error_message": errors[n][1] if n in errors else None} for n in order]
    if not changed:
        return current, results
    out = {n: m for n, m in current.items() if n not in changed}
    out.update({n: m for n, m in changed.items() if m})
    return out, results


async def alter_stored(store: ScramStore, body: dict[str, Any]) -> list[dict[str, Any]]:
    """:func:`alter` under ``store``'s compare-and-set (run again on each version read);
    the results of the version written. A change past the store's bounds (users, bytes)
    is refused for every user named: UNACCEPTABLE_CREDENTIAL with the reason."""
    results: list[dict[str, Any]] = []

    def change(current: Credentials) -> Credentials:
        out, results[:] = alter(body, current)
        return out

    try:
        await store.update(change)
    except ChangeRejectedError as e:
        users = dict.fromkeys(r["user"] for r in results)
        return [{"user": u, "error_code": ErrorCode.UNACCEPTABLE_CREDENTIAL,
                 "error_message": str(e)} for u in users]
    return results
