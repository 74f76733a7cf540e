"""The log header (entry 0 of a log's ledger): one declaration per version, written and
read back byte for byte (version 2 with its writers count and extra, version 1 still
read); anything else is either not a header or named corrupt."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerd.metadata.logheader import (
    HEADER_KEY,
    LOG_HEADER,
    LOG_HEADER_FIXED,
    LOG_HEADER_V2,
    MAGIC,
    MAX_EXTRA,
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
                     ensemble_size=e, write_quorum=qw, ack_quorum=draw(st.integers(1, qw)),
                     writers=draw(st.integers(0, 2**63 - 1)),
                     # every size the extra may have: empty, small, the limit itself
                     extra=draw(st.one_of(
                         st.binary(max_size=64),
                         st.tuples(st.integers(0, MAX_EXTRA), st.binary(min_size=1, max_size=8))
                         .map(lambda t: (t[1] * (t[0] // len(t[1]) + 1))[:t[0]]),
                         st.just(b"\xff" * MAX_EXTRA))))


@given(headers())
def test_a_header_round_trips_with_every_size_declared_once(h: LogHeader) -> None:
    raw = encode_log_header(h)
    assert raw.startswith(MAGIC)
    assert len(raw) == LOG_HEADER_FIXED.sizeof() + len(h.name.encode()) + 8 + 4 + \
        len(h.extra) + 4
    doc = LOG_HEADER_V2.parse(raw)  # the declaration reads it too
    assert (doc.version, doc.name, doc.writers, doc.extra) == (2, h.name.encode(), h.writers,
                                                               h.extra)
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


@given(headers())
def test_a_version_1_header_is_still_read_without_writers_or_extra(h: LogHeader) -> None:
    import google_crc32c

    name = h.name.encode()
    body = LOG_HEADER.build({
        "version": 1, "seq": h.seq, "prev_ledger_id": h.prev_ledger_id,
        "first_offset": h.first_offset, "ensemble_size": h.ensemble_size,
        "write_quorum": h.write_quorum, "ack_quorum": h.ack_quorum,
        "name_length": len(name), "name": name, "crc32c": 0})[:-4]
    raw = body + int(google_crc32c.value(body)).to_bytes(4, "big")
    assert decode_log_header(raw) == replace(h, writers=0, extra=b"")


def test_an_extra_over_the_limit_or_a_negative_writers_count_is_refused() -> None:
    with pytest.raises(ValueError):
        LogHeader(name="a", seq=0, ensemble_size=1, write_quorum=1, ack_quorum=1,
                  extra=b"x" * (MAX_EXTRA + 1))
    with pytest.raises(ValueError):
        LogHeader(name="a", seq=0, ensemble_size=1, write_quorum=1, ack_quorum=1, writers=-1)


def test_an_unknown_version_is_corrupt() -> None:
    import google_crc32c

    raw = bytearray(encode_log_header(LogHeader(name="a", seq=0, ensemble_size=1,
                                                write_quorum=1, ack_quorum=1)))
    raw[len(MAGIC):len(MAGIC) + 2] = (3).to_bytes(2, "big")
    raw[-4:] = int(google_crc32c.value(bytes(raw[:-4]))).to_bytes(4, "big")
    with pytest.raises(CorruptLogHeaderError, match="version 3"):
        decode_log_header(bytes(raw))


def test_only_a_marked_ledger_starts_its_log_entries_at_one() -> None:
    assert first_log_entry({HEADER_KEY: "1"}) == 1
    assert first_log_entry({}) == 0 and first_log_entry({HEADER_KEY: "0"}) == 0
