"""`ledgerd local`: ZooKeeper + bookies come up, register, take adds, and stop on SIGINT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from ledgerd.bookie_client import BookieConnectionError, open_bookie_client
from ledgerd.metadata.registry import BookieRegistry
from ledgerd.metadata.zookeeper import ZooKeeperStore
from ledgerd.wire.messages import AddRequest
from ledgerd.wire.status import Status
from tests.appliance.harness import KEY, entry


def _stop(proc: subprocess.Popen[str]) -> None:
    """End a `ledgerd local` a failed test left running: SIGINT first, so it stops its
    bookies (they run in sessions of their own and would outlive a SIGKILL of it)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _until_running(proc: subprocess.Popen[str]) -> list[str]:
    """``ledgerd local``'s output up to its "Running" line."""
    assert proc.stdout is not None
    lines: list[str] = []
    while not lines or not lines[-1].startswith("Running"):
        line = await trio.to_thread.run_sync(proc.stdout.readline)
        assert line, "ledgerd local exited early:\n" + "".join(lines)
        lines.append(line)
    return lines


async def test_local_cluster_runs_bookies_and_stops_cleanly(zk_chroot: str, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies", "2",
                             "--data", str(tmp_path / "local"), "--zk", zk_chroot],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        lines = await _until_running(proc)
        bookie_ids = [ln.split()[1].rstrip(":") for ln in lines if ln.startswith("bookie ")]
        assert len(bookie_ids) == 2
        store = await ZooKeeperStore.connect(zk_chroot)
        try:
            listed = await BookieRegistry(store).list_bookies()
            assert set(bookie_ids) <= listed.writable
            for bid in bookie_ids:
                async with open_bookie_client(bid) as c:
                    req = AddRequest(ledger_id=1, first_entry_id=0, master_key=KEY,
                                     entries=(entry(1, 0),))
                    assert (await c.call(req))[0] == Status.OK
            # The printed example works as printed.
            start = next(i for i, ln in enumerate(lines) if ln.startswith("Try it"))
            code = "".join(ln[2:] for ln in lines[start + 1:] if ln.startswith("  "))
            ran = await trio.to_thread.run_sync(lambda: subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=120))
            assert ran.returncode == 0, ran.stderr
            assert ran.stdout.strip() == "[b'hello']"
            os.kill(proc.pid, signal.SIGINT)
            assert await trio.to_thread.run_sync(proc.wait, 120) == 0
            listed = await BookieRegistry(store).list_bookies()
            assert not set(bookie_ids) & (listed.writable | listed.read_only)
        finally:
            await store.close()
    finally:
        _stop(proc)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes (its parent has not reaped it yet).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


async def test_new_user_flow_end_to_end(tmp_path: Path) -> None:
    """What `make run` does, then a second terminal: the printed example, two shell
    commands and a short write benchmark; Ctrl-C leaves no process behind."""
    import json
    import re

    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies", "3",
                             "--data", str(tmp_path / "local")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        lines = await _until_running(proc)
        text = "".join(lines)
        zk = next(ln.split()[1] for ln in lines if ln.startswith("ZooKeeper: "))
        pids = [int(p) for p in re.findall(r"pid[ =](\d+)", text)]
        assert len(pids) == 4, text  # ZooKeeper (from its log line) and three bookies

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", *args],
                                  capture_output=True, text=True, timeout=120)

        start = next(i for i, ln in enumerate(lines) if ln.startswith("Try it"))
        code = "".join(ln[2:] for ln in lines[start + 1:] if ln.startswith("  "))
        ran = await trio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120))
        assert ran.returncode == 0 and ran.stdout.strip() == "[b'hello']", ran.stderr
        listed = await trio.to_thread.run_sync(cli, "shell", "--zk", zk, "listbookies")
        assert "3 bookie(s)" in listed.stdout, listed.stderr
        ledgers = await trio.to_thread.run_sync(cli, "shell", "--zk", zk, "listledgers")
        assert "1 ledger(s)" in ledgers.stdout, ledgers.stderr
        bench = await trio.to_thread.run_sync(cli, "bench", "writes", "--zk", zk,
                                              "--duration", "2", "--json")
        assert json.loads(bench.stdout)["appends"] > 0, bench.stderr

        os.kill(proc.pid, signal.SIGINT)
        assert await trio.to_thread.run_sync(proc.wait, 120) == 0
        assert [p for p in pids if _alive(p)] == []
    finally:
        _stop(proc)


def test_a_dead_bookie_does_not_stop_the_local_cluster(tmp_path: Path) -> None:
    from ledgerd.tools.localcluster import LocalCluster

    cluster = LocalCluster(tmp_path, bookies=2)
    try:
        cluster.start()
        cluster.bookies[0].kill9()
        assert cluster.check() == ""  # the other bookie and ZooKeeper go on
        assert [b.name for b in cluster.newly_dead()] == ["bookie0"]
        assert cluster.newly_dead() == []  # reported once
        cluster.bookies[1].kill9()
        assert "every bookie exited" in cluster.check()
    finally:
        cluster.stop()


async def test_local_ctl_kills_and_restarts_a_bookie_while_the_cluster_goes_on(
        zk_chroot: str, tmp_path: Path) -> None:
    data = tmp_path / "local"
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies", "2",
                             "--data", str(data), "--zk", zk_chroot],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "local", "ctl", *args,
                               "--data", str(data)], capture_output=True, text=True,
                              timeout=180)

    try:
        lines = await _until_running(proc)
        bookie_ids = [ln.split()[1].rstrip(":") for ln in lines if ln.startswith("bookie ")]
        status = await trio.to_thread.run_sync(ctl, "status")
        assert status.returncode == 0 and status.stdout.count("running") == 2, status.stdout
        killed = await trio.to_thread.run_sync(ctl, "kill", "1")
        assert killed.returncode == 0 and "killed with SIGKILL" in killed.stdout
        # The foreground says so, and goes on.
        assert proc.stdout is not None
        line = await trio.to_thread.run_sync(proc.stdout.readline)
        assert line.startswith(f"bookie1 {bookie_ids[1]}") and "exited with -9" in line, line
        again = await trio.to_thread.run_sync(ctl, "kill", "1")
        assert again.returncode == 1 and "bookie1 is not running" in again.stderr
        bad = await trio.to_thread.run_sync(ctl, "start", "5")
        assert bad.returncode == 1 and "a bookie index, 0 to 1" in bad.stderr
        started = await trio.to_thread.run_sync(ctl, "start", "1")
        assert started.returncode == 0 and "registered" in started.stdout, started.stderr
        pid = int(started.stdout.split("(pid ")[1].split(")")[0])
        store = await ZooKeeperStore.connect(zk_chroot)
        try:
            registry = BookieRegistry(store)
            listed = await registry.list_bookies()
            assert set(bookie_ids) <= listed.writable
            # Registered by the new process, not the killed one's registration that
            # lives on until ZooKeeper expires its session.
            assert await registry.registered_pid(bookie_ids[1]) == pid
        finally:
            await store.close()
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGINT)
        assert await trio.to_thread.run_sync(proc.wait, 120) == 0
        gone = await trio.to_thread.run_sync(ctl, "status")
        assert gone.returncode == 1 and "no `ledgerd local` is running" in gone.stderr
    finally:
        _stop(proc)


async def test_a_cluster_under_another_root_with_the_flat_layout(zk_chroot: str,
                                                                  tmp_path: Path) -> None:
    """`ledgerd local --zk-root /other --layout flat`: bookies, the printed example, the
    shell (`--zk-root`) and logs all live under that root; the default root has nothing."""
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies", "2",
                             "--data", str(tmp_path / "local"), "--zk", zk_chroot,
                             "--zk-root", "/other", "--layout", "flat"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)

    def shell(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "--zk", zk_chroot,
                               *args], capture_output=True, text=True, timeout=120)

    try:
        lines = await _until_running(proc)
        start = next(i for i, ln in enumerate(lines) if ln.startswith("Try it"))
        code = "".join(ln[2:] for ln in lines[start + 1:] if ln.startswith("  "))
        assert "zk_ledgers_root_path='/other'" in code
        ran = await trio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120))
        assert ran.returncode == 0 and ran.stdout.strip() == "[b'hello']", ran.stderr
        info = await trio.to_thread.run_sync(shell, "--zk-root", "/other", "clusterinfo",
                                             "--json")
        assert info.returncode == 0, info.stderr
        d = json.loads(info.stdout)
        assert d["layout"] == "flat" and len(d["writable"]) == 2 and d["ledgers"] == 1
        default = await trio.to_thread.run_sync(shell, "listbookies")
        assert default.returncode == 1 and "no cluster at /ledgers" in default.stderr
        bad = await trio.to_thread.run_sync(shell, "--zk-root", "other", "listbookies")
        assert bad.returncode == 2 and "a znode path such as /ledgers" in bad.stderr
        import ledgerd

        async with ledgerd.open_client(zk_chroot, zk_ledgers_root_path="/other") as client:
            writer = await client.logs.open_writer("events", 2, 2, 2)
            await writer.append(b"e0")
            await writer.close()
            assert await client.store.exists("/other/logs/events") is not None
            assert await client.store.exists("/logs/events") is None
        os.kill(proc.pid, signal.SIGINT)
        assert await trio.to_thread.run_sync(proc.wait, 120) == 0
    finally:
        _stop(proc)


async def test_local_tls_cluster(zk_chroot: str, tmp_path: Path) -> None:
    """`ledgerd local --tls`: TLS-only bookies with generated certificates; the printed
    example (which names the CA) works as printed, a plaintext connection is refused."""
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies", "2",
                             "--data", str(tmp_path / "local"), "--zk", zk_chroot, "--tls"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        lines = await _until_running(proc)
        assert any(ln.startswith("TLS: every bookie requires it; CA ") for ln in lines), lines
        assert (tmp_path / "local" / "tls" / "ca.pem").is_file()
        start = next(i for i, ln in enumerate(lines) if ln.startswith("Try it"))
        code = "".join(ln[2:] for ln in lines[start + 1:] if ln.startswith("  "))
        assert "tls_trust_path=" in code
        ran = await trio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120))
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == "[b'hello']"
        bid = next(ln.split()[1].rstrip(":") for ln in lines if ln.startswith("bookie "))
        with pytest.raises(BookieConnectionError, match="requires TLS"):
            async with open_bookie_client(bid):
                pass
        # The shell's direct bookie commands take the CA from the variable, as a client
        # does; without it, they fail (non-zero), saying so.
        ca = str(tmp_path / "local" / "tls" / "ca.pem")
        tls_env = {**os.environ, "LEDGERD_TLS_TRUST_PATH": ca}
        plain = {k: v for k, v in os.environ.items() if k != "LEDGERD_TLS_TRUST_PATH"}
        for args in (["bookieinfo"], ["bookiesanity", "--bookie", bid],
                     ["gc", "--bookie", bid]):
            ok = await trio.to_thread.run_sync(
                lambda a=args: _cli("shell", "--zk", zk_chroot, *a, env=tls_env))  # type: ignore[misc]
            assert ok.returncode == 0, (args, ok.stderr)
            refused = await trio.to_thread.run_sync(
                lambda a=args: _cli("shell", "--zk", zk_chroot, *a, env=plain))  # type: ignore[misc]
            assert refused.returncode == 1 and "requires TLS" in refused.stderr, (
                args, refused.stderr)
        # A client command without the CA: the cause, in one line, no warnings first.
        r = await trio.to_thread.run_sync(
            lambda: _cli("shell", "--zk", zk_chroot, "simpletest", "-e", "2", "-n", "5",
                         env=plain))
        assert r.returncode == 1, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("ledger ")]
        assert len(lines) == 1 and "requires TLS" in lines[0], r.stderr
        os.kill(proc.pid, signal.SIGINT)
        assert await trio.to_thread.run_sync(proc.wait, 120) == 0
    finally:
        _stop(proc)


async def test_local_cluster_with_a_kafka_gateway(zk_chroot: str, tmp_path: Path) -> None:
    """`ledgerd local --kafka PORT`: the printed kcat line works, messages round-trip,
    and Ctrl-C stops the gateway with the bookies."""
    from ledgerd.tools.zkserver import find_free_port

    port = find_free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies", "3",
                             "--data", str(tmp_path / "local"), "--zk", zk_chroot,
                             "--kafka", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        lines = await _until_running(proc)
        hint = next(ln for ln in lines if ln.startswith("Kafka gateway: "))
        listing = hint.split("(try: ")[1].rstrip(")\n").split()
        assert listing == ["kcat", "-b", f"127.0.0.1:{port}", "-L"]

        def kcat(*args: str, stdin: str = "") -> str:
            done = subprocess.run(["kcat", "-b", f"127.0.0.1:{port}", *args], input=stdin,
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            return done.stdout

        assert "brokers" in await trio.to_thread.run_sync(lambda: kcat("-L"))
        await trio.to_thread.run_sync(lambda: kcat("-P", "-t", "hello", stdin="a\nb\n"))
        out = await trio.to_thread.run_sync(
            lambda: kcat("-C", "-t", "hello", "-o", "beginning", "-e"))
        assert out.split() == ["a", "b"]
        os.kill(proc.pid, signal.SIGINT)
        assert await trio.to_thread.run_sync(proc.wait, 120) == 0
        gateway_log = (tmp_path / "local" / "gateway.log").read_text()
        assert "event=signal signal=SIGTERM" in gateway_log  # stopped, not orphaned
    finally:
        _stop(proc)


async def test_local_cluster_with_a_tls_kafka_gateway(zk_chroot: str, tmp_path: Path) -> None:
    """`ledgerd local --kafka PORT --kafka-tls`: the gateway's listener speaks TLS only
    and requires a client certificate from the local CA; the printed kcat line (which
    names the CA and the client's certificate) works as printed, without a certificate
    the connection fails, and the CA's key is there to issue more."""
    from ledgerd.tools.zkserver import find_free_port

    port = find_free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies", "2",
                             "--data", str(tmp_path / "local"), "--zk", zk_chroot,
                             "--kafka", str(port), "--kafka-tls"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        lines = await _until_running(proc)
        tls = tmp_path / "local" / "tls"
        assert any(ln.startswith("Kafka TLS: the gateway requires it (client certificates "
                                 f"required); CA {tls / 'ca.pem'}, its key {tls / 'ca.key'}")
                   for ln in lines), lines
        hint = next(ln for ln in lines if ln.startswith("Kafka gateway: "))
        listing = hint.split("(try: ")[1].rstrip(")\n").split()
        assert listing[:3] == ["kcat", "-b", f"127.0.0.1:{port}"]
        assert "security.protocol=ssl" in listing
        done = await trio.to_thread.run_sync(lambda: subprocess.run(
            listing, capture_output=True, text=True, timeout=60))
        assert done.returncode == 0, done.stderr
        assert "1 brokers" in done.stdout
        anonymous = ["kcat", "-b", f"127.0.0.1:{port}", "-X", "security.protocol=ssl", "-X",
                     f"ssl.ca.location={tls / 'ca.pem'}", "-m", "3", "-L"]
        refused = await trio.to_thread.run_sync(lambda: subprocess.run(
            anonymous, capture_output=True, text=True, timeout=60))
        assert refused.returncode != 0
        plain = await trio.to_thread.run_sync(lambda: subprocess.run(
            ["kcat", "-b", f"127.0.0.1:{port}", "-m", "3", "-L"], capture_output=True,
            text=True, timeout=60))
        assert plain.returncode != 0
        assert (tls / "ca.key").stat().st_mode & 0o077 == 0
        os.kill(proc.pid, signal.SIGINT)
        assert await trio.to_thread.run_sync(proc.wait, 120) == 0
    finally:
        _stop(proc)


def test_kafka_tls_needs_a_kafka_gateway(tmp_path: Path) -> None:
    for args, words in ((["--kafka-tls"], "give --kafka PORT"),
                        (["--kafka", "0", "--kafka-client-auth", "optional"],
                         "--kafka-client-auth needs --kafka-tls")):
        r = _cli("local", "--data", str(tmp_path / "local"), *args, env=dict(os.environ))
        assert r.returncode == 2 and words in r.stderr, r.stderr


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``, by PID."""
    out = []
    for proc_dir in Path("/proc").iterdir():
        if proc_dir.name.isdigit():
            try:
                stat = (proc_dir / "stat").read_text().rsplit(") ", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid and stat[0] != "Z":
                out.append(int(proc_dir.name))
    return out


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", *args],
                          capture_output=True, text=True, timeout=120, env=env)


async def test_a_second_local_cluster_uses_only_its_own_zookeeper(zk_chroot: str,
                                                                   tmp_path: Path) -> None:
    """With LEDGERD_ZK_SERVERS exported (naming another cluster), `ledgerd local` puts
    its bookies, cookies and everything in the ZooKeeper it started; a shell without
    --zk finds it as `ledgerd local ctl` does but writes no cluster metadata there;
    without --data its directory goes on exit, and it says so."""
    tmp = tmp_path / "tmp"  # its own temp directory: no other run's `ledgerd local` in it
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "LEDGERD_ZK_SERVERS": zk_chroot}
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies",
                             "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    try:
        lines = await _until_running(proc)
        own = next(ln.split()[1] for ln in lines if ln.startswith("ZooKeeper: "))
        assert own != zk_chroot
        bookie_ids = {ln.split()[1].rstrip(":") for ln in lines if ln.startswith("bookie ")}
        data = Path(next(ln.split()[1] for ln in lines if ln.startswith("data: ")))
        assert data.parent == tmp and "removed on exit" in "".join(lines)
        store = await ZooKeeperStore.connect(own)
        try:
            assert (await BookieRegistry(store).list_bookies()).writable == bookie_ids
            assert set(await store.children("/ledgers/cookies")) == bookie_ids
        finally:
            await store.close()
        store = await ZooKeeperStore.connect(zk_chroot)
        try:
            assert await store.exists("/ledgers") is None  # nothing in the exported one
        finally:
            await store.close()

        plain = {k: v for k, v in env.items() if k != "LEDGERD_ZK_SERVERS"}
        listed = await trio.to_thread.run_sync(lambda: _cli("shell", "listbookies", env=plain))
        assert listed.returncode == 0 and "2 bookie(s)" in listed.stdout, listed.stderr
        assert listed.stderr.startswith(f"shell: using the `ledgerd local` in {data} "
                                        f"(ZooKeeper {own})"), listed.stderr
        init = await trio.to_thread.run_sync(lambda: _cli("shell", "initnewcluster", env=plain))
        assert init.returncode == 1 and "names no cluster" in init.stderr, init.stderr
        assert f"--zk {own}" in init.stderr
        exported = await trio.to_thread.run_sync(lambda: _cli("local", "ctl", "env", env=plain))
        assert exported.stdout.strip() == f"export LEDGERD_ZK_SERVERS={own}", exported.stderr

        os.kill(proc.pid, signal.SIGINT)
        assert proc.stdout is not None
        rest = await trio.to_thread.run_sync(proc.stdout.read)
        assert await trio.to_thread.run_sync(proc.wait, 120) == 0
        assert f"removed {data}" in rest and not data.exists(), rest
    finally:
        _stop(proc)


async def test_data_is_kept_with_data_and_said(zk_chroot: str, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies",
                             "1", "--zk", zk_chroot, "--data", str(tmp_path / "keep")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        await _until_running(proc)
        os.kill(proc.pid, signal.SIGINT)
        out, _ = await trio.to_thread.run_sync(proc.communicate)
        assert proc.returncode == 0 and f"data kept in {tmp_path / 'keep'}" in out, out
        assert (tmp_path / "keep" / "bookie0" / "bookie.toml").is_file()
    finally:
        _stop(proc)


async def test_ctrl_c_during_start_up_stops_everything_at_once(tmp_path: Path) -> None:
    """SIGINT while ZooKeeper and the bookies come up: `ledgerd local` stops what it
    started and exits 130 then, not after start-up."""
    data = tmp_path / "local"
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies",
                             "3", "--data", str(data)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        with trio.fail_after(60):
            while not (data / "bookie0" / "bookie.toml").exists():
                assert proc.poll() is None, proc.communicate()
                await trio.sleep(0.02)
        started = _children(proc.pid)
        assert started  # ZooKeeper at least
        os.kill(proc.pid, signal.SIGINT)
        out, err = await trio.to_thread.run_sync(lambda: proc.communicate(timeout=60))
        assert proc.returncode == 130, (out, err)
        assert "Running" not in out and "interrupted while starting" in err, (out, err)
        assert [p for p in started if _alive(p)] == []
    finally:
        _stop(proc)


def test_a_busy_kafka_port_is_one_line_naming_it(tmp_path: Path) -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies",
                            "1", "--data", str(tmp_path / "d"), "--kafka", str(port)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"ledgerd: error: --kafka {port}: port {port} on 127.0.0.1 "
                               "is in use"), r.stderr
    assert not (tmp_path / "d").exists()  # nothing started


def test_a_new_bookie_does_not_join_the_cluster_the_environment_names(zk_chroot: str,
                                                                       tmp_path: Path) -> None:
    conf = tmp_path / "bookie.toml"
    conf.write_text(f'zk_servers = "{zk_chroot}"\nbookie_port = 3999\n'
                    f'journal_directory = "{tmp_path}/j"\n'
                    f'ledger_directories = ["{tmp_path}/l"]\n')
    env = {**os.environ, "LEDGERD_ZK_SERVERS": "127.0.0.1:1"}
    r = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "bookie", "--conf",
                        str(conf)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("ledgerd: error: bookie did not start: LEDGERD_ZK_SERVERS="
                               f"127.0.0.1:1 overrides zk_servers = '{zk_chroot}' of "), r.stderr


async def test_ctl_start_says_why_a_bookie_did_not_start(zk_chroot: str, tmp_path: Path) -> None:
    data = tmp_path / "local"
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies",
                             "2", "--data", str(data), "--zk", zk_chroot],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "local", "ctl", *args,
                               "--data", str(data)], capture_output=True, text=True,
                              timeout=180)

    try:
        await _until_running(proc)
        assert (await trio.to_thread.run_sync(ctl, "stop", "1")).returncode == 0
        conf = data / "bookie1" / "bookie.toml"
        conf.write_text(conf.read_text() + "journal_prealloc_mb = -5\n")
        r = await trio.to_thread.run_sync(ctl, "start", "1")
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("ledgerd: error: bookie1 did not start (exit 2): "
                                   "ledgerd: error: "), r.stderr
        assert "journal_prealloc_mb" in r.stderr and f"(log {conf.parent}/bookie.log)" in r.stderr
    finally:
        _stop(proc)


async def test_the_quick_start_cluster_heals_the_printed_examples_ledger(
        zk_chroot: str, tmp_path: Path) -> None:
    """`make run`'s cluster (three bookies) and its printed example: the example's ledger
    leaves a bookie outside its ensemble, so when one of its bookies is lost the others'
    autorecovery copies its entries there, as the README says."""
    import ledgerd

    data = tmp_path / "local"
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies", "3",
                             "--data", str(data), "--zk", zk_chroot],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        lines = await _until_running(proc)
        bookie_ids = [ln.split()[1].rstrip(":") for ln in lines if ln.startswith("bookie ")]
        start = next(i for i, ln in enumerate(lines) if ln.startswith("Try it"))
        code = "".join(ln[2:] for ln in lines[start + 1:] if ln.startswith("  "))
        ran = await trio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120))
        assert ran.returncode == 0 and ran.stdout.strip() == "[b'hello']", ran.stderr
        async with ledgerd.open_client(zk_chroot) as client:
            (lid,) = [x async for x in client.list_ledgers()]
            ensemble = (await client.ledger_metadata(lid)).ensembles[0][1]
            assert len(ensemble) < len(bookie_ids)  # a spare outside it
            victim = ensemble[0]
            stopped = await trio.to_thread.run_sync(lambda: subprocess.run(
                [sys.executable, "-m", "ledgerd.tools.cli", "local", "ctl", "stop",
                 str(bookie_ids.index(victim)), "--data", str(data)],
                capture_output=True, text=True, timeout=120))
            assert stopped.returncode == 0, stopped.stderr
            with trio.fail_after(60):
                async with client.ledgers.watch(lid) as changes:
                    async for _ in changes:
                        md, _ = await client.ledgers.read(lid, fresh=True)
                        if all(victim not in e for _, e in md.ensembles):
                            break
            rh = await client.open_ledger(lid, b"", recovery=False)
            assert [e.payload async for e in rh.read()] == [b"hello"]
    finally:
        _stop(proc)


async def test_a_ledger_with_no_spare_bookie_waits_and_says_why(zk_chroot: str,
                                                                tmp_path: Path) -> None:
    """E3 on three bookies, one stopped: the workers have no bookie to copy to. They say
    so as a warning (rereplication_waiting_for_a_bookie: no writable bookie outside the
    ensemble), not as a copy that failed."""
    import ledgerd

    data = tmp_path / "local"
    proc = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies", "3",
                             "--data", str(data), "--zk", zk_chroot],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        await _until_running(proc)
        async with ledgerd.open_client(zk_chroot) as client:
            async with await client.create_ledger(3, 2, 2) as lh:
                await lh.append(b"x")
        stopped = await trio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-m", "ledgerd.tools.cli", "local", "ctl", "stop", "0", "--data",
             str(data)], capture_output=True, text=True, timeout=120))
        assert stopped.returncode == 0, stopped.stderr
        logs = [data / f"bookie{i}" / "bookie.log" for i in (1, 2)]
        with trio.fail_after(60):
            while not any("event=rereplication_waiting_for_a_bookie" in p.read_text()
                          for p in logs):
                await trio.sleep(0.2)
        text = "".join(p.read_text() for p in logs)
        line = next(ln for ln in text.splitlines() if "rereplication_waiting_for_a_bookie" in ln)
        assert "level=WARNING" in line and f"ledger={lh.ledger_id}" in line, line
        assert "no writable bookie outside the ensemble to copy to" in line, line
        assert "event=rereplication_failed" not in text
    finally:
        _stop(proc)


def test_the_control_socket_works_under_a_data_directory_too_long_for_a_socket_path(
        tmp_path: Path) -> None:
    """``sockaddr_un`` holds 107 bytes: a ``--data`` directory deeper than that still
    gets its ``ctl.sock``, and ``ledgerd local ctl`` reaches it."""
    from ledgerd.tools.localcluster import CTL_SOCKET, LocalCluster, send_control

    base = tmp_path / ("d" * 60) / ("e" * 60)
    base.mkdir(parents=True)
    assert len(str(base / CTL_SOCKET)) > 107
    cluster = LocalCluster(base, bookies=0, zk="127.0.0.1:1")
    cluster.control = lambda action, index: f"{action} {index}"  # type: ignore[method-assign]
    path = cluster.serve_control()
    try:
        assert path.is_socket()
        assert send_control(base, "kill", 2, timeout=10) == "kill 2"
    finally:
        assert cluster._ctl is not None
        cluster._ctl.shutdown()
        cluster._ctl.server_close()
