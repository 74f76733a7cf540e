"""Run librdkafka's test suite against a real ``ledgerd local --kafka`` cluster.

``python -m tests.conformance.runner [--mode quick|full] [--tests 0001,0081] [--jobs N]``
(``make conformance`` builds librdkafka's test-runner first, then runs this):

1. start ``ledgerd local --bookies 3 --kafka PORT`` (ZooKeeper, three bookies and a
   gateway) with its data under ``build/conformance/<mode>/cluster``, and wait for its
   "Running" line; the gateway's address is read from its "Kafka gateway:" line;
2. write ``build/conformance/<mode>/test.conf`` with that ``bootstrap.servers`` (the
   test-runner is pointed at it by ``RDKAFKA_TEST_CONF``);
3. run ``test-runner`` once per test number (``TESTS=0001``; a test that outlives its
   own time limit makes the test-runner kill its whole process, so one process per
   number keeps one hung test from taking the others' results with it), ``--jobs`` at
   a time, each bounded by the harness's own limit, with the mode's flags: ``-Q``
   (quick) or none (full), always ``-L`` (no tests that need no broker: they test
   librdkafka against itself); socket emulation stays on (the tests that cut, delay or
   refuse the client's connections with librdkafka's sockem run too);
4. compare every test's result with ``tests/conformance/librdkafka.toml`` and print
   what does not match; stop the cluster (SIGINT, as a person at its terminal would).

The tests listed with ``listener = "ssl"`` (0097_ssl_verify) run against a second
cluster, ``ledgerd local --bookies 3 --kafka PORT --kafka-tls`` under
``build/conformance/<mode>/cluster-ssl``, whose gateway listens with TLS only and
requires client certificates; the harness makes the client's certificate and keys from
that cluster's CA in every form trivup (librdkafka's cluster tool) makes them
(``sslfiles.py``, under ``.../ssl``), writes ``.../test-ssl.conf`` (``security.protocol=ssl``
and the ``ssl.*`` keys) and gives those tests trivup's SSL_* variables. The second
cluster starts only when such a test is to run. The tests listed with ``listener =
"sasl"`` (0135, 0142) run against a third, under ``.../cluster-sasl``, whose gateway
requires SASL PLAIN from one user with the admin role (a principals file the harness
writes, with a fresh password) and authenticating again every 10 s
(``gateway_connections_max_reauth_ms``, KIP-368); ``.../test-sasl.conf`` names that user
and password (``security.protocol=SASL_PLAINTEXT``, ``sasl.mechanism=PLAIN``).

The tests listed with ``kafka_tools = true`` run with ``KAFKA_PATH`` pointing at
``build/conformance/<mode>/kafka``, whose ``bin/kafka-topics.sh``, ``kafka-acls.sh`` and
``kafka-configs.sh`` run ``ledgerd kafka-topics`` / ``kafka-acls`` / ``kafka-configs``
(Kafka's options, the Kafka protocol, ``tools/kafka_tools.py``) with this checkout's
Python, and ``BROKERS`` set to the gateway's address (what ``kafka-topics.sh
--bootstrap-server`` is given).

The exit status is 0 when every test did what the list says (a listed failure that
passes is reported, not an error), 1 otherwise, 2 when the harness itself could not
run (the cluster did not start, the test-runner is missing, the gateway died).

Each test-runner's output is kept in ``build/conformance/<mode>/logs/NNNN.log`` and the
gateway's in ``.../cluster/gateway.log``; ``results.json`` holds every outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conformance.expectations import Listener, Mode, Suite, load_suite
from tests.conformance.outcomes import Outcome, Result, has_summary, parse_output
from tests.conformance.sslfiles import TEST_CONF as SSL_TEST_CONF
from tests.conformance.sslfiles import make_ssl_files
from tests.conformance.verdict import Finding, Verdict, judge

ROOT = Path(__file__).resolve().parents[2]
EXPECTATIONS = ROOT / "tests" / "conformance" / "librdkafka.toml"
BUILD = ROOT / "build"

MODE_ARGS = {Mode.QUICK: ["-Q", "-L"], Mode.FULL: ["-L"]}
# The harness's own limit on one test-runner process (the tests' own limits are
# shorter; this only catches a runner that hangs past them).
PROCESS_LIMIT_S = {Mode.QUICK: 600.0, Mode.FULL: 1800.0}
# The whole run's limit: numbers not started by then are not run, and the run fails.
RUN_LIMIT_S = {Mode.QUICK: 30 * 60.0, Mode.FULL: 150 * 60.0}
CLUSTER_START_S = 240.0
CLUSTER_STOP_S = 120.0
# The gateway as librdkafka's own test clusters configure Kafka (its tests/scenarios/
# default.json: four partitions per auto-created topic). The first rebalance of a new
# group keeps Kafka's default delay (3 s, the gateway's too): without it, of two
# consumers started together the first gets every partition and a second rebalance
# follows, which 0118_commit_rebalance does not expect.
GATEWAY_ENV = {
    "LEDGERD_DEFAULT_PARTITIONS": "4",
}
TEST_CONF = """\
# Written by tests/conformance/runner.py for one run against `ledgerd local --kafka`.
bootstrap.servers={bootstrap}
broker.address.family=v4
test.timeout.multiplier=2
test.topic.random=true
"""


class HarnessError(RuntimeError):
    """The harness itself cannot go on (not a test result)."""


def librdkafka_version(tree: Path) -> str:
    """The release of the librdkafka source tree at ``tree``, from src/rdkafka.h."""
    header = tree / "src" / "rdkafka.h"
    try:
        text = header.read_text(errors="replace")
    except OSError as exc:
        raise HarnessError(f"{header}: {exc.strerror}; is {tree} a librdkafka tree?") from None
    match = re.search(r"#define RD_KAFKA_VERSION\s+0x([0-9a-fA-F]{8})", text)
    if not match:
        raise HarnessError(f"{header}: no RD_KAFKA_VERSION line")
    v = int(match[1], 16)
    return f"{v >> 24 & 0xFF}.{v >> 16 & 0xFF}.{v >> 8 & 0xFF}"


def numbers_of(tests_dir: Path) -> list[str]:
    """The test numbers the test-runner is built from (its Makefile compiles
    ``[08]*-*.c`` and ``.cpp``; the 8000s are manual tests, never run by default)."""
    numbers = {p.name[:4] for p in tests_dir.iterdir()
               if re.match(r"^0\d{3}-.*\.(c|cpp)$", p.name)}
    return sorted(numbers)


# -- the cluster -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Gateway:
    host: str
    port: int
    log: Path

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def is_accepting(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=5):
                return True
        except OSError:
            return False


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive free loopback ports."""
    from ledgerd.tools.zkserver import find_free_port

    for _ in range(100):
        first = find_free_port()
        if first + n <= 65536 and all(_port_free(first + i) for i in range(1, n)):
            return first
    raise HarnessError(f"no {n} consecutive free ports on 127.0.0.1")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where a test-runner process goes: a gateway, its test.conf and what it adds to
    the process's environment (the SSL_* variables for the SSL listener)."""

    gateway: Gateway
    data: Path  # the cluster's data directory (`ledgerd local --data`)
    conf: Path
    env: dict[str, str]


@contextmanager
def local_cluster(data: Path, out: Path, gateways: int = 1, *,
                  kafka_tls: bool = False, env: dict[str, str] | None = None,
                  ) -> Iterator[Gateway]:
    """``ledgerd local --bookies 3 --kafka PORT --kafka-gateways N --data data`` until
    the block ends; its output goes to ``out``. Raises HarnessError when it does not
    start in time. With ``kafka_tls`` the gateways listen with TLS, requiring client
    certificates (``--kafka-tls``; the CA is ``data/tls/ca.pem``, with its key beside it).

    On exit it is stopped with SIGINT (it stops the gateway, bookies and ZooKeeper it
    started) and waited for; if it does not stop in time, it is killed.
    """
    port = _free_ports(gateways)
    cmd = [sys.executable, "-m", "ledgerd.tools.cli", "local", "--bookies", "3",
           "--data", str(data), "--kafka", str(port), "--kafka-gateways", str(gateways),
           *(["--kafka-tls"] if kafka_tls else [])]
    lines: queue.Queue[str | None] = queue.Queue()
    with open(out, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                                env={**os.environ, **GATEWAY_ENV, **(env or {})}, cwd=ROOT)

        def copy() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                lines.put(line)
            lines.put(None)

        threading.Thread(target=copy, name="ledgerd-local-output", daemon=True).start()
        try:
            gateway = _wait_running(proc, lines, data, out)
            if gateways > 1:
                _wait_brokers(gateway, gateways, out)
            yield gateway
        finally:
            _stop(proc)


def _wait_running(proc: subprocess.Popen[str], lines: queue.Queue[str | None], data: Path,
                  out: Path) -> Gateway:
    """The gateway of ``ledgerd local`` once it printed "Running"."""
    deadline = time.monotonic() + CLUSTER_START_S
    address = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HarnessError(f"`ledgerd local` did not start in {CLUSTER_START_S:.0f}s; "
                               f"its output: {out}")
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            continue
        if line is None:
            tail = out.read_text(errors="replace")[-2000:]
            raise HarnessError(f"`ledgerd local` exited ({proc.wait()}) before running:\n{tail}")
        found = re.match(r"Kafka gateway: ([\d.]+):(\d+),", line)
        if found:
            address = (found[1], int(found[2]))
        if line.startswith("Running"):
            break
    if address is None:
        raise HarnessError(f"`ledgerd local` printed no 'Kafka gateway:' line; see {out}")
    return Gateway(host=address[0], port=address[1], log=data / "gateway.log")


def _wait_brokers(gateway: Gateway, count: int, out: Path) -> None:
    """Until the gateway's Metadata lists ``count`` brokers: each gateway registers
    once it is up, and a test that reads the broker list first (0081 sizes its replica
    sets by it) must see them all."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"{gateway.host}:{gateway.port}"})
    deadline = time.monotonic() + CLUSTER_START_S
    while len(admin.list_topics(timeout=10).brokers) < count:
        if time.monotonic() > deadline:
            raise HarnessError(f"the gateways did not all register in {CLUSTER_START_S:.0f}s;"
                               f" see {out}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(CLUSTER_STOP_S)
    except subprocess.TimeoutExpired:
        print(f"`ledgerd local` (pid {proc.pid}) did not stop in {CLUSTER_STOP_S:.0f}s "
              "after SIGINT; killing it (its bookies may be left running)", file=sys.stderr)
        proc.kill()
        proc.wait()


def bookie_status(data: Path) -> str:
    """``ledgerd local ctl status`` of the cluster on ``data``: a line per bookie."""
    from ledgerd.tools.localcluster import LocalClusterError, send_control

    try:
        return send_control(data, "status", timeout=30)
    except LocalClusterError as exc:
        return f"exited? `ledgerd local ctl status` failed: {exc}"


# -- the test-runner -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NumberRun:
    number: str
    outcomes: dict[str, Outcome]
    returncode: int
    seconds: float
    died: str = ""  # why the process ended before its summary, if it did
    log: Path


def _ssl_target(work: Path, clusters: ExitStack) -> Target:
    """The second cluster, its gateway listening with TLS (client certificates
    required), and the client's files, test.conf and SSL_* variables for it."""
    data = work / "cluster-ssl"
    # TLS 1.2, as a broker with ssl.enabled.protocols=TLSv1.2: 0097 expects a refused
    # client certificate's alert inside the client's handshake, which TLS 1.3 cannot
    # give (its client has finished the handshake before the server checks the
    # certificate; the alert then fails the first request, ERR__TRANSPORT)
    gateway = clusters.enter_context(local_cluster(
        data, work / "ledgerd-local-ssl.out", kafka_tls=True,
        env={"LEDGERD_TLS_ENABLED_PROTOCOLS": "TLSv1.2"}))
    env, files = make_ssl_files(work / "ssl", data / "tls" / "ca.pem", data / "tls" / "ca.key")
    conf = work / "test-ssl.conf"
    conf.write_text(SSL_TEST_CONF.format(bootstrap=gateway.bootstrap, **files))
    return Target(gateway=gateway, data=data, conf=conf, env=env)


SASL_USER = "rdkafka"
SASL_REAUTH_MS = 10_000
SASL_TEST_CONF = TEST_CONF + """\
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.username={user}
sasl.password={password}
"""


def _sasl_target(work: Path, clusters: ExitStack) -> Target:
    """A cluster whose gateway requires SASL PLAIN: its principals file names one
    user with the admin role (the tests make topics and change configs), whose name
    and password go into the test.conf (as trivup's SASL cluster has one user)."""
    import hashlib
    import secrets

    data = work / "cluster-sasl"
    data.mkdir(parents=True, exist_ok=True)
    password = secrets.token_hex(16)
    principals = work / "sasl-principals.toml"
    principals.write_text(f"[principals.{SASL_USER}]\n"
                          f'token_sha256 = "{hashlib.sha256(password.encode()).hexdigest()}"\n'
                          'roles = ["admin"]\n')
    gateway = clusters.enter_context(local_cluster(
        data, work / "ledgerd-local-sasl.out",
        env={"LEDGERD_GATEWAY_PRINCIPALS_FILE": str(principals),
             # KIP-368, as 0142 needs: every connection authenticates again in 10 s
             "LEDGERD_GATEWAY_CONNECTIONS_MAX_REAUTH_MS": str(SASL_REAUTH_MS)}))
    conf = work / "test-sasl.conf"
    conf.write_text(SASL_TEST_CONF.format(bootstrap=gateway.bootstrap, user=SASL_USER,
                                          password=password))
    return Target(gateway=gateway, data=data, conf=conf, env={})


KAFKA_TOOLS = ("kafka-topics", "kafka-acls", "kafka-configs")


def make_kafka_path(where: Path) -> Path:
    """A KAFKA_PATH whose bin/ has Kafka's three admin scripts, each running the ledgerd
    command of the same name with this Python (so with this checkout's ledgerd)."""
    bin_dir = where / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in KAFKA_TOOLS:
        script = bin_dir / f"{tool}.sh"
        script.write_text(
            "#!/bin/sh\n"
            f"# {tool}.sh for librdkafka's tests: ledgerd's own {tool} (tools/kafka_tools.py)\n"
            f"exec {shlex.quote(sys.executable)} -c 'import sys; "
            f"from ledgerd.tools.cli import main; main([\"{tool}\", *sys.argv[1:]])' "
            '"$@"\n')
        script.chmod(0o755)
    return where


def run_number(number: str, tree: Path, mode: Mode, suite: Suite, logs: Path,
               target: Target, kafka_path: Path | None = None) -> NumberRun:
    """One test-runner process for the tests numbered ``number``, against ``target``;
    its output goes to ``logs/NNNN.log``. Killed (its whole process group) past
    PROCESS_LIMIT_S."""
    tests_dir = tree / "tests"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SSL_")},
           **target.env,
           "TESTS": number,
           # librdkafka's CI setting: longer client timeouts, at most 3 tests at once
           "CI": "true",
           "TEST_KAFKA_VERSION": suite.version_of(number),
           # the run's own copy (beside its logs), so that runs from several
           # checkouts sharing one librdkafka build do not point at each other's gateway
           "RDKAFKA_TEST_CONF": str(target.conf),
           # the libraries just built, not a system librdkafka (kcat's)
           "LD_LIBRARY_PATH": f"{tree / 'src'}:{tree / 'src-cpp'}"}
    env.pop("TESTS_SKIP", None)
    env.pop("SUBTESTS", None)
    env.pop("KAFKA_PATH", None)
    if kafka_path is not None and number in suite.numbers_with_kafka_tools():
        env["KAFKA_PATH"] = str(kafka_path)
        env["BROKERS"] = target.gateway.bootstrap
    log = logs / f"{number}.log"
    started = time.monotonic()
    died = ""
    with open(log, "w") as out:
        # stdout line-buffered: the runner aborts without flushing it (outcomes.py)
        proc = subprocess.Popen(["stdbuf", "-oL", "./test-runner", *MODE_ARGS[mode]],
                                cwd=tests_dir, env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            code = proc.wait(PROCESS_LIMIT_S[mode])
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
            died = f"killed by the harness after {PROCESS_LIMIT_S[mode]:.0f}s"
    text = log.read_text(errors="replace")
    if not died and not has_summary(text):
        died = (f"the test-runner died of {signal.Signals(-code).name} before its summary"
                if code < 0 else f"the test-runner exited {code} without a summary")
    outcomes = parse_output(text)
    mine = {name: o for name, o in outcomes.items() if name[:4] == number}
    return NumberRun(number=number, outcomes=mine, returncode=code,
                     seconds=time.monotonic() - started, died=died, log=log)


def run_all(numbers: dict[str, Target], tree: Path, mode: Mode, suite: Suite, work: Path,
            jobs: int) -> tuple[list[NumberRun], list[str]]:
    """Every number against its target, ``jobs`` at a time; returns the runs and the
    numbers not started (the run's time limit passed, or a gateway stopped accepting
    connections)."""
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + RUN_LIMIT_S[mode]
    runs: list[NumberRun] = []
    not_started: list[str] = []
    stop = threading.Event()
    kafka_path = make_kafka_path(work / "kafka")

    def one(number: str) -> NumberRun | None:
        if stop.is_set() or time.monotonic() > deadline:
            return None
        gateway = numbers[number].gateway
        if not gateway.is_accepting():
            print(f"the gateway at {gateway.bootstrap} accepts no connections; stopping "
                  f"(its log: {gateway.log})", file=sys.stderr)
            stop.set()
            return None
        return run_number(number, tree, mode, suite, logs, numbers[number], kafka_path)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(one, n): n for n in sorted(numbers)}
        for future in as_completed(futures):
            run = future.result()
            if run is None:
                not_started.append(futures[future])
                continue
            runs.append(run)
            _print_number(run)
    return sorted(runs, key=lambda r: r.number), sorted(not_started)


def _print_number(run: NumberRun) -> None:
    if not run.outcomes and not run.died:
        return  # nothing of this number runs against a broker in this mode
    parts = [f"{o.name} {o.result.value}" for o in sorted(run.outcomes.values(),
                                                           key=lambda o: o.name)]
    if run.died:
        parts.append(run.died)
    print(f"[{run.number}] {run.seconds:6.1f}s  " + "; ".join(parts), flush=True)


# -- the report ------------------------------------------------------------------------


def report(verdict: Verdict, suite: Suite, not_started: list[str]) -> str:
    """What a person reads at the end: what does not match the list, the failures
    grouped by reason, and one closing line."""
    lines: list[str] = []

    def section(title: str, findings: list[Finding]) -> None:
        if findings:
            lines.append(f"\n{title}:")
            lines.extend(f"  {f.describe()}" for f in findings)

    section("REGRESSIONS (listed pass; fix the gateway or the list)", verdict.regressions)
    section("NOT IN tests/conformance/librdkafka.toml (add them)", verdict.unlisted)
    section("LISTED BUT NOT REPORTED by the test-runner", verdict.silent)
    section("FAILING OTHERWISE THAN LISTED", verdict.changed)
    section("PASSING ALTHOUGH LISTED AS NOT (tighten the list)", verdict.surprises)
    if not_started:
        lines.append(f"\nNOT RUN (the run's limit passed or the gateway died): "
                     f"{', '.join(not_started)}")
    by_reason: dict[str, list[str]] = {}
    for name, outcome in sorted(verdict.outcomes.items()):
        e = suite.tests.get(name)
        if outcome.result is not Result.PASSED and e is not None and e.reason is not None:
            by_reason.setdefault(e.reason.key, []).append(name[:4])
    if by_reason:
        lines.append("\nnot passing, by listed reason:")
        for key, names in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
            r = suite.reasons[key]
            item = f", issue 47 item {', '.join(map(str, r.items))}" if r.items else ""
            lines.append(f"  {len(names):3d}  {key} ({r.kind.value}{item}): {' '.join(names)}")
    passed = verdict.count(Result.PASSED)
    total = len(verdict.outcomes)
    problems = (len(verdict.regressions) + len(verdict.unlisted) + len(verdict.silent)
                + len(verdict.changed) + len(not_started))
    lines.append(f"\nlibrdkafka {suite.librdkafka} {verdict.mode.value} mode against the "
                 f"gateway: {passed} of {total} tests pass; {total - passed} do not "
                 f"({verdict.count(Result.SKIPPED)} skip themselves); "
                 f"{problems} problem(s) with the list, "
                 f"{len(verdict.surprises)} listed failure(s) now passing")
    return "\n".join(lines)


def _results_json(verdict: Verdict, suite: Suite, runs: list[NumberRun]) -> str:
    tests = {}
    for name, o in sorted(verdict.outcomes.items()):
        e = suite.tests.get(name)
        tests[name] = {"result": o.result.value, "detail": o.detail, "seconds": o.seconds,
                       "expected": e.expected(verdict.mode).value if e else None}
    processes = {r.number: {"returncode": r.returncode, "seconds": round(r.seconds, 1),
                            "died": r.died} for r in runs}
    return json.dumps({"librdkafka": suite.librdkafka, "mode": verdict.mode.value,
                       "tests": tests, "processes": processes}, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance.runner",
        description="librdkafka's test suite against a ledgerd local --kafka cluster")
    parser.add_argument("--mode", choices=[m.value for m in Mode], default="quick")
    parser.add_argument("--librdkafka", type=Path, default=None,
                        help="the built librdkafka tree (default build/librdkafka-<version "
                             "in the list>)")
    parser.add_argument("--expectations", type=Path, default=EXPECTATIONS)
    parser.add_argument("--tests", default="",
                        help="only these test numbers, comma-separated (e.g. 0001,0081)")
    parser.add_argument("--jobs", type=int, default=2,
                        help="test-runner processes at once (default 2)")
    parser.add_argument("--gateways", type=int, default=None,
                        help="Kafka gateways in the cluster (default: the list's "
                             "[suite] gateways)")
    args = parser.parse_args(argv)
    mode = Mode(args.mode)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: at least 1")
    try:
        suite = load_suite(args.expectations)
        tree = (args.librdkafka or BUILD / f"librdkafka-{suite.librdkafka}").resolve()
        version = librdkafka_version(tree)
        if version != suite.librdkafka:
            raise HarnessError(f"{tree} is librdkafka {version}, but {args.expectations} "
                               f"lists the tests of {suite.librdkafka}")
        if not (tree / "tests" / "test-runner").exists():
            raise HarnessError(f"{tree / 'tests' / 'test-runner'} is not built; "
                               "`make conformance` builds it")
        numbers = numbers_of(tree / "tests")
        if args.tests:
            wanted = [n.strip() for n in args.tests.split(",") if n.strip()]
            unknown = sorted(set(wanted) - set(numbers))
            if unknown:
                raise HarnessError(f"--tests: no test numbered {', '.join(unknown)} in "
                                   f"librdkafka {version}")
            numbers = sorted(set(wanted))
        work = BUILD / "conformance" / mode.value
        for old in (work / "cluster", work / "cluster-ssl", work / "ssl",
                    work / "cluster-sasl"):
            if old.exists():
                subprocess.run(["rm", "-rf", str(old)], check=True)
        work.mkdir(parents=True, exist_ok=True)
        on_ssl = sorted(set(numbers) & suite.numbers_on(Listener.SSL))
        on_sasl = sorted(set(numbers) & suite.numbers_on(Listener.SASL))
        started = time.monotonic()
        gateways = args.gateways or suite.gateways
        with ExitStack() as clusters:
            targets: dict[str, Target] = {}
            if set(numbers) - set(on_ssl) - set(on_sasl):
                data = work / "cluster"
                gateway = clusters.enter_context(local_cluster(
                    data, work / "ledgerd-local.out", gateways))
                (work / "test.conf").write_text(TEST_CONF.format(bootstrap=gateway.bootstrap))
                plain = Target(gateway=gateway, data=data, conf=work / "test.conf", env={})
                targets.update((n, plain) for n in numbers
                               if n not in on_ssl and n not in on_sasl)
            if on_ssl:
                ssl = _ssl_target(work, clusters)
                targets.update((n, ssl) for n in on_ssl)
            if on_sasl:
                sasl = _sasl_target(work, clusters)
                targets.update((n, sasl) for n in on_sasl)
            clusters_used = list({id(t): t for t in targets.values()}.values())
            print(f"librdkafka {version} test-runner, {mode.value} mode "
                  f"({' '.join(MODE_ARGS[mode])}), {len(numbers)} test numbers, "
                  f"{args.jobs} at a time, against "
                  + " and ".join(f"the gateway at {t.gateway.bootstrap}"
                                 + (f" (SSL: {', '.join(on_ssl)})" if t.env else "")
                                 + (f" (SASL: {', '.join(on_sasl)})"
                                    if on_sasl and t.conf.name == "test-sasl.conf" else "")
                                 for t in clusters_used), flush=True)
            runs, not_started = run_all(targets, tree, mode, suite, work, args.jobs)
            dead_gateways = [t.gateway for t in clusters_used if not t.gateway.is_accepting()]
            bookies = "\n".join(bookie_status(t.data) for t in clusters_used)
    except HarnessError as exc:
        print(f"conformance: {exc}", file=sys.stderr)
        return 2
    outcomes = {name: o for run in runs for name, o in run.outcomes.items()}
    died = {r.number: r.died for r in runs if r.died}
    verdict = judge(suite, mode, outcomes, [r.number for r in runs], died)
    (work / "results.json").write_text(_results_json(verdict, suite, runs))
    print(report(verdict, suite, not_started))
    print(f"({time.monotonic() - started:.0f}s; logs in {work / 'logs'}, gateway log"
          f"{'s' if len(clusters_used) > 1 else ''} "
          f"{', '.join(str(t.gateway.log) for t in clusters_used)})")
    if "exited" in bookies:
        print(f"a bookie exited during the run (`ledgerd local ctl status`):\n{bookies}",
              file=sys.stderr)
    for gateway in dead_gateways:
        print(f"the gateway at {gateway.bootstrap} was not accepting connections at the end; "
              f"see {gateway.log}", file=sys.stderr)
    if dead_gateways:
        return 2
    return 0 if verdict.is_ok and not not_started else 1


if __name__ == "__main__":
    sys.exit(main())
