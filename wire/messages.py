"""Request and response bodies as frozen dataclasses, one pair per api key.

Each class names its construct layout in ``LAYOUT``; the field names are the layout's.
Flags travel as plain ints so decoded messages compare equal whichever codec produced
them; build them from the ``IntFlag`` enums (``ReadFlags.FENCE | ReadFlags.HIGH_PRIORITY``)
and test them with the ``is_*`` predicates.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar

from ledgerd.wire import layouts

__all__ = [
    "NO_MASTER_KEY", "REQUEST_TYPES", "RESPONSE_TYPES", "SUPPORTED_VERSIONS",
    "AddFlags", "AddRequest", "AddResponse", "AdminKind", "AdminStatusRequest",
    "AdminStatusResponse", "AdminTriggerRequest", "AdminTriggerResponse", "ApiKey",
    "ApiVersionRange", "ApiVersionsRequest", "ApiVersionsResponse", "AuthRequest",
    "AuthResponse", "BookieState",
    "ForceLedgerRequest", "ForceLedgerResponse", "GetBookieInfoRequest",
    "GetBookieInfoResponse", "HeldLedger", "HeldRange", "HoldingFlags",
    "LedgerHoldingsRequest", "LedgerHoldingsResponse", "Message", "ReadFlags", "ReadLacRequest", "ReadLacResponse",
    "ReadRangeRequest", "ReadRangeResponse", "ReadRequest", "ReadResponse",
    "ReadStrideRequest", "ReadStrideResponse", "StartTlsRequest", "StartTlsResponse",
    "WriteLacRequest", "WriteLacResponse",
]

NO_MASTER_KEY = bytes(layouts.MASTER_KEY_SIZE)
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class ApiKey(enum.IntEnum):
    API_VERSIONS = 0
    ADD = 1
    READ = 2
    READ_RANGE = 3
    READ_LAC = 4
    WRITE_LAC = 5
    FORCE_LEDGER = 6
    GET_BOOKIE_INFO = 7
    ADMIN_TRIGGER = 8
    ADMIN_STATUS = 9
    READ_STRIDE = 10
    START_TLS = 11
    AUTH = 12
    LEDGER_HOLDINGS = 13


class AddFlags(enum.IntFlag):
    NONE = 0
    RECOVERY_ADD = 1
    HIGH_PRIORITY = 2
    TRUNCATE = 4
    SPARSE = 8  # ADD v1: ascending entry ids, not necessarily consecutive (see layouts)


class ReadFlags(enum.IntFlag):
    NONE = 0
    FENCE = 1
    PIGGYBACK = 2
    HIGH_PRIORITY = 4


class HoldingFlags(enum.IntFlag):
    NONE = 0
    FENCED = 1
    HAS_KEY = 2


class BookieState(enum.IntEnum):
    WRITABLE = 0
    READ_ONLY = 1


class AdminKind(enum.IntEnum):
    GC = 0
    MINOR_COMPACTION = 1
    MAJOR_COMPACTION = 2
    READ_ONLY = 3   # refuse new plain adds until WRITABLE or a restart (draining)
    WRITABLE = 4


class Message:
    """Base of every body; ``LAYOUT`` is its construct declaration."""

    __slots__ = ()
    LAYOUT: ClassVar[Any]
    API_KEY: ClassVar[ApiKey]
    # Element classes of arrays of structs, by field name.
    ELEMENTS: ClassVar[dict[str, type]] = {}


def _check_key(cls_name: str, key: bytes) -> None:
    if len(key) != layouts.MASTER_KEY_SIZE:
        raise ValueError(f"{cls_name}.master_key must be {layouts.MASTER_KEY_SIZE} bytes, got {len(key)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiVersionRange:
    api_key: int
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiVersionsRequest(Message):
    LAYOUT: ClassVar[Any] = layouts.API_VERSIONS_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.API_VERSIONS


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiVersionsResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.API_VERSIONS_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.API_VERSIONS
    ELEMENTS: ClassVar[dict[str, type]] = {"versions": ApiVersionRange}
    versions: tuple[ApiVersionRange, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class AddRequest(Message):
    """Entries of one ledger: consecutive (entry i has id ``first_entry_id + i``), or
    with the SPARSE flag any ascending ids, each read from its entry's header."""

    LAYOUT: ClassVar[Any] = layouts.ADD_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.ADD
    ledger_id: int
    first_entry_id: int
    flags: int = AddFlags.NONE
    master_key: bytes
    term: int = 0
    entries: tuple[bytes, ...]

    def __post_init__(self) -> None:
        _check_key("AddRequest", self.master_key)


@dataclass(frozen=True, slots=True, kw_only=True)
class AddResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.ADD_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.ADD
    ledger_id: int
    first_entry_id: int
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadRequest(Message):
    """One entry (``entry_id=-1``: the last one held); a long poll when ``timeout_ms > 0``."""

    LAYOUT: ClassVar[Any] = layouts.READ_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.READ
    ledger_id: int
    entry_id: int
    flags: int = ReadFlags.NONE
    master_key: bytes = NO_MASTER_KEY
    term: int = 0
    previous_lac: int = -1
    timeout_ms: int = 0

    def __post_init__(self) -> None:
        _check_key("ReadRequest", self.master_key)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.READ_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.READ
    ledger_id: int
    entry_id: int
    max_lac: int
    entry: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadRangeRequest(Message):
    LAYOUT: ClassVar[Any] = layouts.READ_RANGE_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.READ_RANGE
    ledger_id: int
    first_entry_id: int
    max_count: int
    max_bytes: int
    flags: int = ReadFlags.NONE
    master_key: bytes = NO_MASTER_KEY
    term: int = 0

    def __post_init__(self) -> None:
        _check_key("ReadRangeRequest", self.master_key)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadRangeResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.READ_RANGE_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.READ_RANGE
    ledger_id: int
    first_entry_id: int
    max_lac: int
    entries: tuple[bytes, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadStrideRequest(Message):
    LAYOUT: ClassVar[Any] = layouts.READ_STRIDE_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.READ_STRIDE
    ledger_id: int
    first_entry_id: int
    stride: int
    max_count: int
    max_bytes: int
    flags: int = ReadFlags.NONE
    master_key: bytes = NO_MASTER_KEY
    term: int = 0

    def __post_init__(self) -> None:
        _check_key("ReadStrideRequest", self.master_key)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadStrideResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.READ_STRIDE_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.READ_STRIDE
    ledger_id: int
    first_entry_id: int
    max_lac: int
    entries: tuple[bytes, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLacRequest(Message):
    LAYOUT: ClassVar[Any] = layouts.READ_LAC_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.READ_LAC
    ledger_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLacResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.READ_LAC_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.READ_LAC
    ledger_id: int
    explicit_lac: bytes = b""
    last_entry: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteLacRequest(Message):
    LAYOUT: ClassVar[Any] = layouts.WRITE_LAC_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.WRITE_LAC
    ledger_id: int
    lac: int
    master_key: bytes
    term: int = 0
    lac_body: bytes

    def __post_init__(self) -> None:
        _check_key("WriteLacRequest", self.master_key)


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteLacResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.WRITE_LAC_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.WRITE_LAC
    ledger_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ForceLedgerRequest(Message):
    LAYOUT: ClassVar[Any] = layouts.FORCE_LEDGER_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.FORCE_LEDGER
    ledger_id: int
    master_key: bytes

    def __post_init__(self) -> None:
        _check_key("ForceLedgerRequest", self.master_key)


@dataclass(frozen=True, slots=True, kw_only=True)
class ForceLedgerResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.FORCE_LEDGER_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.FORCE_LEDGER
    ledger_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GetBookieInfoRequest(Message):
    LAYOUT: ClassVar[Any] = layouts.GET_BOOKIE_INFO_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.GET_BOOKIE_INFO


@dataclass(frozen=True, slots=True, kw_only=True)
class GetBookieInfoResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.GET_BOOKIE_INFO_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.GET_BOOKIE_INFO
    total_bytes: int
    free_bytes: int
    state: int = BookieState.WRITABLE
    version: bytes = b""

    @property
    def is_read_only(self) -> bool:
        return self.state == BookieState.READ_ONLY


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminTriggerRequest(Message):
    LAYOUT: ClassVar[Any] = layouts.ADMIN_TRIGGER_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.ADMIN_TRIGGER
    kind: int
    secret: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminTriggerResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.ADMIN_TRIGGER_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.ADMIN_TRIGGER
    started: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminStatusRequest(Message):
    LAYOUT: ClassVar[Any] = layouts.ADMIN_STATUS_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.ADMIN_STATUS
    secret: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminStatusResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.ADMIN_STATUS_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.ADMIN_STATUS
    status_json: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class StartTlsRequest(Message):
    LAYOUT: ClassVar[Any] = layouts.START_TLS_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.START_TLS


@dataclass(frozen=True, slots=True, kw_only=True)
class StartTlsResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.START_TLS_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.START_TLS


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthRequest(Message):
    LAYOUT: ClassVar[Any] = layouts.AUTH_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.AUTH
    mechanism: bytes = b"token"
    token: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.AUTH_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.AUTH
    principal: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerHoldingsRequest(Message):
    """A page of what the bookie holds, from ``first_ledger_id`` (admin)."""

    LAYOUT: ClassVar[Any] = layouts.LEDGER_HOLDINGS_REQUEST
    API_KEY: ClassVar[ApiKey] = ApiKey.LEDGER_HOLDINGS
    first_ledger_id: int = 0
    first_entry_id: int = 0
    max_ledgers: int = 1000
    max_ranges: int = 10000
    secret: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldLedger:
    """One ledger's state on a bookie (see ``layouts.LEDGER_HOLDINGS_RESPONSE``)."""

    ledger_id: int
    flags: int = HoldingFlags.NONE
    term: int = 0
    lac: int = -1
    last_entry_id: int = -1
    key_check: bytes = bytes(layouts.KEY_CHECK_SIZE)

    @property
    def is_fenced(self) -> bool:
        return bool(self.flags & HoldingFlags.FENCED)

    @property
    def has_key(self) -> bool:
        return bool(self.flags & HoldingFlags.HAS_KEY)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldRange:
    """Entry ids ``first_entry_id..last_entry_id`` (inclusive) of a ledger, held."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerHoldingsResponse(Message):
    LAYOUT: ClassVar[Any] = layouts.LEDGER_HOLDINGS_RESPONSE
    API_KEY: ClassVar[ApiKey] = ApiKey.LEDGER_HOLDINGS
    ELEMENTS: ClassVar[dict[str, type]] = {"ledgers": HeldLedger, "ranges": HeldRange}
    next_ledger_id: int = -1
    next_entry_id: int = -1
    ledgers: tuple[HeldLedger, ...] = ()
    ranges: tuple[HeldRange, ...] = ()

    @property
    def is_last(self) -> bool:
        return self.next_ledger_id < 0


REQUEST_TYPES: dict[ApiKey, type[Message]] = {
    ApiKey.API_VERSIONS: ApiVersionsRequest,
    ApiKey.ADD: AddRequest,
    ApiKey.READ: ReadRequest,
    ApiKey.READ_RANGE: ReadRangeRequest,
    ApiKey.READ_LAC: ReadLacRequest,
    ApiKey.WRITE_LAC: WriteLacRequest,
    ApiKey.FORCE_LEDGER: ForceLedgerRequest,
    ApiKey.GET_BOOKIE_INFO: GetBookieInfoRequest,
    ApiKey.ADMIN_TRIGGER: AdminTriggerRequest,
    ApiKey.ADMIN_STATUS: AdminStatusRequest,
    ApiKey.READ_STRIDE: ReadStrideRequest,
    ApiKey.START_TLS: StartTlsRequest,
    ApiKey.AUTH: AuthRequest,
    ApiKey.LEDGER_HOLDINGS: LedgerHoldingsRequest,
}
RESPONSE_TYPES: dict[ApiKey, type[Message]] = {
    ApiKey.API_VERSIONS: ApiVersionsResponse,
    ApiKey.ADD: AddResponse,
    ApiKey.READ: ReadResponse,
    ApiKey.READ_RANGE: ReadRangeResponse,
    ApiKey.READ_LAC: ReadLacResponse,
    ApiKey.WRITE_LAC: WriteLacResponse,
    ApiKey.FORCE_LEDGER: ForceLedgerResponse,
    ApiKey.GET_BOOKIE_INFO: GetBookieInfoResponse,
    ApiKey.ADMIN_TRIGGER: AdminTriggerResponse,
    ApiKey.ADMIN_STATUS: AdminStatusResponse,
    ApiKey.READ_STRIDE: ReadStrideResponse,
    ApiKey.START_TLS: StartTlsResponse,
    ApiKey.AUTH: AuthResponse,
    ApiKey.LEDGER_HOLDINGS: LedgerHoldingsResponse,
}
assert set(REQUEST_TYPES) == set(RESPONSE_TYPES) == set(ApiKey)

# The versions this build speaks, per api key: (min, max).
SUPPORTED_VERSIONS: dict[ApiKey, tuple[int, int]] = {key: (0, 0) for key in ApiKey}
# ADD v1: the SPARSE flag. A client sends it only to a bookie that answered ApiVersions
# with ADD v1; to an older one the same entries go as consecutive runs.
SUPPORTED_VERSIONS[ApiKey.ADD] = (0, 1)
