"""The ``ledgerd`` console script.

Each command parses its arguments, builds a configuration, and runs; errors that a user
can fix print one line and exit non-zero (a traceback only with ``--debug``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import click

from ledgerd import __version__
from ledgerd.appliance.config import BookieConfig
from ledgerd.base.logs import LOG_FORMATS, configure_logging
from ledgerd.base.settings import ConfigError, defaults_toml, load_config
from ledgerd.base.tls import TlsConfigError
from ledgerd.config import ClientConfig
from ledgerd.disk.errors import StorageError
from ledgerd.errors import LedgerdError, single_exception
from ledgerd.metadata.errors import MetadataError

__all__ = ["main"]


class CliError(click.ClickException):
    """A user-facing error: printed as one line, exit status 1."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("--log-format", type=click.Choice(LOG_FORMATS), default=None,
              envvar="LEDGERD_LOG_FORMAT",
              help="Log lines as key=value (default) or JSON objects (a bookie's "
                   "log_format setting otherwise).")
@click.version_option(__version__, prog_name="ledgerd")
@click.pass_context
def cli(ctx: click.Context, debug: bool, log_format: str | None) -> None:
    """ledgerd: a replicated journal appliance after Apache BookKeeper."""
    ctx.obj = {"debug": debug, "log_format": log_format}
    configure_logging("DEBUG" if debug else "INFO", fmt=log_format or "kv")


# LEDGERD_* variables read by something other than a configuration class.
OTHER_ENV = ("LEDGERD_LOG_FORMAT", "LEDGERD_CRASH_AT", "LEDGERD_CRASH_SEED",
             "LEDGERD_FAULT_PLAN", "LEDGERD_FAULTS_SEED", "LEDGERD_FUZZ_SEED",
             "LEDGERD_WRITE_VECTORS", "LEDGERD_TEST_SPARK_COMMIT_PAUSE_S")


def environment_warnings() -> list[str]:
    """One line per LEDGERD_* variable that names no bookie, client or gateway key."""
    import os

    from ledgerd.base.settings import unknown_environment
    from ledgerd.kafka.config import GatewayConfig

    return unknown_environment(os.environ, (BookieConfig, ClientConfig, GatewayConfig),
                               OTHER_ENV)


@cli.command("config")
@click.option("--defaults", is_flag=True,
              help="Print a commented TOML file with every key and its default.")
@click.option("--check", "check", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Validate FILE (TOML or a BookKeeper bk_server.conf, with LEDGERD_* "
                   "variables): every problem on its own line, then exit 2.")
@click.option("--effective", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Print what a process would run with: FILE + LEDGERD_* over the defaults.")
@click.option("--from-bookkeeper", "from_bk", type=click.Path(dir_okay=False, path_type=Path),
              default=None,
              help="Print the ledgerd TOML equivalent of a BookKeeper bk_server.conf "
                   "(a comment for each name ledgerd ignores, and why).")
@click.option("--client", is_flag=True, help="Client settings instead of bookie settings.")
@click.option("--gateway", is_flag=True,
              help="Kafka gateway settings (client keys + gateway keys) instead of bookie settings.")
def config_cmd(defaults: bool, check: Path | None, effective: Path | None, from_bk: Path | None,
               client: bool, gateway: bool) -> None:
    """Print configuration defaults, validate a file, show the effective settings, or
    translate a BookKeeper configuration file."""
    import dataclasses

    from ledgerd.base import settings as st
    from ledgerd.kafka.config import GatewayConfig

    if client and gateway:
        raise CliError("name one of --client, --gateway")
    cls: type[Any] = GatewayConfig if gateway else ClientConfig if client else BookieConfig
    if sum((defaults, check is not None, effective is not None, from_bk is not None)) != 1:
        raise CliError("name one of --defaults, --check FILE, --effective FILE, "
                       "--from-bookkeeper FILE")
    if defaults:
        click.echo(defaults_toml(cls), nl=False)
        return
    if from_bk is not None:
        click.echo(st.bookkeeper_toml(cls, from_bk), nl=False)
        return
    path = check or effective
    notes: list[st.ConfigNote] = []
    problems: list[ConfigError] = []
    try:
        cfg = load_config(cls, path=path, notes=notes)
    except ConfigError as exc:
        problems = exc.problems
    # One line each: what was read or ignored, then unknown variables, then the errors.
    for note in notes:
        click.echo(f"{'warning' if note.is_warning else 'note'}: {note}", err=True)
    for line in environment_warnings():
        click.echo(f"warning: {line}", err=True)
    if problems:
        for problem in problems:
            click.echo(f"error: {problem}", err=True)
        click.echo(f"ledgerd: error: {path}: {len(problems)} config problem(s)", err=True)
        sys.exit(2)
    if check is not None:
        changed = sum(1 for f in dataclasses.fields(cls)
                      if getattr(cfg, f.name) != f.default)
        click.echo(f"ok: {path} is a valid {cls.__name__} ({changed} setting(s) differ "
                   "from the defaults)")
        return
    lines = [f"# effective {cls.__name__}: {path} and LEDGERD_* over the defaults"]
    for f in dataclasses.fields(cls):
        value = getattr(cfg, f.name)
        mark = "" if value == f.default else "  # set"
        lines.append(f"{f.name} = {st.toml_value(value)}{mark}")
    click.echo("\n".join(lines))


def _log_effective(config: BookieConfig, notes: list[Any]) -> None:
    """The bookie's settings that differ from the defaults, BookKeeper names read or
    ignored, and LEDGERD_* variables that name no setting."""
    import dataclasses
    import logging

    from ledgerd.base import settings as st
    from ledgerd.base.logs import fields

    log = logging.getLogger("ledgerd.appliance.config")
    for note in notes:
        log.log(logging.WARNING if note.is_warning else logging.INFO,
                "config_bookkeeper_name", extra=fields(note=str(note)))
    for line in environment_warnings():
        log.warning("config_unknown_environment", extra=fields(note=line))
    changed = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
               if getattr(config, f.name) != f.default and "secret" not in f.name}
    log.info("config_effective", extra=fields(**{k: st.toml_value(v) for k, v in
                                                 changed.items()}))


def _refuse_the_environments_cluster(conf: Path | None, config: BookieConfig) -> None:
    """CliError when a new bookie would write its first cookie into the cluster that
    LEDGERD_ZK_SERVERS names instead of the one its file names (tools/target.py)."""
    from ledgerd.tools.target import env_override_problem

    env_zk = os.environ.get("LEDGERD_ZK_SERVERS")
    if conf is None or env_zk is None:
        return
    try:
        own = load_config(BookieConfig, path=conf, env={})
    except ConfigError:  # not a file this check can read alone: the start decides
        return
    dirs = [config.journal_directory, *config.ledger_directories]
    problem = env_override_problem(
        file_zk=own.zk_servers, env_zk=config.zk_servers, conf=str(conf),
        has_cookie=any((Path(d) / "current" / "VERSION").exists() for d in dirs))
    if problem:
        raise CliError(f"bookie did not start: {problem}")


@cli.command("bookie")
@click.option("--conf", "conf", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="TOML configuration file, or BookKeeper's bk_server.conf (read by its "
                   ".conf extension or its properties syntax); LEDGERD_<KEY> variables "
                   "override it.")
@click.option("--port", type=int, default=None, help="Override bookie_port.")
@click.pass_context
def bookie_cmd(ctx: click.Context, conf: Path | None, port: int | None) -> None:
    """Run a bookie in the foreground until SIGTERM or SIGINT."""
    from ledgerd.appliance.main import run_bookie

    overrides: dict[str, Any] = {} if port is None else {"bookie_port": port}
    notes: list[Any] = []
    config = load_config(BookieConfig, path=conf, overrides=overrides, notes=notes)
    _refuse_the_environments_cluster(conf, config)
    configure_logging("DEBUG" if ctx.obj["debug"] else config.log_level,
                      fmt=ctx.obj["log_format"] or config.log_format,
                      levels=config.log_levels, log_file=config.log_file)
    _log_effective(config, notes)
    try:
        code = run_bookie(config)
    except BaseException as exc:
        leaf = single_exception(exc)
        if ctx.obj["debug"] or not isinstance(leaf, StorageError | MetadataError | OSError
                                              | TlsConfigError):
            raise
        raise CliError(f"bookie did not start: {leaf}") from exc
    sys.exit(code)



@cli.command("gateway")
@click.option("--conf", "conf", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="TOML file with client keys (zk_servers, quorums, TLS to bookies) and "
                   "gateway keys (gateway_port, ...); LEDGERD_<KEY> variables override it.")
@click.option("--port", type=int, default=None, help="Override gateway_port.")
@click.pass_context
def gateway_cmd(ctx: click.Context, conf: Path | None, port: int | None) -> None:
    """Run a Kafka gateway: stock Kafka clients produce and consume ledgerd logs."""
    from ledgerd.appliance.kafka_gateway import run_gateway
    from ledgerd.kafka.config import GatewayConfig

    overrides: dict[str, Any] = {} if port is None else {"gateway_port": port}
    config = load_config(GatewayConfig, path=conf, overrides=overrides)
    configure_logging("DEBUG" if ctx.obj["debug"] else "INFO",
                      fmt=ctx.obj["log_format"] or "kv")
    try:
        code = run_gateway(config)
    except BaseException as exc:
        leaf = single_exception(exc)
        if ctx.obj["debug"] or not isinstance(leaf, LedgerdError | OSError):
            raise
        raise CliError(f"gateway did not start: {leaf}") from exc
    sys.exit(code)


@cli.command("autorecovery")
@click.option("--conf", "conf", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The bookie's TOML file (zk_servers, cluster_secret_file, autorecovery "
                   "keys; LEDGERD_<KEY> variables override it).")
@click.option("--id", "worker_id", default=None,
              help="Name in the auditor election and on ledger locks (default host:pid).")
@click.pass_context
def autorecovery_cmd(ctx: click.Context, conf: Path | None, worker_id: str | None) -> None:
    """Run the auditor and replication workers standalone until SIGTERM or SIGINT."""
    import os
    import socket

    from ledgerd.appliance.main import run_autorecovery_process

    config = load_config(BookieConfig, path=conf)
    configure_logging("DEBUG" if ctx.obj["debug"] else config.log_level,
                      fmt=ctx.obj["log_format"] or config.log_format)
    name = worker_id or f"{socket.gethostname()}:{os.getpid()}"
    try:
        code = run_autorecovery_process(config, name)
    except BaseException as exc:
        leaf = single_exception(exc)
        if isinstance(leaf, ConfigError) and not ctx.obj["debug"]:
            raise leaf from None
        if ctx.obj["debug"] or not isinstance(leaf, LedgerdError | OSError):
            raise
        raise CliError(f"autorecovery did not start: {leaf}") from exc
    sys.exit(code)


@cli.group("local", invoke_without_command=True)
@click.option("--bookies", default=3, show_default=True, type=click.IntRange(0, 64),
              help="Number of bookie processes to start.")
@click.option("--data", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep ZooKeeper and bookie data here (survives restarts).")
@click.option("--zk", default=None, help="Use this ZooKeeper instead of starting one.")
@click.option("--zk-root", "zk_root", default="/ledgers", show_default=True,
              help="The cluster's root znode (zk_ledgers_root_path).")
@click.option("--layout", type=click.Choice(["hierarchical", "flat"]), default="hierarchical",
              show_default=True, help="Ledger znode layout (ledger_manager_type).")
@click.option("--kafka", "kafka_port", type=click.IntRange(0, 65535), default=None,
              help="Also run a Kafka gateway on this port (docs/kafka.md).")
@click.option("--kafka-gateways", "kafka_gateways", type=click.IntRange(1, 9), default=1,
              show_default=True,
              help="With --kafka: this many gateways, on consecutive ports from it; more "
                   "than one get node ids 1..N, each its own rack (RACK1..RACKN) and "
                   "rack-aware reads (fetch from follower).")
@click.option("--tls", is_flag=True,
              help="TLS-only bookies, with a throwaway CA and certificates made under "
                   "<data>/tls (clients need tls_trust_path=<data>/tls/ca.pem).")
@click.option("--kafka-tls", "kafka_tls", is_flag=True,
              help="The Kafka gateway (--kafka) listens with TLS only (Kafka's SSL), with a "
                   "certificate for 127.0.0.1 and localhost from the throwaway CA under "
                   "<data>/tls, and verifies Kafka clients' certificates against that CA "
                   "(<data>/tls/ca.key issues more; client.pem/client.key is one).")
@click.option("--kafka-client-auth", "kafka_client_auth",
              type=click.Choice(["required", "optional", "none"]), default=None,
              help="With --kafka-tls: whether Kafka clients must present a certificate "
                   "(gateway_tls_client_auth; Kafka's ssl.client.auth).  [default: required]")
@click.pass_context
def local_cmd(ctx: click.Context, bookies: int, data: Path | None, zk: str | None,
              zk_root: str, layout: str, kafka_port: int | None, kafka_gateways: int,
              tls: bool, kafka_tls: bool, kafka_client_auth: str | None) -> None:
    """Run a local cluster (ZooKeeper + bookies) in the foreground until Ctrl-C.

    While it runs, `ledgerd local ctl kill|stop|start N` and `ledgerd local ctl status`
    (in another terminal) control its bookies by index."""
    if ctx.invoked_subcommand is not None:
        return
    from ledgerd.tools.localcluster import LocalCluster, LocalClusterError

    if not zk_root.startswith("/") or zk_root.endswith("/"):
        raise click.BadParameter(f"{zk_root!r}: a znode path such as /ledgers",
                                 param_hint="--zk-root")
    if kafka_gateways > 1 and kafka_port is None:
        raise click.BadParameter("needs --kafka PORT (the first gateway's port)",
                                 param_hint="--kafka-gateways")
    if kafka_tls and kafka_port is None:
        raise click.UsageError("--kafka-tls is for the Kafka gateway: give --kafka PORT too")
    if kafka_client_auth is not None and not kafka_tls:
        raise click.UsageError("--kafka-client-auth needs --kafka-tls")
    if kafka_port:
        for i in range(kafka_gateways):
            _check_port_free(kafka_port + i, "--kafka" if i == 0 else "--kafka-gateways")
    base = data or Path(tempfile.mkdtemp(prefix="ledgerd-local-"))
    cluster = LocalCluster(base, bookies=bookies, zk=zk, root=zk_root, layout=layout, tls=tls,
                           kafka_port=kafka_port, kafka_gateways=kafka_gateways,
                           kafka_tls=(kafka_client_auth or "required") if kafka_tls else "")
    stop = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop.set()

    def _sigterm_while_starting(signum: int, frame: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)

    # Start-up blocks (ZooKeeper, registrations): a signal stops it at once. SIGINT keeps
    # Python's own handler, which trio.run (when one runs) replaces with its own and
    # turns into KeyboardInterrupt at a safe point; SIGTERM goes the SIGINT way.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_while_starting)
    try:
        try:
            cluster.start()
        except BaseException as exc:
            # Inside trio.run a KeyboardInterrupt may come wrapped in a group.
            if not (isinstance(exc, KeyboardInterrupt) or (
                    isinstance(exc, BaseExceptionGroup)
                    and exc.subgroup(KeyboardInterrupt) is not None)):
                raise
            click.echo("interrupted while starting; stopping what started", err=True)
            sys.exit(130)
        signal.signal(signal.SIGINT, _on_signal)
        signal.signal(signal.SIGTERM, _on_signal)
        click.echo(f"ZooKeeper: {cluster.zk}")
        for b in cluster.bookies:
            click.echo(f"bookie {b.bookie_id}: pid {b.pid}, metrics http://127.0.0.1:"
                       f"{b.admin_port}/metrics, log {b.log_path}")
        if kafka_port is not None:
            metrics = cluster.gateway_line.rsplit("metrics ", 1)[-1]
            kcat = f"kcat -b 127.0.0.1:{kafka_port}"
            if kafka_tls:
                f = cluster.tls_files
                kcat += (f" -X security.protocol=ssl -X ssl.ca.location={f['ca']} -X "
                         f"ssl.certificate.location={f['client_cert']} -X "
                         f"ssl.key.location={f['client_key']}")
            click.echo(f"Kafka gateway: 127.0.0.1:{kafka_port}, metrics {metrics}, log "
                       f"{base / 'gateway.log'} (try: {kcat} -L)")
            for i in range(1, kafka_gateways):
                click.echo(f"Kafka gateway {i + 1}: 127.0.0.1:{kafka_port + i}, rack "
                           f"RACK{i + 1}, log {cluster.gateway_log(i)}")
            if kafka_tls:
                who = "every gateway requires" if kafka_gateways > 1 else "the gateway requires"
                click.echo(f"Kafka TLS: {who} it (client certificates {cluster.kafka_tls}); "
                           f"CA {cluster.tls_files['ca']}, its key {cluster.tls_files['ca_key']}")
        click.echo(f"data: {base}" + ("" if data else " (removed on exit; --data DIR keeps it)"))
        cluster.serve_control()
        click.echo("\nWatch a bookie die and come back, in another terminal: "
                   "ledgerd local ctl kill 1; ledgerd local ctl status; "
                   "ledgerd local ctl start 1")
        e, q = snippet_quorums(len(cluster.bookies))
        root_arg = "" if zk_root == "/ledgers" else f", zk_ledgers_root_path={zk_root!r}"
        if tls:
            root_arg += f", tls_trust_path={cluster.tls_files['ca']!r}"
            click.echo(f"TLS: every bookie requires it; CA {cluster.tls_files['ca']}, a client "
                       f"certificate in {cluster.tls_files['client_cert']} (role client)")
        click.echo("\nTry it (Python, in another terminal):\n"
                   "  import ledgerd\n"
                   f"  c = ledgerd.SyncClient({cluster.zk!r}{root_arg}); "
                   f"lh = c.create_ledger({e}, {q}, {q})\n"
                   "  lh.append(b'hello'); lh.close(); "
                   "print([e.payload for e in c.open_ledger(lh.ledger_id).read()]); c.close()\n")
        click.echo("Running; press Ctrl-C to stop.")
        while not stop.wait(0.5):
            problem = cluster.check()
            if problem:
                raise CliError(problem)
            for b in cluster.newly_dead():
                code = b.process.returncode if b.process is not None else None
                click.echo(f"{b.name} {b.bookie_id} (pid {b.pid}) exited with {code}; the "
                           "others go on, and their autorecovery copies its ledgers to the "
                           "rest (`ledgerd shell listunderreplicated`); `ledgerd local ctl "
                           f"start {cluster.bookies.index(b)}` brings it back. Log: "
                           f"{b.log_path}", err=True)
    except LocalClusterError as exc:
        raise CliError(str(exc)) from exc
    finally:
        # Ctrl-C again while stopping would leave processes behind: ignore it now.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.stop()
        if data is None:
            shutil.rmtree(base, ignore_errors=True)
            click.echo(f"stopped; removed {base} (--data DIR keeps a cluster's data).")
        else:
            click.echo(f"stopped; data kept in {base}.")


def snippet_quorums(bookies: int) -> tuple[int, int]:
    """The printed example's ensemble and quorum: E leaves a bookie outside the ensemble
    when there are three or more, so that killing one shows autorecovery healing its
    ledgers onto the spare (README quick start); Qw = Qa = min(2, E)."""
    e = max(1, min(3, bookies - 1 if bookies >= 3 else bookies))
    return e, min(2, e)


def _check_port_free(port: int, option: str) -> None:
    """CliError naming ``port`` when something listens on it already."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise CliError(f"{option} {port}: port {port} on 127.0.0.1 is in use "
                           f"({exc.strerror}); pick another") from None


@local_cmd.command("ctl")
@click.argument("action", type=click.Choice(["kill", "stop", "start", "status", "env"]))
@click.argument("index", type=int, required=False)
@click.option("--data", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The running cluster's data directory (default: the one running "
                   "`ledgerd local` under the temp directory).")
def local_ctl_cmd(action: str, index: int | None, data: Path | None) -> None:
    """Control a running `ledgerd local`: kill (SIGKILL), stop (SIGTERM), start a bookie
    by index, print every bookie's status, or (env) the variables that name it
    (`eval "$(ledgerd local ctl env)"` in another terminal)."""
    from ledgerd.tools.localcluster import LocalClusterError, send_control
    from ledgerd.tools.target import find_local_clusters

    if data is None:
        running = find_local_clusters()
        if not running:
            raise CliError("no `ledgerd local` is running under "
                           f"{tempfile.gettempdir()}; give --data DIR")
        if len(running) > 1:
            raise CliError("several `ledgerd local` clusters run: give --data, one of "
                           + ", ".join(map(str, running)))
        data = running[0]
    if action not in ("status", "env") and index is None:
        raise CliError(f"`ctl {action}` needs a bookie index (see `ledgerd local ctl status`)")
    try:
        if action == "env":
            zk, _, root = send_control(data, "info").partition(" ")
            click.echo(f"export LEDGERD_ZK_SERVERS={zk}"
                       + (f" LEDGERD_ZK_LEDGERS_ROOT_PATH={root}"
                          if root and root != "/ledgers" else ""))
            return
        click.echo(send_control(data, action, index))
    except LocalClusterError as exc:
        raise CliError(str(exc)) from exc


BENCHES = ("wire_codec", "journal", "metadata", "bookie", "bookie_cpu", "latency", "client",
           "recovery", "logs", "compaction", "pipeline", "rereplication", "soak", "tls",
           "gateway", "gateway_crash", "txn_crash", "txn_phases", "ledgers_scale", "index_store",
           "open_handles", "ab",
           "ab_live", "metadata_rebuild", "metadata_versions")


@cli.group("bench")
def bench_group() -> None:
    """Benchmarks: `writes`/`reads` against a running cluster, or a bench/ script."""


def _script_command(name: str) -> click.Command:
    @click.command(name, context_settings={"ignore_unknown_options": True,
                                           "help_option_names": []})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def run(args: tuple[str, ...]) -> None:
        import subprocess

        script = Path(__file__).resolve().parent.parent / "bench" / f"{name}.py"
        if not script.exists():
            raise CliError(f"{script} not found: benchmarks run from a source checkout")
        sys.exit(subprocess.call([sys.executable, str(script), *args]))
    run.help = f"Run bench/{name}.py (arguments pass through; --help shows its own)."
    return run


for _name in BENCHES:
    bench_group.add_command(_script_command(_name))


def _register() -> None:
    from ledgerd.tools.audit import audit_cmd
    from ledgerd.tools.benchcmd import reads_cmd, writes_cmd
    from ledgerd.tools.durability_cmds import register as register_durability
    from ledgerd.tools.kafka_cmds import register as register_kafka
    from ledgerd.tools.kafka_tools import kafka_acls, kafka_configs, kafka_topics
    from ledgerd.tools.metadata_cmds import register as register_metadata
    from ledgerd.tools.replication_cmds import register as register_replication
    from ledgerd.tools.shell import shell
    from ledgerd.tools.storage_cmds import register as register_storage
    from ledgerd.tools.upgrade_cmd import upgrade_cmd

    register_replication()
    register_storage()
    register_durability()
    register_metadata()
    register_kafka()

    cli.add_command(shell)
    cli.add_command(audit_cmd)
    cli.add_command(upgrade_cmd)
    cli.add_command(kafka_topics)
    cli.add_command(kafka_acls)
    cli.add_command(kafka_configs)
    bench_group.add_command(writes_cmd)
    bench_group.add_command(reads_cmd)


_register()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="ledgerd", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        # One prefix for every error, click's included; a usage error keeps its usage
        # lines above it.
        if isinstance(exc, click.UsageError) and exc.ctx is not None:
            hint = (f"Try '{exc.ctx.command_path} {exc.ctx.help_option_names[0]}' for help."
                    if exc.ctx.command.get_help_option(exc.ctx) is not None else "")
            click.echo(exc.ctx.get_usage() + ("\n" + hint if hint else "") + "\n", err=True)
        click.echo(f"ledgerd: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except ConfigError as exc:
        if debug:
            raise
        if len(exc.problems) > 1:  # one problem a line, each naming its key
            click.echo(f"ledgerd: error: {len(exc.problems)} config problems:", err=True)
            for problem in exc.problems:
                click.echo(f"  {problem}", err=True)
        else:
            click.echo(f"ledgerd: error: {exc}", err=True)
        sys.exit(2)
    except LedgerdError as exc:  # the root of every ledgerd error, of every package
        if debug:
            raise
        click.echo(f"ledgerd: error: {exc}", err=True)
        sys.exit(1)
    except OSError as exc:
        if debug:
            raise
        click.echo(f"ledgerd: error: {exc}", err=True)
        sys.exit(1)
    except ImportError as exc:  # a client-only install (no C compiler) asked to run a bookie
        if debug or exc.name != "ledgerd.native._native":
            raise
        click.echo(f"ledgerd: error: {exc}", err=True)
        sys.exit(1)
    finally:
        logging.shutdown()


if __name__ == "__main__":
    main()
