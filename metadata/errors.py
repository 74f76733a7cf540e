"""Errors of the metadata package: one root, leaves named for what happened.

Nothing of kazoo crosses this package's boundary: ``metadata.zookeeper`` turns each
ZooKeeper answer into a leaf here. A lost connection or an operation timeout (kazoo's
ConnectionLoss, OperationTimeoutError, KazooTimeoutError) is retried, then raised as
MetadataUnavailableError, which is also a ``ledgerd.base.errors.UnavailableError``: the
caller may try again later, and a write that failed so may or may not have landed.
Any other kazoo failure is a plain MetadataError.
"""

from __future__ import annotations

from ledgerd.base.errors import LedgerdError, UnavailableError

__all__ = [
    "BadServersError",
    "BadVersionError",
    "BookieIdInUseError",
    "ChangeRejectedError",
    "CorruptMetadataError",
    "LayoutMismatchError",
    "MetadataError",
    "MetadataUnavailableError",
    "NoNodeError",
    "NodeExistsError",
    "NotAuthorizedError",
    "NotEmptyError",
    "SessionExpiredError",
    "UnknownFormatError",
]


class MetadataError(LedgerdError):
    """Root of every metadata failure."""


class NoNodeError(MetadataError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"no node at {path}")


class NodeExistsError(MetadataError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"node already exists at {path}")


class NotEmptyError(MetadataError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"node {path} has children")


class BadVersionError(MetadataError):
    """A compare-and-set lost: the node changed since it was read."""

    def __init__(self, path: str, expected: int) -> None:
        self.path = path
        self.expected = expected
        super().__init__(f"version conflict at {path}: expected version {expected}")


class SessionExpiredError(MetadataError):
    """The session that owned ephemeral nodes ended; they are gone."""


class NotAuthorizedError(MetadataError):
    """ZooKeeper refused the operation: the node's ACL does not admit this session."""

    def __init__(self, path: str) -> None:
        super().__init__(f"ZooKeeper refused access to {path} (its ACL): set "
                         "zk_digest_auth_file (LEDGERD_ZK_DIGEST_AUTH_FILE) to the "
                         "cluster's ZooKeeper credentials")
        self.path = path


class MetadataUnavailableError(MetadataError, UnavailableError):
    """The metadata service could not be reached, or did not answer in time, after
    bounded retries (a write that failed so may or may not have landed)."""

    def __init__(self, servers: str, reason: str) -> None:
        self.servers = servers
        super().__init__(f"metadata service unavailable (tried {servers}): {reason}")


class BadServersError(MetadataError):
    """A ZooKeeper connection string that cannot work: a bad port, no host that resolves."""

    def __init__(self, servers: str, reason: str) -> None:
        self.servers = servers
        super().__init__(f"bad ZooKeeper address {servers!r}: {reason}")


class CorruptMetadataError(MetadataError):
    """A node holds data that is not what ledgerd wrote there."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"corrupt or foreign data at {path}: {reason}")


class UnknownFormatError(CorruptMetadataError):
    """A record's ``format`` is not one this version reads (a newer ledgerd wrote it):
    refused rather than misread, and never overwritten."""

    def __init__(self, path: str, found: object, known: int) -> None:
        self.path = path
        self.found = found
        self.known = known
        what = "without a format" if found is None else f"of format {found!r}"
        self.reason = f"a record {what}; this ledgerd reads format {known}"
        MetadataError.__init__(self, f"{path} holds a record {what}; this ledgerd reads "
                                     f"format {known} only (was it written by a newer "
                                     "ledgerd, or by something else?)")


class LayoutMismatchError(MetadataError):
    """The cluster root was initialised with another layout than the one configured."""


class ChangeRejectedError(MetadataError):
    """A CAS change function found that its change no longer applies (e.g. ledger CLOSED)."""


class BookieIdInUseError(MetadataError):
    """Another live process is registered under this bookie id."""
