"""Optional zstd compression of entry payloads (level 1), with a bounded output.

A ledger created with ``compression="zstd"`` records it in its metadata; the writer
compresses each payload before the digest, bookies store the bytes as given, and readers
decompress with the output capped at the maximum entry size, so a small malicious frame
cannot expand into gigabytes (a zip bomb raises DecompressionError instead).
"""

from __future__ import annotations

import zstandard

from ledgerd.wire.errors import DecompressionError

__all__ = ["compress_payload", "decompress_payload"]

_LEVEL = 1
# The frame checksum (4 bytes) makes a corrupt payload fail loudly instead of
# decompressing to garbage when the ledger uses the DUMMY digest.
_COMPRESSOR = zstandard.ZstdCompressor(level=_LEVEL, write_content_size=True, write_checksum=True)
_DECOMPRESSOR = zstandard.ZstdDecompressor()


def compress_payload(payload: bytes) -> bytes:
    """zstd level 1; the frame records the original size."""
    return _COMPRESSOR.compress(payload)


def decompress_payload(data: bytes, max_size: int) -> bytes:
    """Decompress, refusing any output larger than ``max_size`` bytes."""
    try:
        params = zstandard.get_frame_parameters(data)
    except zstandard.ZstdError as exc:
        raise DecompressionError(f"not a zstd frame: {exc}") from exc
    if params.content_size not in (zstandard.CONTENTSIZE_UNKNOWN, zstandard.CONTENTSIZE_ERROR) \
            and params.content_size > max_size:
        raise DecompressionError(
            f"payload declares {params.content_size} bytes, over the limit of {max_size}")
    try:
        with _DECOMPRESSOR.stream_reader(data) as reader:
            out = reader.read(max_size + 1)
            if len(out) > max_size:
                raise DecompressionError(f"payload decompresses past the limit of {max_size} bytes")
            # read() may return less than asked before the frame ends; keep reading.
            chunks = [out]
            total = len(out)
            while True:
                more = reader.read(max_size + 1 - total)
                if not more:
                    break
                total += len(more)
                if total > max_size:
                    raise DecompressionError(
                        f"payload decompresses past the limit of {max_size} bytes")
                chunks.append(more)
    except zstandard.ZstdError as exc:
        raise DecompressionError(f"corrupt zstd payload: {exc}") from exc
    return b"".join(chunks)
