"""The native helper on the real ext4 work disk: O_DIRECT, fdatasync, errors, the GIL."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from ledgerd import native


def test_aligned_buffer_is_aligned_and_zeroed() -> None:
    buf = native.alloc_aligned(3 * 4096, 4096)
    assert buf.address() % 4096 == 0
    assert len(buf) == 3 * 4096
    assert bytes(buf.view) == bytes(3 * 4096)


def test_aligned_buffer_rejects_bad_alignment() -> None:
    with pytest.raises(ValueError, match="power of two"):
        native.alloc_aligned(4096, 3000)


def test_direct_write_fdatasync_round_trip(scratch_dir: Path) -> None:
    path = scratch_dir / "direct.bin"
    block = native.logical_block_size(scratch_dir)
    assert block in (512, 1024, 2048, 4096)
    buf = native.alloc_aligned(2 * 4096)
    payload = os.urandom(2 * 4096)
    buf.view[:] = payload
    with native.open_file(path, os.O_RDWR | os.O_CREAT, direct=True) as f:
        assert f.direct
        assert f.pwrite(buf.view, 4096) == 2 * 4096
        f.fdatasync()
        back = native.alloc_aligned(2 * 4096)
        assert f.pread_into(back.view, 4096) == 2 * 4096
        assert bytes(back.view) == payload
    data = path.read_bytes()
    assert data[:4096] == bytes(4096)
    assert data[4096:] == payload


def test_pwritev_writes_parts_back_to_back(scratch_dir: Path) -> None:
    path = scratch_dir / "vec.bin"
    with native.open_file(path, os.O_RDWR | os.O_CREAT) as f:
        assert f.pwritev([b"abc", bytearray(b"defg"), memoryview(b"hi")], 10) == 9
        f.fdatasync()
        assert f.pread(9, 10) == b"abcdefghi"


def test_paced_write_writes_every_piece_with_pauses_between(scratch_dir: Path) -> None:
    path = scratch_dir / "paced.bin"
    data = bytes(range(256)) * 40  # 10,240 bytes: pieces of 4096, 4096, 2048
    pause = 0.25  # long beside three 4 KiB pwrites even when a loaded host stalls them
    with native.open_file(path, os.O_RDWR | os.O_CREAT) as f:
        t0 = time.perf_counter()
        assert f.pwrite_paced(data, 4096, 4096, pause) == len(data)
        assert time.perf_counter() - t0 >= 2 * pause  # two pauses, none after the last piece
        assert f.pread(len(data), 4096) == data
        t0 = time.perf_counter()
        assert f.pwrite_paced(data, 0, 4096, 0.0) == len(data)  # no pauses
        assert time.perf_counter() - t0 < pause  # not even one


def test_unaligned_direct_write_raises_einval_with_path(scratch_dir: Path) -> None:
    path = scratch_dir / "unaligned.bin"
    with native.open_file(path, os.O_RDWR | os.O_CREAT, direct=True) as f:
        buf = native.alloc_aligned(8192)
        with pytest.raises(OSError) as info:
            f.pwrite(buf.view[1:4097], 0)  # misaligned memory and length
        assert info.value.errno == errno.EINVAL
        assert info.value.filename == str(path)
        with pytest.raises(OSError) as info:
            f.pwrite(buf.view[:4096], 100)  # misaligned offset
        assert info.value.errno == errno.EINVAL


def test_open_missing_directory_names_path(scratch_dir: Path) -> None:
    path = scratch_dir / "no" / "such" / "file"
    with pytest.raises(OSError) as info:
        native.open_file(path, os.O_RDWR)
    assert info.value.errno == errno.ENOENT
    assert info.value.filename == str(path)


def test_fallocate_fadvise_sync_file_range(scratch_dir: Path) -> None:
    path = scratch_dir / "prealloc.bin"
    with native.open_file(path, os.O_RDWR | os.O_CREAT) as f:
        f.fallocate(0, 1 << 20)
        assert path.stat().st_size == 1 << 20
        f.fallocate(1 << 20, 1 << 20, keep_size=True)
        assert path.stat().st_size == 1 << 20
        f.pwrite(b"x" * 4096, 0)
        f.sync_file_range(0, 4096, native.SYNC_FILE_RANGE_WRITE | native.SYNC_FILE_RANGE_WAIT_AFTER)
        f.fadvise_dontneed(0, 0)
        assert f.logical_block_size() >= 512


def test_closed_file_refuses_io(scratch_dir: Path) -> None:
    f = native.open_file(scratch_dir / "c.bin", os.O_RDWR | os.O_CREAT)
    f.close()
    f.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        f.fdatasync()


def test_gil_released_during_fdatasync(scratch_dir: Path) -> None:
    """A Python thread keeps counting while another thread sits in fdatasync.

    64 MiB of dirty page cache takes the disk well over one GIL switch interval (5 ms)
    to flush; if the helper held the GIL, the counter could not move during the call.
    """
    path = scratch_dir / "gil.bin"
    chunk = os.urandom(1 << 20)
    with native.open_file(path, os.O_RDWR | os.O_CREAT) as f:
        for i in range(64):
            f.pwrite(chunk, i << 20)
        counter = 0
        stop = threading.Event()

        def spin() -> None:
            nonlocal counter
            while not stop.is_set():
                counter += 1

        t = threading.Thread(target=spin)
        t.start()
        try:
            before = counter
            f.fdatasync()
            during = counter - before
        finally:
            stop.set()
            t.join()
    assert during > 0


async def test_syncer_writes_and_syncs_off_the_gil_and_reports_errors(tmp_path: Path) -> None:
    import trio

    syncer = native.Syncer()
    path = tmp_path / "syncer.bin"
    buf = native.alloc_aligned(8192)
    buf.view[:5] = b"hello"
    with native.open_file(path, os.O_RDWR | os.O_CREAT) as f:
        syncer.submit(f, buf.view, 4096, sync=True)
        with pytest.raises(RuntimeError, match="busy"):
            syncer.submit(f, buf.view, 0, sync=True)  # one job at a time
        await trio.lowlevel.wait_readable(syncer)
        seconds = syncer.collect()
        assert seconds is not None and seconds >= 0
        assert syncer.collect() is None  # collected once
    assert path.read_bytes()[4096:4101] == b"hello"
    with native.open_file(path, os.O_RDONLY) as ro:
        syncer.submit(ro, buf.view, 0, sync=True)
        await trio.lowlevel.wait_readable(syncer)
        with pytest.raises(OSError) as err:
            syncer.collect()
        assert err.value.errno == errno.EBADF and str(path) in str(err.value)
    syncer.close()
    with pytest.raises(ValueError, match="closed"):
        syncer.fileno()


async def test_syncer_sends_replies_once_durable_and_stops_a_full_socket(tmp_path: Path) -> None:
    import socket

    import trio

    async def job(f: native.NativeFile, sends: list[native.SendAfterSync]) -> None:
        syncer.submit(f, buf.view, 0, sync=True, after_sync=sends)
        await trio.lowlevel.wait_readable(syncer)
        syncer.collect()

    syncer = native.Syncer()
    buf = native.alloc_aligned(4096)
    a, peer = socket.socketpair()
    full, stalled = socket.socketpair()
    full.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    try:
        with native.open_file(tmp_path / "s.bin", os.O_RDWR | os.O_CREAT) as f:
            first = native.SendAfterSync(a.fileno(), bytearray(b"one"))
            await job(f, [first, native.SendAfterSync(a.fileno(), bytearray(b"two"))])
            assert first.sent == 3 and peer.recv(100) == b"onetwo"
            # A socket that takes only part stops: later jobs send it nothing, in order.
            big = native.SendAfterSync(full.fileno(), bytearray(1 << 20))
            after = native.SendAfterSync(full.fileno(), bytearray(b"after"))
            other = native.SendAfterSync(a.fileno(), bytearray(b"other"))
            await job(f, [big])
            assert 0 < big.sent < 1 << 20
            await job(f, [after, other])
            assert after.sent == 0 and other.sent == 5 and peer.recv(100) == b"other"
            native.resume_sends(full.fileno())
            again = native.SendAfterSync(full.fileno(), bytearray(b"x"))
            stalled.setblocking(False)
            try:
                while stalled.recv(1 << 20):
                    pass
            except BlockingIOError:
                pass
            await job(f, [again])
            assert again.sent == 1
            # stop_sends holds a socket for replies that go another way.
            native.stop_sends(a.fileno())
            held = native.SendAfterSync(a.fileno(), bytearray(b"held"))
            await job(f, [held])
            assert held.sent == 0
            native.resume_sends(a.fileno())
        # A job that fails sends nothing.
        with native.open_file(tmp_path / "s.bin", os.O_RDONLY) as ro:
            lost = native.SendAfterSync(a.fileno(), bytearray(b"lost"))
            syncer.submit(ro, buf.view, 0, sync=True, after_sync=[lost])
            await trio.lowlevel.wait_readable(syncer)
            with pytest.raises(OSError):
                syncer.collect()
            assert lost.sent == 0
        peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            peer.recv(100)
        with pytest.raises(ValueError, match="send table"):
            native.SendAfterSync(native.SEND_MAX_FD, bytearray())
    finally:
        syncer.close()
        for s in (a, peer, full, stalled):
            s.close()
