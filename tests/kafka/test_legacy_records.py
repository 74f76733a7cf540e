"""Message sets of magic 0 and 1 (Produce v0-2) and their up-conversion to RecordBatch v2.

Round trips, for every message size around 4096-byte boundaries and every codec a v0/v1
message carries: what a pre-0.11 client writes (kafka-python's own legacy builder, an
independent writer, and ``legacy_message_set``) ``messages`` reads back message for
message, and ``upconverted`` holds the same records, read by kafka-python's RecordBatch
v2 reader (an independent reader) and checked by the gateway's own
``records.split_batches``."""

from __future__ import annotations

import gzip
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from ledgerd.kafka.compression import Codec
from ledgerd.kafka.legacy_records import (
    NO_TIMESTAMP,
    LegacyMessage,
    legacy_batch,
    legacy_message_set,
    messages,
    upconverted,
)
from ledgerd.kafka.records import BatchError, split_batches

# sizes near 4096 multiples, and small ones
_SIZES = st.one_of(st.integers(0, 64), st.sampled_from([4095, 4096, 4097, 8191, 8192]),
                   st.integers(4000, 4200), st.integers(0, 65536))
_PAYLOAD = st.one_of(st.none(), _SIZES.map(lambda n: bytes(i % 251 for i in range(n))))
_CODECS = {Codec.UNCOMPRESSED: 0, Codec.GZIP: 1, Codec.SNAPPY: 2, Codec.LZ4: 3}


@st.composite
def _message_sets(draw: st.DrawFn) -> tuple[int, Codec, list[LegacyMessage]]:
    magic = draw(st.sampled_from([0, 1]))
    codecs = [Codec.UNCOMPRESSED, Codec.GZIP, Codec.SNAPPY] + ([Codec.LZ4] if magic else [])
    codec = draw(st.sampled_from(codecs))
    n = draw(st.integers(1, 6))
    msgs = [LegacyMessage(draw(_PAYLOAD), draw(_PAYLOAD),
                          draw(st.integers(0, 2**41)) if magic else NO_TIMESTAMP, magic)
            for _ in range(n)]
    return magic, codec, msgs


def _v2_records(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None]]:
    records = MemoryRecords(batch)
    b = records.next_batch()
    assert records.next_batch() is None
    return [(r.offset, r.timestamp, r.key, r.value) for r in b]


def _expected(msgs: list[LegacyMessage]) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return [(i, m.timestamp, m.key, m.value) for i, m in enumerate(msgs)]


@settings(max_examples=150, deadline=None)
@given(_message_sets())
def test_a_client_written_message_set_reads_back_and_upconverts(
        drawn: tuple[int, Codec, list[LegacyMessage]]) -> None:
    magic, codec, msgs = drawn
    if codec is Codec.SNAPPY:  # kafka-python writes snappy through python-snappy, not here
        codec = Codec.GZIP
    builder = LegacyRecordBatchBuilder(magic, _CODECS[codec], 1 << 30)
    for i, m in enumerate(msgs):
        builder.append(i, m.timestamp if magic else None, m.key, m.value)
    raw = bytes(builder.build())
    assert list(messages(raw)) == msgs
    batch, codec = upconverted(raw)
    assert codec == (Codec.UNCOMPRESSED if not msgs or codec is Codec.UNCOMPRESSED else codec)
    assert _v2_records(batch) == _expected(msgs)
    ((header, _),) = split_batches(batch, max_batch_bytes=1 << 30)
    assert header.record_count == len(msgs)
    assert header.producer_id == -1 and header.attributes == 0


@settings(max_examples=100, deadline=None)
@given(_message_sets())
def test_our_writer_and_reader_agree(drawn: tuple[int, Codec, list[LegacyMessage]]) -> None:
    magic, codec, msgs = drawn
    raw = legacy_message_set(msgs, codec, magic=magic)
    assert list(messages(raw)) == msgs
    assert _v2_records(upconverted(raw)[0]) == _expected(msgs)


def test_a_log_append_time_wrapper_gives_its_time_to_every_inner_message() -> None:
    msgs = [LegacyMessage(b"k", b"v", 5, 1), LegacyMessage(b"k2", b"v2", 6, 1)]
    raw = bytearray(legacy_message_set(msgs, Codec.GZIP, timestamp=777))
    # the wrapper's attributes (after offset, size, crc, magic): set LogAppendTime, new CRC
    raw[12 + 5] |= 0x08
    struct.pack_into(">I", raw, 12, zlib.crc32(bytes(raw[16:])))
    assert [m.timestamp for m in messages(bytes(raw))] == [777, 777]


def test_magic_zero_timestamps_are_none_after_upconversion() -> None:
    batch, _ = upconverted(legacy_message_set([LegacyMessage(b"k", b"v", magic=0)] * 3,
                                              magic=0))
    assert [t for _, t, _, _ in _v2_records(batch)] == [-1, -1, -1]


@pytest.mark.parametrize(("mangle", "code", "says"), [
    (lambda raw: raw[:-1], 2, "claims"),  # cut short
    (lambda raw: raw[:12] + bytes([raw[12] ^ 1]) + raw[13:], 2, "CRC-32"),
    (lambda raw: raw + b"\x00\x00", 2, "trailing bytes"),
    (lambda raw: b"", 87, "empty message set"),
])
def test_a_bad_message_set_is_refused_with_kafkas_code(mangle: object, code: int,
                                                       says: str) -> None:
    raw = legacy_message_set([LegacyMessage(b"key", b"value", 1, 1)])
    with pytest.raises(BatchError, match=says) as got:
        upconverted(mangle(raw))  # type: ignore[operator]
    assert got.value.code == code


def test_a_record_batch_in_an_old_produce_is_invalid_record() -> None:
    from ledgerd.kafka.control_records import control_batch

    with pytest.raises(BatchError, match="magic 2") as got:
        upconverted(control_batch(producer_id=1, producer_epoch=0, commit=True))
    assert got.value.code == 87


def test_a_compression_bomb_is_bounded() -> None:
    from ledgerd.kafka.timestamps import MAX_RECORDS_BYTES

    inner = bytes(MAX_RECORDS_BYTES + 1)
    msg = LegacyMessage(None, inner, 1, 1)
    raw = legacy_message_set([msg], Codec.GZIP)
    assert len(raw) < MAX_RECORDS_BYTES // 100
    with pytest.raises(BatchError, match="expand past"):
        upconverted(raw)


def test_the_wrappers_of_one_set_share_one_decompression_budget() -> None:
    """Eight wrappers of 1 MiB each, a 4 MiB budget: refused at the fifth, not after
    building the whole batch."""
    one = legacy_message_set([LegacyMessage(None, bytes(1 << 20), 1, 1)], Codec.GZIP)
    with pytest.raises(BatchError, match="expand past") as got:
        upconverted(one * 8, 4 << 20)
    assert got.value.code == 2
    batch, codec = upconverted(one * 3, 4 << 20)
    assert codec is Codec.GZIP and len(_v2_records(batch)) == 3


def test_a_cut_snappy_wrapper_is_corrupt_not_a_crash() -> None:
    raw = legacy_message_set([LegacyMessage(b"k", b"value " * 50, 1, 1)], Codec.SNAPPY)
    for cut in range(1, 40):  # the wrapper's value cut short, its CRC made right again
        body = bytearray(raw[:len(raw) - cut])
        struct.pack_into(">i", body, 8, len(body) - 12)  # messageSize
        value_len_at = 12 + 4 + 2 + 8 + 4  # crc, magic+attrs, timestamp, key len -1
        struct.pack_into(">i", body, value_len_at, len(body) - value_len_at - 4)
        struct.pack_into(">I", body, 12, zlib.crc32(bytes(body[16:])))
        with pytest.raises(BatchError) as got:
            upconverted(bytes(body))
        assert got.value.code == 2, cut


def test_timestamps_below_minus_one_are_refused_and_mixed_sets_keep_none() -> None:
    with pytest.raises(BatchError, match="timestamp") as got:
        upconverted(legacy_message_set([LegacyMessage(b"k", b"v", -5, 1)]))
    assert got.value.code == 32  # INVALID_TIMESTAMP
    mixed = (legacy_message_set([LegacyMessage(b"a", b"1", 1_700_000_000_000, 1)])
             + legacy_message_set([LegacyMessage(b"b", b"2", magic=0)]))
    batch, _ = upconverted(mixed)
    assert [t for _, t, _, _ in _v2_records(batch)] == [1_700_000_000_000, -1]


def test_an_inner_message_of_another_magic_is_invalid() -> None:
    inner = legacy_message_set([LegacyMessage(b"k", b"v", magic=0)])
    wrapper = legacy_message_set([LegacyMessage(None, gzip.compress(inner), 5, 1)])
    # attributes of the wrapper: gzip
    raw = bytearray(wrapper)
    raw[12 + 5] = 1
    struct.pack_into(">I", raw, 12, zlib.crc32(bytes(raw[16:])))
    with pytest.raises(BatchError, match="magic 0, its wrapper 1") as got:
        upconverted(bytes(raw))
    assert got.value.code == 87


@pytest.mark.parametrize(("topic", "stored"), [(None, Codec.GZIP), (Codec.LZ4, Codec.LZ4),
                                               (Codec.UNCOMPRESSED, Codec.UNCOMPRESSED)])
def test_the_stored_batch_takes_the_topics_codec_or_the_producers(
        topic: Codec | None, stored: Codec) -> None:
    raw = legacy_message_set([LegacyMessage(b"k", b"v" * 100, 1, 1)], Codec.GZIP)
    batch = legacy_batch(raw, topic)
    ((header, _),) = split_batches(batch, max_batch_bytes=1 << 20)
    assert header.attributes & 7 == stored
    assert [v for _, _, _, v in _v2_records(batch)] == [b"v" * 100]
