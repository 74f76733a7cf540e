"""The cluster secret: the file bookies and autorecovery read to derive recovery credentials.

Bookies and autorecovery processes read the same file (``cluster_secret_file``); nothing
else needs it and nothing stores it in ZooKeeper. From it, ``wire.entry.recovery_key``
derives one credential per ledger that bookies accept for RECOVERY_ADDs and fencing reads
only. ``ledgerd shell gensecret`` (or ``head -c 32 /dev/urandom``) makes one.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ledgerd.base.settings import ConfigError

__all__ = ["MIN_SECRET_BYTES", "generate_secret", "read_cluster_secret"]

MIN_SECRET_BYTES = 16


def read_cluster_secret(path: str | Path, key: str = "cluster_secret_file") -> bytes:
    """The secret's bytes (surrounding whitespace stripped); ConfigError naming ``key``
    and the file if it cannot be read, is too short, or others may read it."""
    p = Path(path)
    try:
        st = p.stat()
        data = p.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(key, str(p), f"a readable file ({exc.strerror})") from None
    if len(data) < MIN_SECRET_BYTES:
        raise ConfigError(key, str(p), f"a file holding at least {MIN_SECRET_BYTES} bytes "
                          f"(it holds {len(data)})")
    if st.st_mode & (stat.S_IRWXO):
        raise ConfigError(key, str(p), "a file other users cannot read (chmod 600 or 640)")
    return data


def generate_secret(path: str | Path) -> Path:
    """Write a new random secret (64 hex characters) to ``path``, mode 600; refuses to
    overwrite an existing file (FileExistsError)."""
    p = Path(path)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    return p
