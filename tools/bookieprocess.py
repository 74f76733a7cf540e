"""Bookie processes on this machine: a TOML config each, started as ``ledgerd bookie``.

The process under the one process cluster (tools/processcluster.py), which ``ledgerd
local``, the tests and the bench scripts start bookies through; a bench that measures a
lone bookie without ZooKeeper starts one with ``start_ready``. Each bookie gets a free
loopback port, its own journal and ledger directories under ``base``, and the
cluster's ZooKeeper. Stops are by PID only: ``terminate()`` (SIGTERM, the graceful path), ``kill9()``, and
``restart()`` with the same configuration and directories.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from ledgerd.base.settings import toml_value
from ledgerd.metadata.store import MetadataStore
from ledgerd.tools.interrupts import signals_deferred
from ledgerd.tools.zkserver import find_free_port

__all__ = ["BookieProcess", "start_writable"]


class BookieProcess:
    def __init__(self, base: Path, zk_servers: str, *, port: int = 0, admin_port: int = 0,
                 settings: Mapping[str, Any] | None = None, name: str = "") -> None:
        self.base = Path(base)
        self.port = port or find_free_port()
        self.admin_port = admin_port or find_free_port()
        self.name = name or f"bookie-{self.port}"
        self.bookie_id = f"127.0.0.1:{self.port}"
        self.settings: dict[str, Any] = {
            "bookie_port": self.port,
            "listen_address": "127.0.0.1",
            "admin_port": self.admin_port,
            "zk_servers": zk_servers,
            "journal_directory": str(self.base / "journal"),
            "ledger_directories": [str(self.base / "ledgers")],
        }
        self.settings.update(settings or {})
        self.config_path = self.base / "bookie.toml"
        self.log_path = self.base / "bookie.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.write_config()

    @property
    def address(self) -> str:
        return self.bookie_id

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def write_config(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        lines = [f"{k} = {toml_value(v)}" for k, v in sorted(self.settings.items())]
        self.config_path.write_text("\n".join(lines) + "\n")

    def start(self, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        """Start ``ledgerd bookie``; ``cwd`` runs another checkout's code (benchmarks
        compare the current tree with a baseline worktree).

        The bookie inherits this process's environment except the ``LEDGERD_<KEY>``
        variables of keys its file sets: its file says which cluster, port and
        directories are its own, and a ``LEDGERD_ZK_SERVERS`` exported for the shell must
        not move it into another cluster. ``env`` is passed as given (it wins)."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        inherited = {k: v for k, v in os.environ.items()
                     if not (k.startswith("LEDGERD_") and k[8:].lower() in self.settings)}
        self._log = open(self.log_path, "ab")
        with signals_deferred():  # Ctrl-C now must not orphan the child (tools/interrupts.py)
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ledgerd.tools.cli", "bookie", "--conf",
                 str(self.config_path)],
                stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**inherited, **(env or {})}, start_new_session=True, cwd=cwd)

    def start_ready(self, env: Mapping[str, str] | None = None, cwd: Path | None = None,
                    timeout: float = 300.0) -> None:
        """Start, and wait for the bookie's READY=1 (sd_notify, to a socket of ours): it
        listens on both ports then, after replay and the start-up checkpoint. For a
        bookie without ZooKeeper (``zk_servers`` empty), where no registration shows it
        is up. RuntimeError, with its log, if it exits or is not ready in time."""
        import socket
        import tempfile
        import time

        path = tempfile.mktemp(prefix="ledgerd-notify-", dir="/tmp")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            sock.settimeout(1.0)
            try:
                self.start(env={**(env or {}), "NOTIFY_SOCKET": path}, cwd=cwd)
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        if b"READY=1" in sock.recv(4096).split(b"\n"):
                            return
                    except TimeoutError:
                        pass
                    if time.monotonic() > deadline or not self.running:
                        raise RuntimeError(f"{self.name} not ready:\n{self.log_tail()}")
            finally:
                os.unlink(path)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill9(self) -> int:
        """SIGKILL by PID; returns the exit status."""
        return self._signal(signal.SIGKILL, timeout=30)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM (drain, checkpoint, deregister); returns the exit status."""
        return self._signal(signal.SIGTERM, timeout=timeout)

    def restart(self) -> None:
        if self.running:
            self.terminate()
        self.start()

    async def exited(self) -> int:
        """Wait (in a thread, abandoned on cancel) for the process to exit; its status."""
        import trio

        assert self.process is not None
        return await trio.to_thread.run_sync(self.process.wait, abandon_on_cancel=True)

    def wait(self, timeout: float | None = None) -> int:
        assert self.process is not None
        code = self.process.wait(timeout)
        self._reap()
        return code

    def _signal(self, sig: signal.Signals, timeout: float) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} was never started")
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
        return self.wait(timeout)

    def _reap(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


async def start_writable(store: MetadataStore, bookies: list[BookieProcess], *,
                         timeout: float = 120.0, root: str = "/ledgers") -> None:
    """Start ``bookies`` and wait (on the registry's watch) until every one is
    registered writable; raises trio.TooSlowError after ``timeout`` seconds."""
    import trio

    from ledgerd.metadata.registry import BookieRegistry, BookieSet

    for b in bookies:
        b.start()
    pids = {b.bookie_id: b.pid for b in bookies}
    registry = BookieRegistry(store, root)

    async def all_up(snapshot: BookieSet) -> bool:
        return await registry.registered_by(snapshot, pids)
    with trio.fail_after(timeout):
        await registry.wait_for(all_up)
