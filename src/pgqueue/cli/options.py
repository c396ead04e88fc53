"""Option types and parsers shared by the commands: ``--json``, durations,
times, repeated lists."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, TypeVar

import typer

__all__ = [
    "JsonFlag",
    "LogFormatChoice",
    "option",
    "parse_duration",
    "parse_time",
    "read_json",
    "redact",
    "split",
]

T = TypeVar("T")

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")
]


class LogFormatChoice(enum.StrEnum):
    """``--log-format``: pgqueue.logs.LOG_FORMATS, as Typer's choices."""

    text = "text"
    json = "json"


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?", re.IGNORECASE)
_UNIT = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds from '90', '1.5s', '5m', '2h', '1h30m', '7d'."""
    cleaned = text.strip().replace(" ", "")
    if not cleaned:
        raise typer.BadParameter("empty duration")
    position, total = 0, 0.0
    for match in _DURATION.finditer(cleaned):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNIT[(match.group(2) or "").lower()]
        position = match.end()
    if position != len(cleaned):
        raise typer.BadParameter(f"{text!r} is not a duration (e.g. 30, 45s, 5m, 1h30m, 7d)")
    return total


def parse_time(text: str) -> datetime:
    """An ISO 8601 time with a zone (2030-01-01T09:00:00+01:00, ...Z)."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not an ISO 8601 time (e.g. 2030-01-01T09:00:00Z)"
        ) from None
    if value.tzinfo is None:
        raise typer.BadParameter(f"{text!r} has no time zone; add Z or +HH:MM")
    return value


def option(parse: Callable[[str], T], value: str, name: str) -> T:
    """``parse(value)``, with a bad value's error naming the option."""
    try:
        return parse(value)
    except typer.BadParameter as exc:
        raise typer.BadParameter(str(exc), param_hint=f"'{name}'") from None


def split(values: list[str] | None) -> list[str] | None:
    """Repeated and comma-separated values, as one list (None when none)."""
    names = [part.strip() for value in values or [] for part in value.split(",") if part.strip()]
    return names or None


def redact(url: str) -> str:
    """A URL without its password, for banners."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def read_json(text: str) -> Any:
    """json.loads, with what it cannot read at all (nested about a thousand
    levels, past Python's recursion limit; an integer of more than 4,300
    digits) as a ValueError saying so, not a traceback."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # int() refused the digits
        raise ValueError(f"a number too long to read ({exc})") from None
