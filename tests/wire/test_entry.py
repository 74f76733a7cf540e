"""Entry digests: known answers for every type, verification failures, compression bounds."""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from ledgerd.wire.compression import compress_payload, decompress_payload
from ledgerd.wire.entry import (
    Digester,
    DigestType,
    decode_entry,
    decode_lac_body,
    encode_entry,
    encode_lac_body,
    mac_key,
    master_key,
    peek_entry_header,
)
from ledgerd.wire.errors import DecompressionError, DigestMismatchError, EntryFormatError


def _crc32c_reference(data: bytes) -> int:
    """Bitwise CRC-32C (Castagnoli, reflected 0x82F63B78): independent of google-crc32c."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc_check_values() -> None:
    # The standard check values for "123456789".
    assert _crc32c_reference(b"123456789") == 0xE3069283
    assert Digester(DigestType.CRC32C).compute(b"123456789") == struct.pack(">I", 0xE3069283)
    assert Digester(DigestType.CRC32).compute(b"123456789") == struct.pack(">q", 0xCBF43926)


def test_master_and_mac_keys() -> None:
    assert master_key(b"secret") == hashlib.sha1(b"ledgersecret").digest()
    assert mac_key(b"secret") == hashlib.sha1(b"macsecret").digest()
    assert len(master_key(b"")) == 20


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_entry_known_answer(digest_type: DigestType) -> None:
    payload = b"hello ledgerd"
    data = encode_entry(Digester(digest_type, b"pw"), 7, 3, 2, 100, payload)
    header = struct.pack(">qqqq", 7, 3, 2, 100)
    expected_digest = {
        DigestType.CRC32C: struct.pack(">I", _crc32c_reference(header + payload)),
        DigestType.CRC32: struct.pack(">q", zlib.crc32(header + payload)),
        DigestType.HMAC: hmac.new(hashlib.sha1(b"macpw").digest(), header + payload,
                                  hashlib.sha1).digest(),
        DigestType.DUMMY: b"",
    }[digest_type]
    assert data == header + expected_digest + payload
    entry = decode_entry(Digester(digest_type, b"pw"), data, ledger_id=7, entry_id=3)
    assert (entry.ledger_id, entry.entry_id, entry.lac, entry.length, entry.payload) == \
        (7, 3, 2, 100, payload)
    assert peek_entry_header(data).lac == 2


@pytest.mark.parametrize("digest_type", [DigestType.CRC32C, DigestType.CRC32, DigestType.HMAC])
@given(payload=st.binary(max_size=64), flip=st.integers(0, 10_000))
def test_any_flipped_bit_is_caught(digest_type: DigestType, payload: bytes, flip: int) -> None:
    d = Digester(digest_type, b"pw")
    data = bytearray(encode_entry(d, 1, 2, 1, len(payload), payload))
    bit = flip % (len(data) * 8)
    data[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises((DigestMismatchError, EntryFormatError)) as info:
        decode_entry(d, bytes(data), ledger_id=1, entry_id=2)
    if isinstance(info.value, DigestMismatchError):
        assert info.value.digest_type == digest_type.value


def test_mismatch_error_names_ledger_entry_and_type() -> None:
    d = Digester(DigestType.CRC32C)
    data = bytearray(encode_entry(d, 5, 6, 4, 1, b"x"))
    data[-1] ^= 0xFF
    with pytest.raises(DigestMismatchError, match="ledger 5 entry 6 \\(crc32c\\)"):
        decode_entry(d, bytes(data))


def test_hmac_with_wrong_password_fails() -> None:
    data = encode_entry(Digester(DigestType.HMAC, b"right"), 1, 0, -1, 1, b"x")
    with pytest.raises(DigestMismatchError):
        decode_entry(Digester(DigestType.HMAC, b"wrong"), data)


def test_short_entry_and_wrong_ids() -> None:
    d = Digester(DigestType.CRC32C)
    with pytest.raises(EntryFormatError, match="shorter"):
        decode_entry(d, b"tiny")
    with pytest.raises(EntryFormatError, match="shorter"):
        peek_entry_header(b"tiny")
    data = encode_entry(d, 1, 2, 1, 1, b"x")
    with pytest.raises(EntryFormatError, match="expected 9"):
        decode_entry(d, data, ledger_id=9)
    with pytest.raises(EntryFormatError, match="expected 3"):
        decode_entry(d, data, entry_id=3)


def test_lac_body_round_trip_and_tamper() -> None:
    d = Digester(DigestType.CRC32C)
    body = encode_lac_body(d, 9, 41)
    assert decode_lac_body(d, body, ledger_id=9) == 41
    with pytest.raises(DigestMismatchError):
        decode_lac_body(d, body[:-1] + bytes([body[-1] ^ 1]), ledger_id=9)
    with pytest.raises(EntryFormatError):
        decode_lac_body(d, body, ledger_id=8)


def test_compression_round_trip_and_bounds() -> None:
    payload = b"abc" * 1000
    packed = compress_payload(payload)
    assert len(packed) < len(payload)
    assert decompress_payload(packed, len(payload)) == payload
    with pytest.raises(DecompressionError, match="declares"):
        decompress_payload(packed, len(payload) - 1)


def test_zip_bomb_without_declared_size_is_refused() -> None:
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(50_000_000))
    assert len(bomb) < 10_000
    with pytest.raises(DecompressionError, match="past the limit"):
        decompress_payload(bomb, 1 << 20)


def test_corrupt_compressed_payload() -> None:
    packed = bytearray(compress_payload(b"hello world" * 50))
    packed[len(packed) // 2] ^= 0xFF
    with pytest.raises(DecompressionError):
        decompress_payload(bytes(packed), 1 << 20)
    with pytest.raises(DecompressionError, match="not a zstd frame"):
        decompress_payload(b"plain", 100)
