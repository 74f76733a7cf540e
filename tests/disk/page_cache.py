"""Evicting files from the OS page cache, and knowing that it worked; or making the
kernel's answer certain.

``posix_fadvise(DONTNEED)`` is advice: a page the kernel cannot drop at that moment
(still referenced, locked, on another CPU's LRU batch on a busy host) stays cached, and
a test that assumed it cold then sees it read without waiting. ``evict`` repeats the
advice until ``mincore`` reports none of the files' pages resident. ``mincore`` looks
without reading, unlike a RWF_NOWAIT probe, which starts the read it declines.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
from pathlib import Path

import pytest

from ledgerd.disk import index

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
_libc.mincore.restype = ctypes.c_int
EVICT_ATTEMPTS = 200


def resident_pages(path: Path) -> int:
    """How many of the file's pages the OS page cache holds now."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    npages = -(-size // mmap.PAGESIZE)
    # A private mapping is writable to ctypes; nothing is written, nothing faulted in.
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        addr = ctypes.c_char.from_buffer(m)  # the mapping's first byte
        base = ctypes.addressof(addr)
        del addr  # no export left behind: the mapping can close
        vec = ctypes.create_string_buffer(npages)
        if _libc.mincore(ctypes.c_void_p(base), size, vec) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mincore: {os.strerror(err)}", str(path))
        return sum(b & 1 for b in vec.raw)


def evict(*paths: Path) -> None:
    """Write these files back and drop them from the OS page cache; fails naming the
    files the kernel still holds after ``EVICT_ATTEMPTS`` tries."""
    left = list(paths)
    for _ in range(EVICT_ATTEMPTS):
        for path in left:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)  # DONTNEED leaves dirty pages
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        left = [p for p in left if resident_pages(p)]
        if not left:
            return
    raise AssertionError(f"the OS page cache kept {len(left)} file(s): {left[:5]}")


def kernel_would_block(monkeypatch: pytest.MonkeyPatch, *paths: Path) -> None:
    """A RWF_NOWAIT read of these files answers EAGAIN, as the kernel does for a page it
    does not hold. Clean-clone CI runs twice saw evicted index pages back in the page
    cache before the test looked (none of 40 reported missing once; a file evicted a
    few milliseconds earlier another time), which no local run reproduced: a test whose
    point is what happens next makes the answer certain with this."""
    inodes = {os.stat(p).st_ino for p in paths}
    real = os.preadv

    def preadv(fd: int, buffers: list[bytearray], offset: int, flags: int = 0) -> int:
        if flags & index._NOWAIT and os.fstat(fd).st_ino in inodes:
            raise OSError(errno.EAGAIN, "would block")
        return real(fd, buffers, offset, flags)

    monkeypatch.setattr(os, "preadv", preadv)
