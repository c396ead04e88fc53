"""Build the one Settings object of a command.

Precedence, highest first: command-line flags, PGQUEUE_* environment
variables (and DATABASE_URL), the optional ``[tool.pgqueue]`` table of
./pyproject.toml, the defaults of ``Settings``.
"""

from __future__ import annotations

import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..errors import InvalidSettings
from ..settings import ENV_PREFIX, Settings

__all__ = ["load_settings", "read_pyproject"]


def load_settings(
    overrides: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    pyproject: Path | None = None,
) -> Settings:
    """Flags (``overrides``; None means not given) > environment > pyproject > defaults."""
    env = dict(os.environ if environ is None else environ)
    from_file = read_pyproject(pyproject or Path.cwd() / "pyproject.toml")
    # A file value applies only where the environment says nothing.
    layered = {name: value for name, value in from_file.items() if not _in_env(name, env)}
    layered.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return Settings.from_env(env, **layered)


def _in_env(name: str, env: Mapping[str, str]) -> bool:
    if name == "database_url" and env.get("DATABASE_URL"):
        return True
    return (ENV_PREFIX + name.upper()) in env


def read_pyproject(path: Path) -> dict[str, Any]:
    """The ``[tool.pgqueue]`` table, checked against the fields of Settings."""
    if not path.is_file():
        return {}
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidSettings(f"{path}: cannot read it: {exc}") from None
    table = document.get("tool", {}).get("pgqueue", {})
    if not isinstance(table, dict):
        raise InvalidSettings(f"{path}: [tool.pgqueue] must be a table")
    kinds = typing.get_type_hints(Settings)
    known = {f.name for f in fields(Settings)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in known:
            raise InvalidSettings(
                f"{path}: [tool.pgqueue] has an unknown setting {key!r} "
                f"(known: {', '.join(sorted(known))})"
            )
        values[name] = _coerce(f"{path}: [tool.pgqueue] {key}", kinds[name], value)
    return values


def _coerce(where: str, kind: Any, value: Any) -> Any:
    """Check a TOML value against a Settings field type (no silent conversion)."""
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, str):
            return value
    else:  # tuple[str, ...] or tuple[float, ...]
        item = typing.get_args(kind)[0]
        if isinstance(value, str) and item is str:
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list) and all(
            isinstance(v, item) or (item is float and isinstance(v, int)) for v in value
        ):
            return tuple(item(v) for v in value)
    name = getattr(kind, "__name__", None) or str(kind)
    raise InvalidSettings(f"{where}: expected {name}, got {type(value).__name__} {value!r}")
