"""Settings machinery: frozen dataclasses loaded from TOML, environment and flags.

The ground floor under every package that has settings (bookie, client, gateway); it
knows nothing of any of them.

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
import difflib
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ledgerd.base.errors import LedgerdError

__all__ = [
    "LOG_LEVELS",
    "ConfigError",
    "Spec",
    "check_log_level",
    "defaults_toml",
    "load_config",
    "markdown_table",
    "setting",
    "toml_value",
]

ENV_PREFIX = "LEDGERD_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ConfigError(LedgerdError, ValueError):
    """A configuration value was unknown, of the wrong type or out of range."""

    def __init__(self, key: str, value: object, allowed: str, source: str = "") -> None:
        self.key = key
        self.value = value
        self.allowed = allowed
        self.source = source
        self.problems: list[ConfigError] = [self]
        where = f" (from {source})" if source else ""
        super().__init__(f"config key {key!r}{where}: got {value!r}; allowed: {allowed}")

    @classmethod
    def several(cls, problems: list[ConfigError]) -> ConfigError:
        """One error reporting every problem found (the first's key and value)."""
        if len(problems) == 1:
            return problems[0]
        first = problems[0]
        err = cls(first.key, first.value, first.allowed, first.source)
        err.problems = list(problems)
        err.args = (f"{len(problems)} config problems: "
                    + "; ".join(str(p) for p in problems),)
        return err


# BookKeeper names pasted into a ledgerd file (``bookiePort = 3181``) are accepted for
# their snake_case keys; each use is noted here (and logged by the bookie at start).
alias_notes: list[str] = []


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

        def num(v: float) -> str:
            return str(int(v)) if kind == "int" else f"{v:g}"
        if self.minimum is not None and self.maximum is not None:
            parts.append(f"between {num(self.minimum)} and {num(self.maximum)}")
        elif self.minimum is not None:
            parts.append(f">= {num(self.minimum)}")
        elif self.maximum is not None:
            parts.append(f"<= {num(self.maximum)}")
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

    aliases = {spec.bk: name for name, (spec, _kind, _d) in fields.items()
               if spec.bk.isidentifier()}
    problems: list[ConfigError] = []
    for source, layer, strict in layers:
        for key, value in layer.items():
            if key not in fields and key in aliases and strict:
                note = f"{source}: BookKeeper's {key!r} read as {aliases[key]!r}"
                if note not in alias_notes:
                    alias_notes.append(note)
                key = aliases[key]
            if key not in fields:
                if strict:
                    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
                    hint = (f"did you mean {close[0]!r}?" if close else
                            "a known key (`ledgerd config --defaults` lists them)")
                    problems.append(ConfigError(key, value, hint, source))
                continue
            spec, kind, _ = fields[key]
            src = f"env {ENV_PREFIX}{key.upper()}" if source == "env" else source
            try:
                coerced = _coerce(key, kind, value, src)
                _check_range(key, spec, kind, coerced, src)
            except ConfigError as exc:
                problems.append(exc)
                continue
            values[key] = coerced
    if problems:
        raise ConfigError.several(problems)
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
