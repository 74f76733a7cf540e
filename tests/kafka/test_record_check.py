"""Produced batches' records are walked before they are stored (``check_records``,
``check_batches``), as Kafka's log validator does: an outside probe had the gateway
store a batch counting 1000 records that held one (the next batch's offsets jumped by
1000), one counting 1 that held two (two records at one offset), and batches whose
records or compression did not parse (consumers stuck or crashing on them)."""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.kafka.api import ApiKey, ErrorCode
from ledgerd.kafka.compression import Codec, check_batches
from ledgerd.kafka.records import (
    HEADER_SIZE,
    BatchError,
    BatchHeader,
    batch_with_records,
    split_batches,
)
from tests.kafka.conftest import KafkaCluster
from tests.kafka.test_compression import _batch, _record, _records
from tests.kafka.test_faults import _produce, _reply, _request

BOUND_S = 60


def _check(batch: bytes) -> None:
    """What the gateway does with one produced batch."""
    check_batches(split_batches(batch, max_batch_bytes=1 << 24))


@settings(max_examples=150, deadline=None)
@given(records=st.lists(_record, min_size=1, max_size=20), codec=st.sampled_from(list(Codec)))
def test_every_batch_a_client_builds_passes(
        records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]],
        codec: Codec) -> None:
    _check(_batch(codec, records, transactional=False, pid=-1, epoch=-1, seq=-1))


@pytest.mark.parametrize("codec", list(Codec))
def test_varints_of_every_width_pass(codec: Codec) -> None:
    """Record lengths of one to three varint bytes, offset deltas past 63 (two bytes)
    and timestamp deltas of three: the inline one- and two-byte readings and the
    general one agree."""
    sizes = [0, 50, 60, 200, 8000, 9000, 20000]
    records = [(None if i % 3 else b"k%d" % i, bytes(sizes[i % len(sizes)]), [],
                (i * 7919) % 10_000_000) for i in range(300)]
    _check(_batch(codec, records, transactional=False, pid=-1, epoch=-1, seq=-1))


def _forged(section: bytes, count: int, codec: int = 0) -> bytes:
    """A batch whose header counts ``count`` records (lastOffsetDelta to match, CRC
    right) around the records section ``section`` (compressed with ``codec``)."""
    template = _batch(Codec.UNCOMPRESSED, [(b"k", b"v", [], 0)], transactional=False,
                      pid=-1, epoch=-1, seq=-1)
    head = bytearray(template[:HEADER_SIZE])
    struct.pack_into(">h", head, 21, codec)
    struct.pack_into(">i", head, 23, count - 1)
    return batch_with_records(head, section, count)


def _section(*values: bytes) -> bytes:
    """The records section of a batch holding these values (offset deltas 0, 1, ...)."""
    return _records(_batch(Codec.UNCOMPRESSED, [(b"k", v, [], 0) for v in values],
                           transactional=False, pid=-1, epoch=-1, seq=-1))


POISON = {
    # header counts 1000, one record inside: offsets 1-999 would be nobody's
    "count_more": (lambda: _forged(_section(b"1"), 1000), ErrorCode.CORRUPT_MESSAGE),
    # header counts 1, two inside: both would have the batch's one offset
    "count_less": (lambda: _forged(_section(b"1", b"2"), 1), ErrorCode.INVALID_RECORD),
    # two records whose offset deltas are 0 and 0
    "offset_deltas": (lambda: _forged(_section(b"1") * 2, 2), ErrorCode.INVALID_RECORD),
    "varint_garbage": (lambda: _forged(b"\xff" * 20, 1), ErrorCode.CORRUPT_MESSAGE),
    "gzip_garbage": (lambda: _forged(b"\x1f\x8b\x08garbage", 1, codec=1),
                     ErrorCode.CORRUPT_MESSAGE),
    # a 7-byte record whose key claims 100 bytes (found by a review: only the count and
    # offset deltas were read at first)
    "key_past_end": (lambda: _forged(b"\x0e\x00\x00\x00\xc8\x01\x01\x00", 1),
                     ErrorCode.CORRUPT_MESSAGE),
    # a record claiming 5 headers and holding none
    "headers_missing": (lambda: _forged(b"\x0c\x00\x00\x00\x01\x01\x0a", 1),
                        ErrorCode.CORRUPT_MESSAGE),
    # a record with a byte after its last field
    "byte_over": (lambda: _forged(b"\x0e\x00\x00\x00\x01\x01\x00\x00", 1),
                  ErrorCode.CORRUPT_MESSAGE),
    # a record length of 10^9 in a 15-byte section
    "length_huge": (lambda: _forged(b"\x80\xa8\xd6\xb9\x07" + bytes(10), 1),
                    ErrorCode.CORRUPT_MESSAGE),
}


@pytest.mark.parametrize("case", sorted(POISON))
def test_batches_whose_records_lie_are_refused_naming_the_fault(case: str) -> None:
    make, code = POISON[case]
    with pytest.raises(BatchError) as caught:
        _check(make())
    assert caught.value.code == code, caught.value


def test_the_gateway_refuses_them_and_the_offsets_stay_one_per_record(
        kafka_cluster: KafkaCluster) -> None:
    good = _batch(Codec.UNCOMPRESSED, [(b"k", b"good", [], 0)], transactional=False,
                  pid=-1, epoch=-1, seq=-1)
    host, port = kafka_cluster.bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=BOUND_S) as sock:
        sock.sendall(_request(ApiKey.METADATA, 4, {"topics": [{"name": "poison"}],
                                                   "allow_auto_topic_creation": True}))
        _reply(sock, ApiKey.METADATA, 4)
        offsets = []
        for case in [None, *sorted(POISON), None]:
            batch = good if case is None else POISON[case][0]()
            sock.sendall(_request(ApiKey.PRODUCE, 7, _produce("poison", batch)))
            part = _reply(sock, ApiKey.PRODUCE, 7)["responses"][0][  # type: ignore[index]
                "partition_responses"][0]
            if case is None:
                assert part["error_code"] == 0, part
                offsets.append(part["base_offset"])
            else:
                assert part["error_code"] == POISON[case][1], (case, part)
        assert offsets[1] == offsets[0] + 1  # nothing the poison claimed took an offset
        sock.sendall(_request(ApiKey.FETCH, 4, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "topics": [{"topic": "poison", "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}))
        data = _reply(sock, ApiKey.FETCH, 4)["responses"][0][  # type: ignore[index]
            "partitions"][0]["records"]
    stored = []
    while data:
        h = BatchHeader.parse(data)
        stored.append((h.base_offset, h.record_count))
        data = data[h.length:]
    assert stored == [(offsets[0], 1), (offsets[1], 1)]


def test_decompressions_of_client_data_share_one_limiter_per_run() -> None:
    """Every decompression of client data borrows from one limiter of two: 24
    connections each producing a batch that expands to 63 MiB took an unlimited
    gateway from 146 MB to 1.8 GB."""
    import threading

    import trio
    import trio.testing

    from ledgerd.kafka import decompressing

    seen: list[trio.CapacityLimiter] = []
    running, most = [0], [0]
    lock = threading.Lock()

    async def main() -> None:
        limiter = decompressing.limiter()
        seen.append(limiter)
        assert decompressing.limiter() is limiter
        release = threading.Event()

        def expand() -> None:  # holds its token until the test has looked
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            release.wait()
            with lock:
                running[0] -= 1

        async with trio.open_nursery() as nursery:
            for _ in range(12):
                nursery.start_soon(lambda: trio.to_thread.run_sync(
                    expand, limiter=decompressing.limiter()))
            try:
                await trio.testing.wait_all_tasks_blocked()  # each in a thread or queued
                while running[0] < limiter.borrowed_tokens:  # the threads begun
                    await trio.lowlevel.checkpoint()
                assert limiter.borrowed_tokens == running[0] == decompressing.AT_ONCE
            finally:
                release.set()

    trio.run(main)
    trio.run(main)
    assert seen[0] is not seen[1] and seen[0].total_tokens == decompressing.AT_ONCE
    assert most[0] == decompressing.AT_ONCE
