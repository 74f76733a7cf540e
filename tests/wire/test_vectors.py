"""Golden byte vectors: any accidental change to a frame layout fails here.

Each message type has a sample below and a file ``vectors/<name>.hex`` with the frame
it encodes to. To change the format on purpose, delete the file and run with
``LEDGERD_WRITE_VECTORS=1``; the new bytes then show up in review.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ledgerd.wire.frames import decode_request, decode_response, encode_request, encode_response
from ledgerd.wire.messages import (
    AddFlags,
    AddRequest,
    AddResponse,
    AdminKind,
    AdminStatusRequest,
    AdminStatusResponse,
    AdminTriggerRequest,
    AdminTriggerResponse,
    ApiKey,
    ApiVersionRange,
    ApiVersionsRequest,
    ApiVersionsResponse,
    AuthRequest,
    AuthResponse,
    BookieState,
    ForceLedgerRequest,
    ForceLedgerResponse,
    GetBookieInfoRequest,
    GetBookieInfoResponse,
    HeldLedger,
    HeldRange,
    HoldingFlags,
    LedgerHoldingsRequest,
    LedgerHoldingsResponse,
    Message,
    ReadFlags,
    ReadLacRequest,
    ReadLacResponse,
    ReadRangeRequest,
    ReadRangeResponse,
    ReadRequest,
    ReadResponse,
    ReadStrideRequest,
    ReadStrideResponse,
    StartTlsRequest,
    StartTlsResponse,
    WriteLacRequest,
    WriteLacResponse,
)
from ledgerd.wire.status import Status

VECTORS = Path(__file__).parent / "vectors"
KEY = bytes(range(20))

REQUESTS: dict[str, Message] = {
    "api_versions_request": ApiVersionsRequest(),
    "add_request": AddRequest(ledger_id=0x0102030405060708, first_entry_id=9,
                              flags=AddFlags.RECOVERY_ADD | AddFlags.HIGH_PRIORITY,
                              master_key=KEY, term=3, entries=(b"entry-9", b"entry-10")),
    "read_request": ReadRequest(ledger_id=42, entry_id=-1, flags=ReadFlags.FENCE, master_key=KEY,
                                term=1, previous_lac=17, timeout_ms=500),
    "read_range_request": ReadRangeRequest(ledger_id=42, first_entry_id=5, max_count=100,
                                           max_bytes=1 << 20, flags=ReadFlags.HIGH_PRIORITY),
    "read_stride_request": ReadStrideRequest(ledger_id=42, first_entry_id=5, stride=3,
                                             max_count=100, max_bytes=1 << 20),
    "read_lac_request": ReadLacRequest(ledger_id=42),
    "write_lac_request": WriteLacRequest(ledger_id=42, lac=12, master_key=KEY, term=0,
                                         lac_body=b"lacbody"),
    "force_ledger_request": ForceLedgerRequest(ledger_id=42, master_key=KEY),
    "get_bookie_info_request": GetBookieInfoRequest(),
    "admin_trigger_request": AdminTriggerRequest(kind=AdminKind.MAJOR_COMPACTION, secret=b"s3"),
    "admin_status_request": AdminStatusRequest(secret=b""),
    "start_tls_request": StartTlsRequest(),
    "auth_request": AuthRequest(mechanism=b"token", token=b"t0ken"),
    "ledger_holdings_request": LedgerHoldingsRequest(first_ledger_id=42, first_entry_id=7,
                                                     max_ledgers=100, max_ranges=1000,
                                                     secret=b"s3"),
}
RESPONSES: dict[str, tuple[ApiKey, Status, Message | None]] = {
    "api_versions_response": (ApiKey.API_VERSIONS, Status.OK, ApiVersionsResponse(versions=(
        ApiVersionRange(api_key=1, min_version=0, max_version=0),
        ApiVersionRange(api_key=2, min_version=0, max_version=1)))),
    "add_response": (ApiKey.ADD, Status.OK, AddResponse(ledger_id=42, first_entry_id=9, count=2)),
    "read_response": (ApiKey.READ, Status.OK, ReadResponse(ledger_id=42, entry_id=10, max_lac=9,
                                                           entry=b"entry-bytes")),
    "read_range_response": (ApiKey.READ_RANGE, Status.OK, ReadRangeResponse(
        ledger_id=42, first_entry_id=5, max_lac=6, entries=(b"e5", b"e6"))),
    "read_stride_response": (ApiKey.READ_STRIDE, Status.OK, ReadStrideResponse(
        ledger_id=42, first_entry_id=5, max_lac=9, entries=(b"e5", b"e8"))),
    "read_lac_response": (ApiKey.READ_LAC, Status.OK, ReadLacResponse(
        ledger_id=42, explicit_lac=b"", last_entry=b"last")),
    "write_lac_response": (ApiKey.WRITE_LAC, Status.OK, WriteLacResponse(ledger_id=42)),
    "force_ledger_response": (ApiKey.FORCE_LEDGER, Status.OK, ForceLedgerResponse(ledger_id=42)),
    "get_bookie_info_response": (ApiKey.GET_BOOKIE_INFO, Status.OK, GetBookieInfoResponse(
        total_bytes=1 << 40, free_bytes=1 << 39, state=BookieState.READ_ONLY, version=b"0.1.0")),
    "admin_trigger_response": (ApiKey.ADMIN_TRIGGER, Status.OK, AdminTriggerResponse(started=1)),
    "admin_status_response": (ApiKey.ADMIN_STATUS, Status.OK,
                              AdminStatusResponse(status_json=b'{"state":"writable"}')),
    "start_tls_response": (ApiKey.START_TLS, Status.OK, StartTlsResponse()),
    "auth_response": (ApiKey.AUTH, Status.OK, AuthResponse(principal=b"svc-writer")),
    "ledger_holdings_response": (ApiKey.LEDGER_HOLDINGS, Status.OK, LedgerHoldingsResponse(
        next_ledger_id=43, next_entry_id=0,
        ledgers=(HeldLedger(ledger_id=42, flags=HoldingFlags.FENCED | HoldingFlags.HAS_KEY,
                            term=2, lac=9, last_entry_id=11, key_check=bytes(range(32))),),
        ranges=(HeldRange(ledger_id=42, first_entry_id=0, last_entry_id=5),
                HeldRange(ledger_id=42, first_entry_id=8, last_entry_id=11)))),
    "tls_required_response": (ApiKey.API_VERSIONS, Status.TLS_REQUIRED, None),
    "read_error_response": (ApiKey.READ, Status.NO_SUCH_ENTRY, ReadResponse(
        ledger_id=42, entry_id=11, max_lac=9, entry=b"")),
}


def _check(name: str, frame: bytes) -> None:
    path = VECTORS / f"{name}.hex"
    if not path.exists() and os.environ.get("LEDGERD_WRITE_VECTORS") == "1":
        path.write_text(frame.hex() + "\n")
    assert path.exists(), f"missing golden vector {path}"
    assert frame.hex() == path.read_text().strip(), f"{name} changed on the wire"


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_request_vector(name: str) -> None:
    msg = REQUESTS[name]
    frame = encode_request(msg, correlation_id=0x01020304)
    _check(name, frame)
    assert decode_request(frame[4:]).message == msg


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_response_vector(name: str) -> None:
    key, status, msg = RESPONSES[name]
    frame = encode_response(0x01020304, status, msg)
    _check(name, frame)
    back = decode_response(frame[4:], key)
    assert back.message == msg and back.status == status


def test_every_api_has_vectors() -> None:
    assert {type(m).API_KEY for m in REQUESTS.values()} == set(ApiKey)
    assert {k for k, _, _ in RESPONSES.values()} == set(ApiKey)
