"""A real ZooKeeper server from the Debian ``zookeeper`` package, run as a child process.

Used by the test fixtures and by ``ledgerd local``. The server binds 127.0.0.1 only,
keeps its data in a directory we own, and is stopped by the PID we started. It is
standalone (``ZooKeeperServerMain``), with the admin server off and only the ``ruok``
and ``srvr`` four-letter words enabled.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ledgerd.base.logs import fields
from ledgerd.tools.interrupts import signals_deferred

__all__ = ["ZooKeeperError", "ZooKeeperServer", "find_free_port", "ruok", "serving"]

log = logging.getLogger(__name__)

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"


class ZooKeeperError(RuntimeError):
    """The ZooKeeper server could not be found, started or reached."""


_handed_out: set[int] = set()


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago and that this process has not handed out.

    Ports come from below the kernel's ephemeral range, so the outgoing connections of
    every client on the machine (which take ephemeral ports) cannot grab one between
    this check and the server's bind; a port bound by someone else is skipped.
    """
    floor = _ephemeral_floor()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, floor) if floor > 10100 else 0
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        _handed_out.add(port)
        return port
    raise OSError(f"no free TCP port on {host} below {floor} after 200 tries")


def ruok(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if a ZooKeeper at host:port answers the ``ruok`` four-letter word."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"ruok")
            return s.recv(16) == b"imok"
    except OSError:
        return False


def serving(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if a ZooKeeper at host:port serves sessions (``srvr`` names its mode).

    ``ruok`` answers ``imok`` as soon as the server listens, about 0.2 s before it takes
    sessions; a client connecting meanwhile is dropped (kazoo logs "Connection dropped"
    and retries), so readiness is this, not ``ruok``.
    """
    out = b""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"srvr")
            while len(out) < 4096 and (chunk := s.recv(4096)):
                out += chunk
    except OSError:
        return False
    return b"\nMode: " in out


@dataclass
class ZooKeeperServer:
    """One standalone ZooKeeper child process on 127.0.0.1."""

    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    tick_time_ms: int = 200
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def _write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
        cfg.write_text(
            "\n".join(
                [
                    f"tickTime={self.tick_time_ms}",
                    f"dataDir={self.data_dir / 'data'}",
                    f"clientPort={self.port}",
                    f"clientPortAddress={self.host}",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,srvr",
                    "maxClientCnxns=0",
                    # Sessions down to 2 ticks, so tests can expire one quickly.
                    "minSessionTimeout=400",
                    "maxSessionTimeout=60000",
                    "autopurge.purgeInterval=1",
                    "",
                ]
            )
        )
        return cfg

    def start(self, ready_timeout: float = 60.0) -> None:
        """Start the server and wait until it serves sessions (``serving``).

        Raises ZooKeeperError naming what is missing (java, the Debian package) or the
        tail of the server's log if it exits or never becomes ready.
        """
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperError("java not found on PATH; run `make test` or install a JRE")
        if not ZOOKEEPER_JAR.exists():
            raise ZooKeeperError(f"{ZOOKEEPER_JAR} missing; install the Debian 'zookeeper' package")
        explicit_port = self.port != 0
        for _attempt in range(1 if explicit_port else 5):
            if not explicit_port:
                self.port = find_free_port(self.host)
            cfg = self._write_config()
            log_path = self.data_dir / "zookeeper.log"
            with open(log_path, "ab") as out, signals_deferred():
                self.process = subprocess.Popen(
                    [java, "-Xmx256m", "-XX:+UseSerialGC", "-Dzookeeper.admin.enableServer=false",
                     "-cp", f"{ZOOKEEPER_JAR}:/etc/zookeeper/conf", MAIN_CLASS, str(cfg)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            deadline = time.monotonic() + ready_timeout
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break
                if serving(self.host, self.port):
                    log.info("zookeeper_started", extra=fields(
                        pid=self.process.pid, address=self.connect_string, data=self.data_dir))
                    return
                time.sleep(0.1)
            tail = log_path.read_text(errors="replace")[-2000:]
            self.stop()
            if "Address already in use" not in tail or explicit_port:
                raise ZooKeeperError(
                    f"ZooKeeper on {self.connect_string} did not become ready; log {log_path}:\n{tail}")
        raise ZooKeeperError("could not find a free port for ZooKeeper after 5 tries")

    def stop(self, grace: float = 10.0) -> None:
        """Stop the server we started, by its PID: SIGTERM, then SIGKILL after ``grace``."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
        log.info("zookeeper_stopped", extra=fields(pid=proc.pid))
