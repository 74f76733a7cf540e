"""One error story: every error class of the house derives from ``ledgerd.LedgerdError``,
and the bookie statuses map to exceptions through one table, both ways."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import ledgerd
from ledgerd.base.errors import LedgerdError
from ledgerd.errors import BadPasswordError, LedgerFencedError, NoSuchLedgerError
from ledgerd.ledgerlog import LogFencedError
from ledgerd.machines.changes import FencedChangeError
from ledgerd.wire import status as wire_status
from ledgerd.wire.errors import LocalProtocolError, RemoteProtocolError, WireError
from ledgerd.wire.status import (
    STATUS_ERRORS,
    FencedError,
    Status,
    error_for_status,
    status_for_error,
)

PACKAGES = ("ledgerd",)  # the folders wire, disk, metadata, appliance install under it
SKIP = {"ledgerd.spark", "ledgerd.tools", "ledgerd.native"}  # spark needs pyspark (tests/spark)


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(pkg.__path__, package + "."):
            if not any(info.name == s or info.name.startswith(s + ".") for s in SKIP):
                names.append(info.name)
    return names


def test_every_error_class_derives_from_the_one_root() -> None:
    strays = []
    for name in _modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (cls.__module__ == name and issubclass(cls, BaseException)
                    and not issubclass(cls, LedgerdError)):
                strays.append(f"{name}.{cls.__name__}")
    assert strays == []
    assert ledgerd.LedgerdError is LedgerdError


def test_the_client_errors_named_in_the_review_are_under_the_root() -> None:
    from ledgerd.bookie_client import BookieConnectionError
    from ledgerd.metadata.errors import MetadataUnavailableError
    from ledgerd.pipeline import EnsembleChangeError
    for cls in (ledgerd.NotEnoughBookiesError, BookieConnectionError, EnsembleChangeError,
                MetadataUnavailableError, ledgerd.ConfigError):
        assert issubclass(cls, LedgerdError), cls


def test_one_fenced_family_and_one_no_such_ledger() -> None:
    for cls in (LedgerFencedError, LogFencedError, FencedChangeError):
        assert issubclass(cls, FencedError), cls
    assert issubclass(NoSuchLedgerError, wire_status.NoSuchLedgerError)
    assert issubclass(BadPasswordError, wire_status.UnauthorizedError)
    assert status_for_error(LedgerFencedError(3, "fenced")) is Status.FENCED
    assert status_for_error(BadPasswordError(3)) is Status.UNAUTHORIZED


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.OK])
def test_status_table_both_ways(status: Status) -> None:
    exc = error_for_status(status, ledger_id=1, entry_id=2)
    assert type(exc) is STATUS_ERRORS[status] and status_for_error(exc) is status
    assert isinstance(exc, WireError)
    # A status is an answer, not a protocol fault of either side.
    assert not isinstance(exc, LocalProtocolError | RemoteProtocolError)


def test_dir_of_ledgerd_is_its_public_api() -> None:
    import ledgerd

    names = dir(ledgerd)
    assert {"SyncClient", "open_client", "LedgerdError", "WriteHandle"} <= set(names)
    assert "importlib" not in names and "TYPE_CHECKING" not in names
    assert all(hasattr(ledgerd, n) for n in names)
