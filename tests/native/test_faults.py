"""Faults injected under the native helper hit only the files and operations a rule names,
for exactly the matches it names; a short write is completed by the helper's loop."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerd import native
from ledgerd.native import faults
from ledgerd.native.faults import FaultRule


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    faults.disarm()
    yield
    faults.disarm()


def _open(path: Path, target: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    native.tag_fd(fd, target)
    return fd


def test_a_write_rule_fails_the_matching_write_only(tmp_path: Path) -> None:
    journal = _open(tmp_path / "j", "journal")
    log = _open(tmp_path / "l", "entrylog")
    try:
        faults.arm([FaultRule("write", "entrylog", "EIO", skip=1, times=1)])
        before = faults.injected()
        native.pwrite_fd(log, b"a" * 10, 0, "l")          # skipped
        native.pwrite_fd(journal, b"j" * 10, 0, "j")      # another target
        with pytest.raises(OSError) as raised:
            native.pwrite_fd(log, b"b" * 10, 10, "l")
        assert raised.value.errno == errno.EIO and raised.value.filename == "l"
        native.pwrite_fd(log, b"c" * 10, 10, "l")         # used up
        assert faults.injected() == before + 1
        assert (tmp_path / "l").read_bytes() == b"a" * 10 + b"c" * 10
    finally:
        os.close(journal)
        os.close(log)


def test_a_paced_write_stops_at_the_failing_piece(tmp_path: Path) -> None:
    with native.open_file(tmp_path / "j", os.O_RDWR | os.O_CREAT) as f:
        native.tag_fd(f.fd, "journal")
        faults.arm([FaultRule("write", "journal", "ENOSPC", skip=1, times=1)])
        with pytest.raises(OSError) as raised:
            f.pwrite_paced(b"z" * 300, 0, 100, 0.0)
        assert raised.value.errno == errno.ENOSPC
        assert raised.value.filename == str(tmp_path / "j")
        assert (tmp_path / "j").read_bytes() == b"z" * 100  # the first piece, no more


def test_a_short_write_is_completed_and_fsync_fails(tmp_path: Path) -> None:
    with native.open_file(tmp_path / "j", os.O_RDWR | os.O_CREAT) as f:
        native.tag_fd(f.fd, "journal")
        faults.arm([FaultRule("write", "journal", None, short=True, times=3),
                    FaultRule("fsync", "journal", "EIO")])
        data = os.urandom(3 * 8192 + 100)
        before = faults.injected()
        assert f.pwrite(data, 0) == len(data)
        assert faults.injected() - before >= 2     # several short writes, then the rest
        assert f.pread(len(data), 0) == data
        with pytest.raises(OSError) as raised:
            f.fdatasync()
        assert raised.value.errno == errno.EIO
        f.fdatasync()


def test_closing_clears_the_tag_and_bad_rules_are_refused(tmp_path: Path) -> None:
    f = native.open_file(tmp_path / "j", os.O_RDWR | os.O_CREAT)
    native.tag_fd(f.fd, "journal")
    fd = f.fd
    f.close()
    again = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)
    try:
        assert again == fd  # the lowest free descriptor, reused
        faults.arm([FaultRule("fsync", "journal", "EIO")])
        native.fdatasync_fd(again, "other")  # not a journal any more
    finally:
        os.close(again)
    with pytest.raises(ValueError, match="errno name"):
        FaultRule("write", "journal", "ENOTANERRNO")
    with pytest.raises(ValueError, match="only a write"):
        FaultRule("fsync", "journal", None, short=True)
    with pytest.raises(ValueError, match="target"):
        FaultRule("write", "index")  # type: ignore[arg-type]
