"""Configuration: frozen dataclasses loaded from TOML, environment and flags.

Every setting is declared once with :func:`setting`, which records its BookKeeper name
(``journal_max_group_wait_ms`` = ``journalMaxGroupWaitMSec``), a one-line description and
the values it allows. The same declarations drive loading, validation, the commented
defaults file (``ledgerd config --defaults``) and the table in docs/configuration.md.

Precedence, lowest first: the dataclass default, the TOML file, ``LEDGERD_<KEY>``
environment variables, then explicit overrides (CLI flags). Unknown keys and bad values
raise :class:`ConfigError`, which names the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "ClientConfig",
    "ConfigError",
    "defaults_toml",
    "load_config",
    "markdown_table",
    "setting",
]

ENV_PREFIX = "LEDGERD_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ConfigError(ValueError):
    """A configuration value was unknown, of the wrong type or out of range."""

    def __init__(self, key: str, value: object, allowed: str, source: str = "") -> None:
        self.key = key
        self.value = value
        self.allowed = allowed
        self.source = source
        where = f" (from {source})" if source else ""
        super().__init__(f"config key {key!r}{where}: got {value!r}; allowed: {allowed}")


@dataclass(frozen=True, slots=True)
class Spec:
    """What one setting allows; attached to the dataclass field's metadata."""

    bk: str
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None

    def describe(self, kind: str) -> str:
        parts = [kind]
        if self.choices is not None:
            parts = ["one of " + ", ".join(repr(c) for c in self.choices)]
        if self.minimum is not None and self.maximum is not None:
            parts.append(f"between {self.minimum:g} and {self.maximum:g}")
        elif self.minimum is not None:
            parts.append(f">= {self.minimum:g}")
        elif self.maximum is not None:
            parts.append(f"<= {self.maximum:g}")
        return " ".join(parts)


def setting(
    default: Any,
    *,
    bk: str,
    doc: str,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """Declare a setting with its default, BookKeeper name and allowed values."""
    spec = Spec(bk=bk, doc=doc, minimum=minimum, maximum=maximum, choices=choices)
    return dataclasses.field(default=default, metadata={"spec": spec})


def _field_kind(tp: Any) -> str:
    if tp is bool:
        return "bool"
    if tp is int:
        return "int"
    if tp is float:
        return "float"
    if tp is str:
        return "str"
    origin = typing.get_origin(tp)
    if origin is tuple:
        return "list[str]"
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"optional settings are not supported: {tp}")
    raise TypeError(f"unsupported setting type {tp}")


def _coerce(key: str, kind: str, value: object, source: str) -> object:
    """Check a TOML value's type (converting env strings), without range checks."""
    from_env = source.startswith("env")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if from_env and isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        raise ConfigError(key, value, "true or false", source)
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if from_env and isinstance(value, str):
            try:
                return int(value, 0)
            except ValueError:
                pass
        raise ConfigError(key, value, "an integer", source)
    if kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if from_env and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(key, value, "a number", source)
    if kind == "str":
        if isinstance(value, str):
            return value
        raise ConfigError(key, value, "a string", source)
    if kind == "list[str]":
        if from_env and isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(key, value, "a list of strings", source)
    raise AssertionError(kind)


def _check_range(key: str, spec: Spec, kind: str, value: object, source: str) -> None:
    allowed = spec.describe(kind)
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(key, value, allowed, source)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if spec.minimum is not None and value < spec.minimum:
            raise ConfigError(key, value, allowed, source)
        if spec.maximum is not None and value > spec.maximum:
            raise ConfigError(key, value, allowed, source)


C = TypeVar("C")


def _fields(cls: type[Any]) -> dict[str, tuple[Spec, str, Any]]:
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[Spec, str, Any]] = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("spec")
        if spec is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting()")
        out[f.name] = (spec, _field_kind(hints[f.name]), f.default)
    return out


def load_config(
    cls: type[C],
    *,
    path: str | os.PathLike[str] | None = None,
    text: str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> C:
    """Build ``cls`` from defaults, a TOML file or text, ``LEDGERD_*`` env and overrides.

    Raises ConfigError naming the key, the value and what is allowed; a TOML syntax
    error names the file. Environment variables that match no key of ``cls`` are
    ignored (the same environment serves bookie and client), but unknown keys in the
    file or in ``overrides`` are errors.
    """
    fields = _fields(cls)
    values: dict[str, object] = {}
    layers: list[tuple[str, Mapping[str, object], bool]] = []
    if path is not None:
        source = os.fspath(path)
        try:
            raw = Path(path).read_text()
        except OSError as exc:
            raise ConfigError("<file>", source, f"a readable TOML file ({exc.strerror})") from exc
        try:
            layers.append((source, tomllib.loads(raw), True))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("<file>", source, f"valid TOML ({exc})") from exc
    if text is not None:
        try:
            layers.append(("<text>", tomllib.loads(text), True))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("<text>", text[:40], f"valid TOML ({exc})") from exc
    environ = os.environ if env is None else env
    env_values = {
        name[len(ENV_PREFIX):].lower(): value
        for name, value in environ.items()
        if name.startswith(ENV_PREFIX) and name[len(ENV_PREFIX):].lower() in fields
    }
    layers.append(("env", env_values, False))
    if overrides:
        layers.append(("override", dict(overrides), True))

    for source, layer, strict in layers:
        for key, value in layer.items():
            if key not in fields:
                if strict:
                    known = ", ".join(sorted(fields))
                    raise ConfigError(key, value, f"a known key ({known})", source)
                continue
            spec, kind, _ = fields[key]
            src = f"env {ENV_PREFIX}{key.upper()}" if source == "env" else source
            coerced = _coerce(key, kind, value, src)
            _check_range(key, spec, kind, coerced, src)
            values[key] = coerced
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError("<combined>", values, str(exc)) from exc


def toml_value(value: object) -> str:
    """``value`` as a TOML literal (bool, number, string, or a list of those)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(value)


def defaults_toml(cls: type[Any]) -> str:
    """A commented TOML file listing every key of ``cls`` with its default."""
    lines = [f"# ledgerd {cls.__name__}: every key with its default value.", ""]
    for name, (spec, kind, default) in _fields(cls).items():
        lines.append(f"# {spec.doc}")
        lines.append(f"# BookKeeper: {spec.bk}. Allowed: {spec.describe(kind)}.")
        lines.append(f"{name} = {toml_value(default)}")
        lines.append("")
    return "\n".join(lines)


def markdown_table(cls: type[Any]) -> str:
    """The docs/configuration.md table for ``cls``."""
    rows = ["| key | BookKeeper | default | allowed | meaning |", "|---|---|---|---|---|"]
    for name, (spec, kind, default) in _fields(cls).items():
        rows.append(
            f"| `{name}` | `{spec.bk}` | `{toml_value(default)}` | "
            f"{spec.describe(kind)} | {spec.doc} |"
        )
    return "\n".join(rows)


def check_log_level(value: str) -> None:
    if value not in LOG_LEVELS:
        raise ConfigError("log_level", value, "one of " + ", ".join(LOG_LEVELS))


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """Settings of a ledgerd client (``ledgerd.open_client``)."""

    zk_servers: str = setting(
        "127.0.0.1:2181", bk="metadataServiceUri / zkServers",
        doc="ZooKeeper connection string, host:port[,host:port...][/chroot].")
    zk_timeout_ms: int = setting(
        10000, bk="zkTimeout", minimum=1000, maximum=600000,
        doc="ZooKeeper session timeout in milliseconds.")
    zk_ledgers_root_path: str = setting(
        "/ledgers", bk="zkLedgersRootPath", doc="Root znode of the cluster's metadata.")
    ensemble_size: int = setting(
        3, bk="(BookKeeper.createLedger argument)", minimum=1, maximum=1024,
        doc="Default ensemble size E for new ledgers.")
    write_quorum_size: int = setting(
        2, bk="(BookKeeper.createLedger argument)", minimum=1, maximum=1024,
        doc="Default write quorum Qw for new ledgers.")
    ack_quorum_size: int = setting(
        2, bk="(BookKeeper.createLedger argument)", minimum=1, maximum=1024,
        doc="Default ack quorum Qa for new ledgers.")
    digest_type: str = setting(
        "crc32c", bk="digestType", choices=("crc32c", "crc32", "hmac", "dummy"),
        doc="Default digest type of new ledgers.")
    add_entry_timeout_ms: int = setting(
        5000, bk="addEntryTimeoutSec", minimum=10, maximum=3600000,
        doc="An add not acknowledged by a bookie within this time triggers an ensemble change.")
    read_timeout_ms: int = setting(
        5000, bk="readTimeout", minimum=10, maximum=3600000,
        doc="A read not answered within this time moves to the next replica.")
    connect_timeout_ms: int = setting(
        10000, bk="clientConnectTimeoutMillis", minimum=10, maximum=600000,
        doc="TCP connect timeout to a bookie.")
    throttle: int = setting(
        5000, bk="throttle", minimum=0,
        doc="Maximum adds per second per ledger handle (0 = unlimited).")
    speculative_read_timeout_ms: int = setting(
        2000, bk="speculativeReadTimeout", minimum=0,
        doc="Send a read to the next replica if the first has not answered in this time (0 = off).")
    explicit_lac_interval_ms: int = setting(
        0, bk="explicitLacInterval", minimum=0,
        doc="Write the LAC explicitly to bookies when a ledger is idle this long (0 = off).")
    max_frame_bytes: int = setting(
        8 * 1024 * 1024, bk="nettyMaxFrameSizeBytes", minimum=1024, maximum=1 << 30,
        doc="Largest frame sent or accepted on a bookie connection.")
    max_inflight_per_bookie: int = setting(
        10000, bk="(ledgerd)", minimum=1,
        doc="Requests in flight on one bookie connection before sends wait.")
    reorder_read_sequence_enabled: bool = setting(
        True, bk="reorderReadSequenceEnabled",
        doc="Read first from the replicas that have failed least recently.")
    log_level: str = setting(
        "INFO", bk="(log4j level)", choices=LOG_LEVELS, doc="Logging level.")

    def __post_init__(self) -> None:
        if not (self.ensemble_size >= self.write_quorum_size >= self.ack_quorum_size >= 1):
            raise ConfigError(
                "ensemble_size/write_quorum_size/ack_quorum_size",
                (self.ensemble_size, self.write_quorum_size, self.ack_quorum_size),
                "ensemble_size >= write_quorum_size >= ack_quorum_size >= 1",
            )
