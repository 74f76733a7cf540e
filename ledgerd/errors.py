"""What the client raises: one root, ``LedgerdError``, and leaves named for what happened.

``LedgerdError`` (``ledgerd.base.errors``) is the root of every error ledgerd raises:
bookie statuses are ``wire.status.BookieError`` leaves (one per status, in the one table
``wire.status.STATUS_ERRORS``), metadata failures ``metadata.errors.MetadataError``,
protocol faults ``wire.errors.LocalProtocolError`` / ``RemoteProtocolError``. The classes
here are the client's own decisions: the handle is dead because the ledger was fenced or
closed under it, a read found no replica that could serve it, and so on. Where such a
decision stands for a bookie status it is also that status's class, so one ``except``
catches a family: ``wire.status.FencedError`` catches ``LedgerFencedError``,
``LogFencedError`` and ``FencedChangeError``; ``UnauthorizedError`` catches
``BadPasswordError`` and ``AccessDeniedError``; ``ledgerd.base.errors.UnavailableError``
catches what may succeed when more servers answer (``NotEnoughBookiesError``,
``LedgerUnavailableError``, ``ReplicaTimeoutError``, ``MetadataUnavailableError``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ledgerd.base.errors import LedgerdError, UnavailableError
from ledgerd.machines.placement import NotEnoughBookiesError
from ledgerd.machines.writer import FailureKind
from ledgerd.metadata.ledger import password_check
from ledgerd.wire import status as wire_status
from ledgerd.wire.status import FencedError, UnauthorizedError

__all__ = [
    "AccessDeniedError",
    "BadPasswordError",
    "ClientClosedError",
    "EntryUnavailableError",
    "LeadershipLostError",
    "LedgerClosedError",
    "LedgerFencedError",
    "LedgerHandleError",
    "LedgerRecoveryError",
    "LedgerUnavailableError",
    "LedgerdError",
    "NoSuchLedgerError",
    "NotEnoughBookiesError",
    "ReadBeyondLacError",
    "ReplicaTimeoutError",
    "single_exception",
]




class LedgerHandleError(LedgerdError):
    """A write handle failed; every pending and later append fails with it."""

    ledger_id: int | None  # always set here; typed as BookieError types it (LedgerFencedError)

    def __init__(self, ledger_id: int, reason: str) -> None:
        super().__init__(f"ledger {ledger_id}: {reason}")
        self.ledger_id = ledger_id
        self.reason = reason


class LedgerFencedError(LedgerHandleError, FencedError):
    """Another client fenced the ledger (it is being recovered): this writer is done."""


class LeadershipLostError(LedgerHandleError):
    """Another writer took the unbounded ledger over (it raised the term): this writer
    withdrew. Its acknowledged entries stay; unacknowledged ones may or may not survive
    the new term's recovery. Take over again (``take_over_ledger``) to write once more."""


class LedgerUnavailableError(LedgerHandleError, UnavailableError):
    """The writer could not go on for want of servers: an ensemble change found too few
    writable bookies (``kind`` NO_BOOKIES), or the metadata store failed it (METADATA).
    Entries it had sent may or may not survive the ledger's recovery."""

    def __init__(self, ledger_id: int, reason: str, kind: FailureKind) -> None:
        super().__init__(ledger_id, reason)
        self.kind = kind


class LedgerClosedError(LedgerHandleError):
    """The ledger is CLOSED (by another client, or by this one with a different end)."""


class BadPasswordError(UnauthorizedError):
    """The password does not match the one the ledger was created with."""

    def __init__(self, ledger_id: int) -> None:
        super().__init__(f"ledger {ledger_id}: wrong password (UNAUTHORIZED)")
        self.ledger_id = ledger_id


class AccessDeniedError(UnauthorizedError):
    """A bookie answered UNAUTHORIZED although the key is not the problem: the password
    matches the ledger's check hash, so the bookie refused this client's principal (it
    lacks the role the request needs), or it refused the recovery credential (another
    cluster secret, or none). ``reason`` says which the client could tell."""

    def __init__(self, ledger_id: int, reason: str) -> None:
        super().__init__(f"ledger {ledger_id}: {reason}")
        self.ledger_id = ledger_id
        self.reason = reason


ROLE_REFUSED = ("the password is right (it matches the ledger's check hash), so the bookie "
                "refused this client's principal: it lacks the role the request needs "
                "(with authorization_enabled, plain adds need 'client'; fencing reads and "
                "recovery adds 'client' or 'recovery'; the bookie's log names the principal)"
                ", unless a client that skips the check bound another key there first")
CREDENTIAL_REFUSED = ("the bookie refused the recovery credential or this principal's role "
                      "(is the same cluster_secret_file configured on every bookie and "
                      "autorecovery process, and does the principal have the 'recovery' "
                      "role?)")


def refused(ledger_id: int, reason: str, key: bytes, check: str) -> UnauthorizedError:
    """What an UNAUTHORIZED answer means, from what the client knows of its key: a key
    that matches the ledger's check hash ``check`` is right, so a role was refused; one
    that does not is the recovery credential (clients check passwords before they ask
    bookies anything); without a check hash (an old ledger) it may be the password."""
    if not check:
        return BadPasswordError(ledger_id)
    if password_check(key) == check:
        return AccessDeniedError(ledger_id, f"{reason}; {ROLE_REFUSED}")
    return AccessDeniedError(ledger_id, f"{reason}; {CREDENTIAL_REFUSED}")


class NoSuchLedgerError(wire_status.NoSuchLedgerError):
    """The ledger does not exist (in metadata, or on a bookie that answered so)."""

    def __init__(self, ledger_id: int) -> None:
        super().__init__(f"ledger {ledger_id} does not exist")
        self.ledger_id = ledger_id


class EntryUnavailableError(LedgerdError):
    """No replica of an entry could serve it. ``failures`` lists each replica's answer as
    (bookie, exception): a status as its ``wire.status`` class (``error_for_status``), a
    dead connection as BookieConnectionError, a bad digest as DigestMismatchError."""

    def __init__(self, ledger_id: int, entry_id: int,
                 failures: Sequence[tuple[str, Exception]]) -> None:
        listed = "; ".join(f"{bookie}: {exc}" for bookie, exc in failures)
        super().__init__(f"ledger {ledger_id} entry {entry_id}: no replica could serve it "
                         f"({listed or 'no replicas'})")
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.failures = failures


class ReplicaTimeoutError(UnavailableError):
    """No replica answered a read within the read timeout."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"no answer within {timeout_s:g}s")
        self.timeout_s = timeout_s


class ReadBeyondLacError(LedgerdError):
    """A read asked for entries past the last confirmed one."""

    def __init__(self, ledger_id: int, last: int, lac: int) -> None:
        super().__init__(f"ledger {ledger_id}: cannot read up to entry {last}, the last "
                         f"confirmed entry is {lac}")
        self.ledger_id = ledger_id


class LedgerRecoveryError(LedgerdError):
    """Recovery could not finish (it can be retried; the ledger stays IN_RECOVERY)."""

    def __init__(self, ledger_id: int, reason: str,
                 kind: FailureKind = FailureKind.UNAVAILABLE) -> None:
        super().__init__(f"ledger {ledger_id}: recovery failed: {reason}")
        self.ledger_id = ledger_id
        self.reason = reason
        self.kind = kind


class ClientClosedError(LedgerdError):
    """The client was closed; nothing more can be sent."""


def single_exception(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups (what a trio
    nursery wraps an application's own error in), or ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def first_of(exc: BaseException,
             types: type[BaseException] | tuple[type[BaseException], ...]) -> BaseException | None:
    """``exc`` if it is one of ``types``; for an exception group (what a nursery raises)
    whose every member is, its first member; otherwise None."""
    if isinstance(exc, types):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        match, rest = exc.split(types)
        if match is not None and rest is None:
            leaf: BaseException = match
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            return leaf
    return None
