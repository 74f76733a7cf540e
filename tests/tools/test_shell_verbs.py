"""What the shell's destructive verbs say before they act, and how entries are shown:
on a real cluster, each command run as a user runs it (a process; a terminal where the
test needs one)."""

from __future__ import annotations

import base64
import json
import os
import pty
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import trio

import ledgerd
from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import start_bookies
from tests.tools.test_shell import _ok, _one_line_error, _run

Factory = Callable[..., BookieProcess]
PAYLOAD = b"red \x1b[31mX\x00\xff\nend"


def _on_a_terminal(*args: str, answer: bytes) -> tuple[int, str]:
    """Run a shell command with a terminal for stdin and stderr; type ``answer``."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "shell", *args],
                                stdin=follower, stdout=subprocess.PIPE, stderr=follower)
        os.close(follower)
        os.write(leader, answer)
        seen = b""
        while True:  # until the terminal closes with the process (EIO)
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        proc.wait(60)
        assert proc.stdout is not None
        return proc.returncode, seen.decode(errors="replace") + proc.stdout.read().decode()
    finally:
        os.close(leader)


async def test_destructive_verbs_say_what_they_destroy_before_they_act(
        bookie_factory: Factory, zk_chroot: str, tmp_path: Path) -> None:
    bookies = await start_bookies(bookie_factory, zk_chroot, 2)
    zk = zk_chroot
    async with ledgerd.open_client(zk) as client:
        async with await client.create_ledger(2, 2, 2) as lh:
            await lh.append_many([b"a", b"bb", b"ccc"])
        async with await client.logs.open_writer("orders", 2, 2, 2, roll_entries=2) as w:
            await w.append_many(b"o%d" % i for i in range(5))
        ledgers = len([x async for x in client.list_ledgers()])
    iid = _ok(await _run("whatisinstanceid", zk=zk)).strip()
    facts = (f"cluster instance {iid} at /ledgers on {zk}: {ledgers} ledger(s), 1 log(s), "
             "2 bookie cookie(s)")

    # No terminal, no --force: one line saying what it would destroy.
    r = await _run("metaformat", "--allow-live-bookies", zk=zk)
    _one_line_error(r, f"metaformat deletes all metadata of {facts}", "pass --force")
    r = await _run("deleteledger", str(lh.ledger_id), zk=zk)
    _one_line_error(r, f"deleteledger deletes ledger {lh.ledger_id} of cluster instance {iid}: "
                       "CLOSED, 3 entries, 6 bytes", "pass --force")
    r = await _run("truncatelog", "orders", "--before", "4", zk=zk)
    _one_line_error(r, "truncatelog drops log 'orders'", "2 whole ledger(s), 4 entries")
    b = bookies[0]
    b.terminate()
    r = await _run("bookieformat", "--conf", str(b.config_path), zk=zk)
    _one_line_error(r, f"bookieformat deletes bookie {b.bookie_id}'s data: ",
                    f"and its cookie in the cluster on {zk}", "pass --force")

    # On a terminal it asks; "n" leaves everything as it was.
    code, seen = await trio.to_thread.run_sync(lambda: _on_a_terminal(
        "--zk", zk, "deleteledger", str(lh.ledger_id), answer=b"n\n"))
    assert code == 1 and f"deletes ledger {lh.ledger_id} of cluster instance {iid}" in seen
    assert "Go on? [y/N]" in seen and "nothing done" in seen, seen
    async with ledgerd.open_client(zk) as client:
        assert (await client.ledger_metadata(lh.ledger_id)).last_entry_id == 2
    code, seen = await trio.to_thread.run_sync(lambda: _on_a_terminal(
        "--zk", zk, "deleteledger", str(lh.ledger_id), answer=b"y\n"))
    assert code == 0 and f"deleted ledger {lh.ledger_id}" in seen, seen

    # With --force it says it in its output, then does it.
    out = _ok(await _run("metaformat", "--allow-live-bookies", "--force", zk=zk))
    lines = out.splitlines()
    assert lines[0] == (f"metaformat deletes all metadata of cluster instance {iid} at "
                        f"/ledgers on {zk}: {ledgers - 1} ledger(s), 1 log(s), "
                        "2 bookie cookie(s) (--force)"), out
    assert lines[1].startswith("formatted; new instance id ")


async def test_entries_are_shown_escaped_hex_or_base64_and_json_is_lossless(
        bookie_factory: Factory, zk_chroot: str) -> None:
    await start_bookies(bookie_factory, zk_chroot, 2)
    zk = zk_chroot
    async with ledgerd.open_client(zk) as client:
        async with await client.create_ledger(2, 2, 2) as lh:
            await lh.append(PAYLOAD)
        async with await client.logs.open_writer("events", 2, 2, 2) as w:
            await w.append(PAYLOAD)
    lid = str(lh.ledger_id)
    for verb in (("readledger", lid), ("readlogentries", "events")):
        text = _ok(await _run(*verb, zk=zk))
        assert "\x1b" not in text and "\x00" not in text
        assert "red \\x1b[31mX\\x00\\xff\\nend" in text, text
        assert PAYLOAD.hex() in _ok(await _run(*verb, "--hex", zk=zk))
        assert base64.b64encode(PAYLOAD).decode() in _ok(await _run(*verb, "--base64", zk=zk))
        out = _ok(await _run(*verb, "--json", zk=zk))
        row = json.loads(out)[0] if verb[0] == "readledger" else json.loads(out.splitlines()[0])
        assert base64.b64decode(row["payload_base64"]) == PAYLOAD
