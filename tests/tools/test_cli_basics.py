"""The console script's foundation commands."""

from __future__ import annotations

import subprocess
import sys

from ledgerd.appliance.config import BookieConfig
from ledgerd.base.settings import load_config


def test_config_defaults_prints_loadable_toml() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ledgerd.tools.cli", "config", "--defaults"],
        check=True, capture_output=True, text=True,
    ).stdout
    assert "journal_max_group_wait_ms = 0.0" in out
    assert "# BookKeeper: journalMaxGroupWaitMSec." in out
    assert load_config(BookieConfig, text=out, env={}) == load_config(BookieConfig, env={})


def test_version_prints() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ledgerd.tools.cli", "--version"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0
    assert "ledgerd" in proc.stdout


def test_bad_config_env_gives_one_line_error() -> None:
    import os
    env = dict(os.environ, LEDGERD_DISK_USAGE_THRESHOLD="lots")
    proc = subprocess.run(
        [sys.executable, "-c", "from tools.cli import main; from appliance.config import BookieConfig;"
         "from ledgerd.base.settings import load_config;"
         "import sys; sys.argv=['ledgerd','config','--defaults'];"
         "load_config(BookieConfig)"],
        capture_output=True, text=True, env=env,
    )
    assert proc.returncode != 0
    assert "LEDGERD_DISK_USAGE_THRESHOLD" in proc.stderr


def test_config_check_and_effective(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    good = tmp_path / "good.toml"
    good.write_text('bookiePort = 3199\njournal_directory = "/srv/j"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_")}

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "config", *args],
                              capture_output=True, text=True, env={**env, **extra})
    r = run("--check", str(good))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"ok: {good} is a valid BookieConfig (2 setting(s) differ " \
                               "from the defaults)"
    assert "note: " + str(good) + ": BookKeeper's bookiePort = 3199 read as bookie_port = 3199" \
        in r.stderr
    r = run("--effective", str(good), LEDGERD_GC_WAIT_TIME_MS="5000")
    assert "bookie_port = 3199  # set" in r.stdout and "gc_wait_time_ms = 5000  # set" in r.stdout
    assert "flush_interval_ms = 10000\n" in r.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('bookie_prot = 1\ndisk_usage_threshold = 3\nzk_servers = 7\n')
    r = run("--check", str(bad), LEDGERD_ZK_SERVER="x")
    # issue #48 item 12: one problem a line, each naming its key, then the count; and a
    # mistyped LEDGERD_* variable named, with the setting it probably meant
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 5, r.stderr
    assert lines[0] == "warning: environment variable LEDGERD_ZK_SERVER names no setting " \
                       "and is ignored; did you mean LEDGERD_ZK_SERVERS?"
    assert lines[1].startswith("error: config key 'bookie_prot'") and \
        "did you mean 'bookie_port'?" in lines[1]
    assert lines[2].startswith("error: config key 'disk_usage_threshold'") and \
        "between 0 and 1" in lines[2]
    assert lines[3].startswith("error: config key 'zk_servers'")
    assert lines[4] == f"ledgerd: error: {bad}: 3 config problem(s)"
    r = run("--check", str(good), LEDGERD_ZK_SERVER="x", LEDGERD_LOG_FORMAT="json")
    assert r.returncode == 0, r.stderr
    assert "warning: environment variable LEDGERD_ZK_SERVER names no setting and is " \
           "ignored; did you mean LEDGERD_ZK_SERVERS?" in r.stderr.splitlines()
    assert "LEDGERD_LOG_FORMAT" not in r.stderr
    assert run().returncode != 0
    gateway = tmp_path / "gateway.toml"
    gateway.write_text('gateway_port = 9094\nensemble_size = 2\nwrite_quorum_size = 2\n'
                       'ack_quorum_size = 1\ngateway_prot = 1\n')
    r = run("--check", str(gateway), "--gateway")
    assert r.returncode == 2 and "did you mean 'gateway_port'?" in r.stderr, r.stderr
    gateway.write_text(gateway.read_text().replace("gateway_prot = 1\n", ""))
    r = run("--check", str(gateway), "--gateway")
    assert r.returncode == 0 and "valid GatewayConfig (3 setting(s)" in r.stdout, r.stderr


def test_a_bad_zk_address_is_one_line_naming_the_problem(zookeeper) -> None:  # type: ignore[no-untyped-def]
    """A port out of range, a port that is no number, a host that does not resolve, an
    empty chroot, and a ZooKeeper without a cluster: each one line, exit 1, no
    traceback; and --help names the environment variable."""
    import subprocess
    import sys

    def shell(zk: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "--zk", zk, *args],
                              capture_output=True, text=True, timeout=60)

    cases = {
        "127.0.0.1:99999": "port 99999 is out of range 1-65535",
        "127.0.0.1:x": "the port 'x' is not a number",
        "nosuchhost.invalid:2181": "cannot resolve 'nosuchhost.invalid'",
        f"{zookeeper.connect_string}/": "an empty chroot",
        f"{zookeeper.connect_string}/no-cluster-here": "no cluster at /ledgers on",
    }
    for zk, expected in cases.items():
        done = shell(zk, "listbookies")
        assert done.returncode == 1, (zk, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (zk, done.stderr)
    helped = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert "LEDGERD_ZK_SERVERS" in helped.stdout


def test_gateway_names_a_bad_file_in_one_line_before_connecting(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_")}
    for key, want in (("LEDGERD_GATEWAY_PRINCIPALS_FILE", "'gateway_principals_file'"),
                      ("LEDGERD_GATEWAY_TLS_CERTIFICATE_PATH", "gateway_tls_certificate_path")):
        r = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "gateway"],
                           capture_output=True, text=True, timeout=60,
                           env={**env, key: str(tmp_path / "missing"),
                                "LEDGERD_ZK_SERVERS": "127.0.0.1:1"})
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert want in r.stderr and "gateway did not start" in r.stderr


def test_every_bench_script_runs_from_ledgerd_bench() -> None:
    """`ledgerd bench <name>` reaches every benchmark script in bench/ (drivers.py and
    cdriver.py are libraries of the others, not benchmarks)."""
    from pathlib import Path

    from ledgerd.tools.cli import BENCHES

    bench = Path(__file__).resolve().parents[2] / "bench"
    scripts = {p.stem for p in bench.glob("*.py")} - {"__init__", "drivers", "cdriver"}
    assert scripts == set(BENCHES)
    r = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "bench", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and all(f"  {name} " in r.stdout for name in BENCHES)


def test_every_bench_script_imports() -> None:
    """Each bench script's imports resolve (a helper one of them takes from another
    bench script can be renamed away without any test running that script)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    names = sorted(p.stem for p in (root / "bench").glob("*.py") if p.stem != "__init__")
    code = ("import importlib, sys\nfor n in sys.argv[1:]:\n"
            "    importlib.import_module('bench.' + n)")
    r = subprocess.run([sys.executable, "-c", code, *names], cwd=root, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr.strip().splitlines()[-1:]


def test_bookie_port_zero_is_refused_before_anything_starts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue #48 item 11: with port 0 the bookie id changed on every restart, and the
    restart failed blaming a directory change; now it is refused up front."""
    import os

    conf = tmp_path / "bookie.toml"
    conf.write_text(f'journal_directory = "{tmp_path}/j"\nledger_directories = '
                    f'["{tmp_path}/l"]\nzk_servers = ""\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_")}
    r = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "bookie", "--conf", str(conf),
                        "--port", "0"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "ledgerd: error: config key 'bookie_port' (from override): got 0; allowed: int "
        "between 1 and 65535 (0 would pick a new port, and so a new bookie id, on every "
        "restart: the bookie would not match its own cookie)"]
    assert not (tmp_path / "j").exists()


def test_config_from_bookkeeper_prints_toml(tmp_path) -> None:  # type: ignore[no-untyped-def]
    conf = tmp_path / "bk_server.conf"
    conf.write_text("bookiePort=3181\njournalDirectories=/data/bk/journal\n"
                    "ledgerDirectories=/data/bk/l1,/data/bk/l2\nnumAddWorkerThreads=8\n"
                    "zkServers=zk1:2181,zk2:2181\ngcWaitTime=300000\n")
    r = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "config", "--from-bookkeeper",
                        str(conf)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    cfg = load_config(BookieConfig, text=r.stdout, env={})
    assert cfg.journal_directory == "/data/bk/journal" and cfg.gc_wait_time_ms == 300_000
    assert cfg.ledger_directories == ("/data/bk/l1", "/data/bk/l2")
    assert cfg.zk_servers == "zk1:2181,zk2:2181"
    assert '# numAddWorkerThreads = "8": one trio event loop' in r.stdout
