"""What `pip install ledgerd` gives an application: one import name, no C compiler needed.

A copy of the checkout (no build products, so nothing compiled earlier can sneak in) is
installed into a fresh venv with the compiler replaced by `false`, as on a host without
gcc. The install succeeds, site-packages gains `ledgerd` and nothing generic (`wire`,
`tools`, `metadata`, ...), the client imports and builds without the native helper, and
`ledgerd bookie` says in one line what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("appliance", "wire", "disk", "native", "metadata", "tools")


@pytest.fixture(scope="module")
def client_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pkg")
    src = base / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "*.so", "*.o", "_native.c", "__pycache__",
        "tests", "bench", ".*_cache", ".hypothesis"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**_clean_env(), "CC": "false", "LDSHARED": "false", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run([str(venv / "bin/pip"), "install", "-q", "-c",
                           str(ROOT / "constraints.txt"), str(src)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


def _clean_env() -> dict[str, str]:
    """This environment without what points at the checkout (the suite exports
    PYTHONPATH for its subprocesses)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def test_one_import_name_and_no_compiled_helper(client_only: Path) -> None:
    site = _site(client_only)
    ours = [p.name for p in site.iterdir() if p.name.startswith("ledgerd")]
    assert sorted(ours) == ["ledgerd", "ledgerd-0.1.0.dist-info"]
    assert not [f for f in FOLDERS if (site / f).exists()]
    for folder in FOLDERS:  # the folders are inside ledgerd, as real directories
        assert (site / "ledgerd" / folder / "__init__.py").is_file()
    assert not list((site / "ledgerd" / "native").glob("_native*.so"))


def test_the_client_works_without_the_native_helper(client_only: Path, tmp_path: Path) -> None:
    code = (
        "import sys, ledgerd\n"
        "from ledgerd.sync import SyncClient\n"
        "from ledgerd.client import Client\n"
        "from ledgerd.metadata.memory import InMemoryCluster\n"
        "import ledgerd.tools.cli\n"
        "assert ledgerd.__file__.startswith(sys.prefix), ledgerd.__file__\n"
        "loaded = [m for m in sys.modules if m.startswith(('ledgerd.native', 'ledgerd.disk.'))]\n"
        "print(sorted(loaded))\n"
    )
    done = subprocess.run([str(client_only / "bin/python"), "-c", code], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env=_clean_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['ledgerd.disk.errors']"
    helped = subprocess.run([str(client_only / "bin/ledgerd"), "shell", "--help"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, env=_clean_env())
    assert helped.returncode == 0 and "bookieformat" in helped.stdout, helped.stderr


def test_a_bookie_says_what_is_missing(client_only: Path, tmp_path: Path) -> None:
    done = subprocess.run([str(client_only / "bin/ledgerd"), "bookie"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env=_clean_env())
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "ledgerd: error: ledgerd's native I/O helper was not built (no C compiler when "
        "ledgerd was installed): the client works without it, a bookie needs it; install "
        "gcc and python3-dev, then reinstall ledgerd"]
