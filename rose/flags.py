"""One frozen config dataclass per service, filled from CLI flags and environment variables.

Each dataclass field carries its help text in ``field(metadata={"help": ...})``; the flag is
``--field-name`` and the environment variable ``PREFIX_FIELD_NAME``. Precedence: flag > env > default.
Torch-free: Ivy, Tulip and ROSE all build their CLIs with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import typing
from typing import Any, Mapping, Sequence, TypeVar

T = TypeVar("T")


def env_name(prefix: str, field_name: str) -> str:
    return f"{prefix}_{field_name.upper()}"


def non_finite(config: Any) -> str | None:
    """The first float field of the dataclass `config` that is NaN or infinite (NaN passes every range check, and an
    infinite wait overflows the timer it becomes), else None: each service's __post_init__ refuses it by name."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            return f.name
    return None


def _parse_value(kind: Any, raw: str) -> Any:
    origin = typing.get_origin(kind)
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if origin is typing.Union or (origin is not None and type(None) in typing.get_args(kind)):
        if raw == "" or raw.lower() == "none":
            return None
        return _parse_value(args[0], raw)
    if kind is bool:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected a boolean, got {raw!r}")
    if origin in (tuple, list):
        inner = args[0] if args else str
        parts = [p.strip() for p in raw.split(",") if p.strip()]
        values = [_parse_value(inner, p) for p in parts]
        return tuple(values) if origin is tuple else values
    if kind in (int, float, str):
        return kind(raw)
    return raw


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, prefix: str,
                         exclude: frozenset[str] = frozenset()) -> None:
    """Add one ``--flag`` per field of the config dataclass `cls` (but `exclude`); help names the env var
    and default. A bool flag alone means true (``--truncate``); it also takes a value (``--truncate false``). A
    field whose metadata has a "const" takes that value when its flag comes alone (``--warm-cores`` = on)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.name in exclude:
            continue
        kind = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)  # type: ignore[misc]
        shown = ",".join(map(str, default)) if isinstance(default, (tuple, list)) else default
        help_text = f"{f.metadata.get('help', '')} [env {env_name(prefix, f.name)}; default {shown!r}]"
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            default=None,
            metavar=f.name.upper(),
            help=help_text.replace("%", "%%"),
            **({"nargs": "?", "const": "true"} if kind is bool else
               {"nargs": "?", "const": f.metadata["const"]} if "const" in f.metadata else {}),
        )


def config_from_args(cls: type[T], args: argparse.Namespace | Mapping[str, Any] | None, prefix: str,
                     environ: Mapping[str, str] | None = None) -> T:
    """Build `cls` from parsed flags (strings), then env vars, then field defaults."""
    environ = os.environ if environ is None else environ
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        raw = given.get(f.name)
        source = "--" + f.name.replace("_", "-")
        if raw is None:
            raw = environ.get(env_name(prefix, f.name)) or None  # an empty variable counts as unset
            source = env_name(prefix, f.name)
        if raw is None:
            continue
        if not isinstance(raw, str):
            values[f.name] = raw
            continue
        try:
            values[f.name] = _parse_value(hints[f.name], raw)
        except ValueError as exc:
            raise SystemExit(f"invalid value for {source}: {exc}") from None
    return cls(**values)


def config_to_env(config: Any, prefix: str) -> dict[str, str]:
    """The env vars that reproduce `config` in a child process (used by `ivy up`)."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (tuple, list)):
            text = ",".join(map(str, value))
        else:
            text = str(value)
        out[env_name(prefix, f.name)] = text
    return out


def parse_config(cls: type[T], prefix: str, argv: Sequence[str] | None = None, description: str = "") -> T:
    parser = argparse.ArgumentParser(description=description)
    add_config_arguments(parser, cls, prefix)
    return config_from_args(cls, parser.parse_args(argv), prefix)
