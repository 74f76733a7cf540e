"""The log header (entry 0 of a log's ledger): one declaration, written and read back
byte for byte; anything else is either not a header or named corrupt."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerd.metadata.logheader import (
    HEADER_KEY,
    LOG_HEADER,
    LOG_HEADER_FIXED,
    MAGIC,
    CorruptLogHeaderError,
    LogHeader,
    decode_log_header,
    encode_log_header,
    first_log_entry,
    payload_of_entry,
)

NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}", fullmatch=True)


@st.composite
def headers(draw: st.DrawFn) -> LogHeader:
    e = draw(st.integers(1, 255))
    qw = draw(st.integers(1, e))
    return LogHeader(name=draw(NAMES), seq=draw(st.integers(0, 2**63 - 1)),
                     prev_ledger_id=draw(st.integers(-1, 2**63 - 1)),
                     first_offset=draw(st.integers(-1, 2**63 - 1)),
                     ensemble_size=e, write_quorum=qw, ack_quorum=draw(st.integers(1, qw)))


@given(headers())
def test_a_header_round_trips_with_every_size_declared_once(h: LogHeader) -> None:
    raw = encode_log_header(h)
    assert raw.startswith(MAGIC)
    assert len(raw) == LOG_HEADER_FIXED.sizeof() + len(h.name.encode()) + 4
    assert LOG_HEADER.parse(raw).name == h.name.encode()  # the declaration reads it too
    assert decode_log_header(raw) == h
    # As a bookie stores it: entry header, digest, then the payload.
    for digest, size in (("crc32c", 4), ("crc32", 8), ("hmac", 20), ("dummy", 0)):
        assert decode_log_header(payload_of_entry(bytes(32 + size) + raw, digest)) == h


@given(headers(), st.data())
def test_a_flipped_or_cut_byte_is_corrupt_never_another_header(h: LogHeader,
                                                              data: st.DataObject) -> None:
    raw = bytearray(encode_log_header(h))
    i = data.draw(st.integers(len(MAGIC), len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptLogHeaderError):
        decode_log_header(bytes(raw))
    with pytest.raises(CorruptLogHeaderError):
        decode_log_header(encode_log_header(h)[:i])


@given(st.binary(max_size=64))
def test_a_payload_without_the_magic_is_not_a_header(payload: bytes) -> None:
    if not payload.startswith(MAGIC):
        assert decode_log_header(payload) is None


def test_only_a_marked_ledger_starts_its_log_entries_at_one() -> None:
    assert first_log_entry({HEADER_KEY: "1"}) == 1
    assert first_log_entry({}) == 0 and first_log_entry({HEADER_KEY: "0"}) == 0
