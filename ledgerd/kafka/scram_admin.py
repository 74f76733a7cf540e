"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554), decided
without I/O: :func:`describe` answers from the stored credentials, :func:`alter`
returns the credentials after a request and the per-user results (the gateway runs it
inside the store's compare-and-set, ``metadata/kafka_scram.py``).

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

from collections.abc import Callable
from typing import Any

from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    Mechanism,
    credential_from_salted,
)
from ledgerd.metadata.kafka_scram import Credentials, ScramCredential

__all__ = ["MAX_REQUEST_OPS", "alter", "describe"]

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
        if not name:
            refuse(name, ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
        elif mech not in {int(m) for m in Mechanism}:
            refuse(name, ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                   f"Unknown SCRAM mechanism {mech}")
        elif seen[(name, mech)] > 1:
            refuse(name, ErrorCode.DUPLICATE_RESOURCE,
                   "A user credential cannot be altered twice in the same request")
        elif kind == "upsert" and not MIN_ITERATIONS <= op["iterations"] <= MAX_ITERATIONS:
            refuse(name, ErrorCode.UNACCEPTABLE_CREDENTIAL,
                   f"Iterations {op['iterations']} not in the range "
                   f"{MIN_ITERATIONS}..{MAX_ITERATIONS}")
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
