"""The journal's completion seam: an opaque after-sync action, run by the syncer once the
group is durable, or withheld (its owner does the work) when it cannot run there."""

from __future__ import annotations

import ast
import socket
from pathlib import Path

import trio

from ledgerd import native
from ledgerd.disk.journal import Journal, JournalOptions
from ledgerd.disk.journal_format import RecordType, entry_body

DISK = Path(__file__).resolve().parents[2] / "disk"


class _Recorder(native.AfterSync):
    """An action the native syncer does not run: it must be withheld, never run."""

    def __init__(self) -> None:
        self.withheld = 0

    def withhold(self) -> None:
        self.withheld += 1


def _records(n: int) -> list[tuple[int, bytes]]:
    return [(RecordType.ENTRY, entry_body(1, n, b"x" * 100))]


async def test_the_syncer_runs_the_action_once_the_group_is_durable(tmp_path: Path) -> None:
    j = Journal(tmp_path, JournalOptions(groups_in_flight=2))
    await j.open()
    mine, peer = socket.socketpair()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(j.run)
            await j.append(_records(0))  # the file is open and zeroed ahead
            send = native.SendAfterSync(mine.fileno(), bytearray(b"durable"))
            with j.batch():
                group = j.submit(_records(1))
                assert j.after_sync(send) is group
            await group.wait()
            assert send.sent == 7 and peer.recv(100) == b"durable"
            # A group started behind another still in flight: its action is withheld.
            recorder = _Recorder()
            with j.batch():
                first = j.submit(_records(2))
            with j.batch():
                second = j.submit(_records(3))
                j.after_sync(recorder)
            assert first is not second
            await second.wait()
            assert recorder.withheld == 1
            nursery.cancel_scope.cancel()
    finally:
        await j.close()
        mine.close()
        peer.close()


def test_disk_knows_no_socket() -> None:
    """No module of ``disk/`` imports socket or sends: connections stay in the appliance."""
    for path in DISK.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {m for m in names if m.split(".")[0] in ("socket", "select")}, path
        text = path.read_text()
        assert "send_after_sync" not in text and "SendAfterSync" not in text, path
