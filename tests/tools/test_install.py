"""systemd/install.sh into a scratch root: the layout, idempotence, the units verified
and rated by systemd-analyze, a bookie run from the installed tree, and an uninstall
that keeps configuration and data.

systemd is not PID 1 here (nor in CI), so nothing is enabled or started through it: the
installed units are checked offline (``systemd-analyze verify`` on copies whose paths
point into the scratch root, ``systemd-analyze security --offline``), and the bookie is
started by hand with the unit's own command line.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from ledgerd.metadata.registry import BookieRegistry, BookieSet
from ledgerd.tools.zkserver import find_free_port
from tests.cluster import metadata_store

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "systemd" / "install.sh"
UNITS = ("ledgerd-bookie.service", "ledgerd-bookie@.service", "ledgerd-autorecovery.service",
         "ledgerd-gateway.service", "ledgerd-metadata-snapshot.service")
TIMERS = ("ledgerd-metadata-snapshot.timer",)
RATINGS = ("PERFECT", "SAFE", "OK")


def _install(root: Path, *args: str) -> str:
    done = subprocess.run(["bash", str(SCRIPT), "--root", str(root), *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("root")
    out = _install(root)
    assert "installed ledgerd into" in out
    return root


def test_layout_and_a_second_run_changes_nothing(installed: Path) -> None:
    root = installed
    assert (root / "opt/ledgerd/bin/ledgerd").is_file()
    assert (root / "opt/ledgerd/share/doc/ledgerd/operations.md").is_file()
    assert (root / "opt/ledgerd/share/doc/ledgerd/grafana/ledgerd-bookies.json").is_file()
    for unit in UNITS:
        assert (root / "etc/systemd/system" / unit).is_file()
    assert (root / "var/lib/ledgerd").is_dir()
    config = root / "etc/ledgerd/bookie.toml"
    config.write_text(config.read_text() + "# edited by the operator\n")
    again = _install(root)
    assert "installed" not in again and "wrote" not in again  # nothing to do
    assert config.read_text().endswith("# edited by the operator\n")


def _pointed_into(root: Path, unit: str, out: Path) -> Path:
    """A copy of ``unit`` whose absolute paths point into the scratch root."""
    text = (root / "etc/systemd/system" / unit).read_text()
    text = text.replace("/opt/ledgerd", str(root / "opt/ledgerd"))
    text = text.replace("/etc/ledgerd", str(root / "etc/ledgerd"))
    path = out / unit
    path.write_text(text)
    return path


def test_every_unit_passes_systemd_analyze_verify(installed: Path, tmp_path: Path) -> None:
    for unit in (*UNITS, *TIMERS):
        path = _pointed_into(installed, unit, tmp_path)
        target = path.with_name(unit.replace("@.", "@1.")) if "@." in unit else path
        done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(target)],
                              capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0 and not done.stderr.strip(), (unit, done.stderr)


@pytest.mark.parametrize("unit", UNITS)
def test_units_are_rated_ok_or_better_by_systemd_analyze_security(unit: str) -> None:
    done = subprocess.run(["systemd-analyze", "security", "--offline=true",
                           str(ROOT / "systemd" / unit)], capture_output=True, text=True)
    match = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", done.stdout)
    assert match, done.stdout + done.stderr
    assert match.group(2) in RATINGS, f"{unit}: {match.group(1)} {match.group(2)}"


def test_units_hardening_leaves_what_a_bookie_needs() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(ROOT / "systemd" / "ledgerd-bookie.service")
    service = unit["Service"]
    assert service["ReadWritePaths"] == "/var/lib/ledgerd"
    assert "AF_INET" in service["RestrictAddressFamilies"]
    assert "AF_UNIX" in service["RestrictAddressFamilies"]  # sd_notify
    assert int(service["RestartSec"]) >= 15


async def test_a_bookie_runs_from_the_installed_tree(installed: Path, zk_chroot: str,
                                                     tmp_path: Path) -> None:
    port = find_free_port()
    bookie_id = f"127.0.0.1:{port}"
    conf = tmp_path / "bookie.toml"
    conf.write_text(
        f'bookie_port = {port}\nlisten_address = "127.0.0.1"\nadmin_port = 0\n'
        f'zk_servers = "{zk_chroot}"\njournal_directory = "{installed}/var/lib/ledgerd/j"\n'
        f'ledger_directories = ["{installed}/var/lib/ledgerd/l"]\njournal_prealloc_mb = 4\n')
    async with metadata_store(zk_chroot) as store:
        # The unit's own command line, with the scratch root's paths.
        proc = subprocess.Popen([str(installed / "opt/ledgerd/bin/ledgerd"), "bookie",
                                 "--conf", str(conf)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            async def up(snapshot: BookieSet) -> bool:
                return bookie_id in snapshot.writable

            async def died() -> None:
                code = await trio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)
                raise AssertionError(f"the installed bookie exited with {code}: "
                                     f"{proc.stderr.read().decode()}")  # type: ignore[union-attr]

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(died)
                    await BookieRegistry(store, "/ledgers").wait_for(up)
                    nursery.cancel_scope.cancel()
        finally:
            proc.terminate()
            assert proc.wait(60) == 0
    assert (installed / "var/lib/ledgerd/j/current").is_dir()


def test_uninstall_keeps_configuration_and_data(tmp_path: Path, installed: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(installed, root, symlinks=True)
    (root / "var/lib/ledgerd/keep").write_text("data")
    out = _install(root, "--uninstall")
    assert "kept" in out
    assert not (root / "opt/ledgerd").exists()
    assert not any((root / "etc/systemd/system").glob("ledgerd-*"))
    assert (root / "etc/ledgerd/bookie.toml").is_file()
    assert (root / "var/lib/ledgerd/keep").read_text() == "data"


def test_an_interpreter_the_service_user_cannot_run_is_refused_before_building(
        tmp_path: Path) -> None:
    """PYTHON in a directory only root can enter (a pyenv in root's home): the install
    stops before it builds anything, naming the interpreter and PYTHON=."""
    private = tmp_path / "home"  # under pytest's 0700 directory: no one else gets in
    private.mkdir(mode=0o700)
    interp = private / "python3"
    interp.symlink_to(shutil.which("python3") or "/usr/bin/python3")
    root = tmp_path / "root"
    root.mkdir()
    done = subprocess.run(["bash", str(SCRIPT), "--root", str(root), "--user", "nobody"],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHON": str(interp)})
    assert done.returncode == 2, (done.stdout, done.stderr)
    err = done.stderr.strip()
    assert err.startswith(f"install.sh: the service user nobody cannot run {interp} "), err
    assert "Permission denied" in err and "PYTHON=/usr/bin/python3" in err, err
    assert not (root / "opt" / "ledgerd").exists()
