"""A local cluster: one ZooKeeper (or a given one) and N bookie processes on loopback.

It is the one process cluster (``ProcessCluster``, tools/processcluster.py) with what
``ledgerd local`` adds for a person at a terminal: stable ports, a cluster secret,
autorecovery on, optional TLS and a Kafka gateway, and a control socket.

``ledgerd local`` runs it in the foreground; stops are by PID (SIGTERM to bookies, then
ZooKeeper). With ``--data`` the directories survive, so a restart finds its ledgers.

While it runs, ``ledgerd local ctl`` controls its bookies by index through a Unix socket
in the data directory (``ctl.sock``): ``kill N`` (SIGKILL, as a crash), ``stop N``
(SIGTERM, the graceful path), ``start N`` (the same configuration and directories, and
waits until it is registered), ``status``. The cluster goes on when a bookie dies, so a
newcomer can watch the others re-replicate its ledgers and the bookie come back.
"""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import trio

from ledgerd.base.credentials import generate_secret
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.processcluster import ClusterError, ProcessCluster
from ledgerd.tools.target import Target
from ledgerd.tools.zkserver import ZooKeeperServer, find_free_port

__all__ = ["CTL_SOCKET", "LocalCluster", "LocalClusterError", "last_line", "locate",
           "send_control"]

BASE_PORT = 3181
CTL_SOCKET = "ctl.sock"
CTL_ACTIONS = ("kill", "stop", "start", "status", "info")


LocalClusterError = ClusterError


def make_local_certificates(where: Path) -> dict[str, str]:
    """A CA (its key beside it, to issue more certificates with), a bookie certificate
    (127.0.0.1, localhost; roles bookie, recovery, admin), a Kafka gateway certificate
    (127.0.0.1, localhost) and a client certificate (role client) as PEM files under
    ``where``, made once and reused: for trying TLS locally, not for production
    (trustme's throwaway CA)."""
    files = {"ca": where / "ca.pem", "ca_key": where / "ca.key",
             "bookie_cert": where / "bookie.pem", "bookie_key": where / "bookie.key",
             "gateway_cert": where / "gateway.pem", "gateway_key": where / "gateway.key",
             "client_cert": where / "client.pem", "client_key": where / "client.key"}
    if not all(p.exists() for p in files.values()):
        try:
            import trustme
        except ImportError:
            raise LocalClusterError("ledgerd local --tls makes its certificates with trustme: "
                                    "pip install trustme (make setup installs it)") from None
        where.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA(organization_name="ledgerd local")
        ca.cert_pem.write_to_path(str(files["ca"]))
        ca.private_key_pem.write_to_path(str(files["ca_key"]))
        files["ca_key"].chmod(0o600)
        for name, ou, hosts in (("bookie", "0:bookie,recovery,admin", ("127.0.0.1", "localhost")),
                                ("gateway", "", ("127.0.0.1", "localhost")),
                                ("client", "0:client", ("client.local",))):
            cert = ca.issue_cert(*hosts, common_name=f"ledgerd-local-{name}",
                                 organization_unit_name=ou or None)
            files[f"{name}_cert"].write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
            cert.private_key_pem.write_to_path(str(files[f"{name}_key"]))
            files[f"{name}_key"].chmod(0o600)
    return {k: str(v) for k, v in files.items()}


class LocalCluster:
    """``ledgerd local``: a ``ProcessCluster`` (``processes``) and what it adds; runs in
    the foreground, so its calls block."""

    def __init__(self, base: Path, *, bookies: int = 3, zk: str | None = None,
                 register_timeout: float = 60.0, root: str = "/ledgers",
                 layout: str = "hierarchical", tls: bool = False,
                 kafka_port: int | None = None, kafka_gateways: int = 1,
                 kafka_tls: str = "") -> None:
        self.base = Path(base)
        self.processes = ProcessCluster(base, bookies=bookies, zk=zk, root=root,
                                        layout=layout, register_timeout=register_timeout)
        self.kafka_port = kafka_port  # a Kafka gateway on this port (None: none)
        # more than one: on consecutive ports, node ids 1..N, each in its own rack
        # (RACK1..RACKN, as librdkafka's test clusters name them), rack-aware reads on
        self.kafka_gateways = kafka_gateways
        # "": their listeners are plaintext; else TLS only, and this is their client
        # authentication (none, optional, required), as gateway_tls_client_auth
        self.kafka_tls = kafka_tls
        self.gateway: subprocess.Popen[bytes] | None = None  # the first gateway
        self.gateways: list[subprocess.Popen[bytes]] = []
        self.gateway_line = ""  # what the (first) gateway printed when it started
        self.tls = tls
        self.tls_files: dict[str, str] = {}
        self._dead: set[str] = set()
        self._lock = threading.Lock()
        self._ctl: socketserver.UnixStreamServer | None = None

    @property
    def zk(self) -> str:
        return self.processes.zk

    @property
    def server(self) -> ZooKeeperServer | None:
        return self.processes.server

    @property
    def bookies(self) -> list[BookieProcess]:
        return self.processes.bookies

    @property
    def root(self) -> str:
        return self.processes.root

    def start(self) -> None:
        """Bring the cluster up; bookies are registered (writable or read-only) when it
        returns."""
        processes = self.processes
        processes.start_zookeeper()
        trio.run(processes.init_metadata)
        secret = self.base / "cluster.secret"
        if not secret.exists():
            self.base.mkdir(parents=True, exist_ok=True)
            generate_secret(secret)
        # Autorecovery in every bookie, no delay: a killed bookie's ledgers are copied
        # back to full replication at once (docs/autorecovery.md).
        processes.settings.update({
            "cluster_secret_file": str(secret), "auto_recovery_daemon_enabled": True,
            "zk_ledgers_root_path": self.root, "ledger_manager_type": processes.layout,
            "lost_bookie_recovery_delay_s": 0, "open_ledger_rereplication_grace_period_ms": 10000})
        if self.tls or self.kafka_tls:
            self.tls_files = make_local_certificates(self.base / "tls")
        if self.tls:
            processes.settings.update(tls_certificate_path=self.tls_files["bookie_cert"],
                                      tls_key_path=self.tls_files["bookie_key"],
                                      tls_trust_path=self.tls_files["ca"], tls_required=True)
        for i in range(processes.count):
            processes.start_bookie(processes.add_bookie(name=f"bookie{i}", port=self._port(i)))
        trio.run(self._wait_registered)
        if self.kafka_port is not None:
            for i in range(self.kafka_gateways):
                self._start_gateway(i)

    def gateway_log(self, i: int = 0) -> Path:
        return self.base / ("gateway.log" if i == 0 else f"gateway{i + 1}.log")

    def _start_gateway(self, i: int = 0) -> None:
        """``ledgerd gateway`` number ``i`` on ``kafka_port + i``, a client of this
        cluster (with TLS, it reaches the bookies with the local client certificate).
        With ``kafka_tls`` its listener speaks TLS only, with the local gateway
        certificate, and verifies Kafka clients' certificates against the local CA."""
        assert self.kafka_port is not None
        env = {**os.environ, "LEDGERD_ZK_SERVERS": self.zk,
               "LEDGERD_ZK_LEDGERS_ROOT_PATH": self.root, "LEDGERD_THROTTLE": "0",
               "LEDGERD_GATEWAY_ADMIN_PORT": "0"}
        if self.kafka_gateways > 1:
            env.update(LEDGERD_NODE_ID=str(i + 1), LEDGERD_GATEWAY_RACK=f"RACK{i + 1}",
                       LEDGERD_GATEWAY_RACK_AWARE_READS="true")
        if self.tls:
            env.update(LEDGERD_TLS_TRUST_PATH=self.tls_files["ca"],
                       LEDGERD_TLS_CERTIFICATE_PATH=self.tls_files["client_cert"],
                       LEDGERD_TLS_KEY_PATH=self.tls_files["client_key"])
        if self.kafka_tls:
            env.update(LEDGERD_GATEWAY_TLS_CERTIFICATE_PATH=self.tls_files["gateway_cert"],
                       LEDGERD_GATEWAY_TLS_KEY_PATH=self.tls_files["gateway_key"],
                       LEDGERD_GATEWAY_TLS_TRUST_PATH=self.tls_files["ca"],
                       LEDGERD_GATEWAY_TLS_CLIENT_AUTH=self.kafka_tls)
        log_path = self.gateway_log(i)
        before = log_path.stat().st_size if log_path.exists() else 0  # an earlier run's
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ledgerd.tools.cli", "gateway", "--port",
                 str(self.kafka_port + i)], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.gateways.append(proc)
        if i == 0:
            self.gateway = proc
        deadline = time.monotonic() + self.processes.register_timeout
        while b"kafka gateway on" not in log_path.read_bytes()[before:]:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
                raise LocalClusterError("the Kafka gateway did not start: " + " | ".join(tail))
            time.sleep(0.05)
        if i == 0:
            started = log_path.read_bytes()[before:].decode(errors="replace")
            self.gateway_line = next(ln for ln in started.splitlines()
                                     if ln.startswith("kafka gateway on"))

    def _port(self, i: int) -> int:
        """A stable port per bookie when free (cookies name it), else any free one."""
        settings = self.base / f"bookie{i}" / "bookie.toml"
        if settings.exists():
            for line in settings.read_text().splitlines():
                if line.startswith("bookie_port"):
                    return int(line.split("=")[1])
        return find_free_port()

    async def _wait_registered(self, bookies: list[BookieProcess] | None = None) -> None:
        """Until ``bookies`` (default: all) are registered, writable or read-only. A
        bookie that exits first is one line: the reason it gave, and where its log is."""
        try:
            await self.processes.wait_registered(bookies, writable=False)
        except LocalClusterError:
            for b in bookies if bookies is not None else self.bookies:
                if b.process is not None and not b.running:
                    raise LocalClusterError(
                        f"{b.name} did not start (exit {b.process.returncode}): "
                        f"{last_line(b.log_tail())} (log {b.log_path})") from None
            raise

    def check(self) -> str:
        """A description of what died so that the cluster cannot go on, or "": ZooKeeper,
        or every bookie. A single dead bookie is reported by ``newly_dead`` instead (its
        ledgers are re-replicated by the others' autorecovery)."""
        if self.server is not None and self.server.process is not None \
                and self.server.process.poll() is not None:
            return f"ZooKeeper (pid {self.server.pid}) exited unexpectedly"
        if self.bookies and not any(b.running for b in self.bookies):
            b = self.bookies[0]
            return (f"every bookie exited; {b.name}: {last_line(b.log_tail())} "
                    f"(log {b.log_path})")
        return ""

    def newly_dead(self) -> list[BookieProcess]:
        """Bookies that exited since the last call."""
        out = [b for b in self.bookies if not b.running and b.name not in self._dead]
        self._dead.update(b.name for b in out)
        return out

    # -- control --------------------------------------------------------------------

    def control(self, action: str, index: int | None = None) -> str:
        """Carry out one ``ledgerd local ctl`` request; the answer is what to print.
        Raises LocalClusterError for a request that cannot be done (said to the user)."""
        with self._lock:
            if action == "info":  # what a shell needs to find this cluster
                return f"{self.zk} {self.root}"
            if action == "status":
                return "\n".join(
                    f"{i}  {b.name}  {b.bookie_id}  "
                    + (f"running  pid {b.pid}" if b.running else
                       f"exited ({b.process.returncode if b.process else 'never started'})")
                    for i, b in enumerate(self.bookies))
            if action not in CTL_ACTIONS:
                raise LocalClusterError(f"unknown action {action!r}: one of "
                                        f"{', '.join(CTL_ACTIONS)}")
            if index is None or not 0 <= index < len(self.bookies):
                raise LocalClusterError(f"{action} needs a bookie index, 0 to "
                                        f"{len(self.bookies) - 1}")
            b = self.bookies[index]
            if action == "start":
                if b.running:
                    raise LocalClusterError(f"{b.name} is already running (pid {b.pid})")
                b.start()
                self._dead.discard(b.name)
                trio.run(self._wait_registered, [b])
                return f"{b.name} {b.bookie_id} started (pid {b.pid}) and registered"
            if not b.running:
                raise LocalClusterError(f"{b.name} is not running")
            pid = b.pid
            if action == "kill":
                code = b.kill9()
                return f"{b.name} {b.bookie_id} (pid {pid}) killed with SIGKILL: exit {code}"
            code = b.terminate(timeout=60)
            return f"{b.name} {b.bookie_id} (pid {pid}) stopped: exit {code}"

    def serve_control(self) -> Path:
        """Answer ``ledgerd local ctl`` on ``<base>/ctl.sock`` from a thread of its own."""
        path = self.base / CTL_SOCKET
        path.unlink(missing_ok=True)
        cluster = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                words = self.rfile.readline(1024).decode(errors="replace").split()
                try:
                    if not words:
                        raise LocalClusterError("empty request")
                    index = int(words[1]) if len(words) > 1 else None
                    reply = "ok " + cluster.control(words[0], index)
                except (LocalClusterError, ValueError, subprocess.TimeoutExpired) as exc:
                    reply = f"error {exc}"
                self.wfile.write(reply.encode() + b"\n")

        with unix_address(path) as address:
            self._ctl = socketserver.UnixStreamServer(address, Handler)
        os.chmod(path, 0o600)
        threading.Thread(target=self._ctl.serve_forever, name="local-ctl", daemon=True).start()
        return path

    def stop(self) -> None:
        for proc in self.gateways:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.gateways:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._ctl is not None:
            self._ctl.shutdown()
            self._ctl.server_close()
            (self.base / CTL_SOCKET).unlink(missing_ok=True)
        self.processes.stop()


def locate(flag: str | None) -> Target:
    """The cluster a command acts on (tools/target.py): ``flag`` (its --zk), else
    $LEDGERD_ZK_SERVERS, else the one ``ledgerd local`` running under the temp directory
    (asked for its ZooKeeper on its control socket), else the default. Several running
    and none named: ValueError saying which to name."""
    from ledgerd.tools.target import find_local_clusters, resolve

    env = os.environ.get("LEDGERD_ZK_SERVERS") or None
    local: list[tuple[Path, str, str]] = []
    if not flag and not env:
        for data in find_local_clusters():
            try:
                zk, _, root = send_control(data, "info", timeout=5).partition(" ")
            except LocalClusterError:  # stopped meanwhile, or an older `ledgerd local`
                continue
            local.append((data, zk, root or "/ledgers"))
    return resolve(flag=flag, env=env, local=local)


def last_line(log_tail: str) -> str:
    """The reason a process gave last: the last non-empty line of its log (a bookie that
    cannot start ends with one line saying why)."""
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip()]
    return lines[-1] if lines else "(its log is empty)"


@contextlib.contextmanager
def unix_address(path: Path) -> Iterator[str]:
    """An address for binding or connecting a Unix socket at ``path``, which may be
    longer than the 107 bytes ``sockaddr_un`` holds (a ``--data`` or temp directory deep
    down): then the path through an open descriptor of its directory
    (``/proc/self/fd/N/name``), valid while the block runs."""
    if len(os.fsencode(path)) < 100:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def send_control(base: Path, action: str, index: int | None = None,
                 timeout: float = 180.0) -> str:
    """Send one request to the ``ledgerd local`` running on ``base``; its answer.
    Raises LocalClusterError when none runs there or it refused the request."""
    path = Path(base) / CTL_SOCKET
    line = action if index is None else f"{action} {index}"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            with unix_address(path) as address:
                sock.connect(address)
            sock.sendall(line.encode() + b"\n")
            reply = sock.makefile("rb").read().decode().rstrip("\n")
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise LocalClusterError(f"no `ledgerd local` is running on {base} ({exc.strerror})"
                                ) from None
    except TimeoutError:
        raise LocalClusterError(f"`ledgerd local` on {base} did not answer in "
                                f"{timeout:.0f}s") from None
    status, _, text = reply.partition(" ")
    if status != "ok":
        raise LocalClusterError(text or "no answer")
    return text
