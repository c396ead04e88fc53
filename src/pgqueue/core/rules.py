"""The checks one value of a new job passes, each also readable as JSON Schema.

``jobs.JOB_FIELDS`` puts them together into the shape of a job. Each rule's
``check`` returns the value as it is stored or raises ``InvalidJob`` naming
the field; its ``json_schema`` is the same rule for the HTTP API's OpenAPI
document. Every string that reaches PostgreSQL must be valid Unicode without
NUL, and every JSON value must read back as it was written (json_text.py).
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

from .errors import InvalidJob
from .json_text import MAX_JSON_BYTES, dump_json, printable, storable

__all__ = [
    "BatchId",
    "Cutoff",
    "Integer",
    "JobIds",
    "Key",
    "Moment",
    "Name",
    "OneOf",
    "Payload",
    "Rule",
    "Seconds",
]

# A run_at in the past means "now"; one before this year is a mistake.
MIN_YEAR = 1970
_EARLIEST = datetime(MIN_YEAR, 1, 1, tzinfo=UTC).timestamp()


class Rule(Protocol):
    """How one field's value is checked, and the same check as JSON Schema
    (for the HTTP API's OpenAPI document)."""

    def check(self, name: str, value: Any) -> Any: ...

    def json_schema(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Name:
    """A string that matches ``pattern`` in full (ASCII only, so neither a NUL
    nor a lone surrogate can pass)."""

    pattern: re.Pattern[str]
    # Names already seen valid: bulk enqueues repeat a few names many times.
    _seen: set[str] = field(default_factory=set, compare=False, repr=False)

    def check(self, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise InvalidJob(name, f"must be a string, got {type(value).__name__}")
        if value in self._seen:
            return value
        if not self.pattern.fullmatch(value):
            raise InvalidJob(
                name,
                f"{value[:80]!r} is not a valid {name} name: it must match {self.pattern.pattern}",
            )
        if len(self._seen) < 10_000:
            self._seen.add(value)
        return value

    def json_schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": f"^{self.pattern.pattern}$"}


@dataclass(frozen=True, slots=True)
class Integer:
    """An integer from ``low`` to ``high``; a boolean is not an integer."""

    low: int
    high: int

    def check(self, name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidJob(name, f"must be an integer, got {type(value).__name__}")
        if not self.low <= value <= self.high:
            raise InvalidJob(name, f"must be between {self.low} and {self.high}, got {value}")
        return value

    def json_schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.low, "maximum": self.high}


@dataclass(frozen=True, slots=True)
class Switch:
    """A control that is on or off: true, or false / null (stored as NULL,
    as a limit that is not set)."""

    def check(self, name: str, value: Any) -> bool | None:
        if not isinstance(value, bool):
            raise InvalidJob(name, f"must be true or false, got {type(value).__name__}")
        return True if value else None

    def json_schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclass(frozen=True, slots=True)
class BatchId:
    """The id of a batch (a uuid, or its text), as a UUID."""

    def check(self, name: str, value: Any) -> UUID:
        if isinstance(value, UUID):
            return value
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return UUID(value)
        raise InvalidJob(name, f"must be a batch id (a uuid), got {printable(repr(value)[:60])}")

    def json_schema(self) -> dict[str, Any]:
        return {"type": "string", "format": "uuid"}


@dataclass(frozen=True, slots=True)
class JobIds:
    """A list of 1 to ``max_items`` job ids, kept as a tuple in the order
    given, without repeats (a job depends on another once)."""

    max_items: int

    def check(self, name: str, value: Any) -> tuple[int, ...]:
        if not isinstance(value, list | tuple) or not 1 <= len(value) <= self.max_items:
            raise InvalidJob(name, f"must be a list of 1 to {self.max_items} job ids")
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item < 2**63:
                shown = printable(repr(item)[:40])
                raise InvalidJob(name, f"must hold job ids (positive integers), got {shown}")
        return tuple(dict.fromkeys(value))

    def json_schema(self) -> dict[str, Any]:
        return {
            "type": "array",
            "items": {"type": "integer", "minimum": 1},
            "minItems": 1,
            "maxItems": self.max_items,
        }


@dataclass(frozen=True, slots=True)
class Seconds:
    """A finite number of seconds (or a timedelta) up to ``high``: at least
    ``low``, or more than ``low`` when ``exclusive_low``."""

    low: float
    high: float
    exclusive_low: bool = False

    def check(self, name: str, value: Any) -> float:
        if hasattr(value, "total_seconds"):
            value = value.total_seconds()
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidJob(name, f"must be a number of seconds, got {type(value).__name__}")
        too_low = value <= self.low if self.exclusive_low else value < self.low
        if not math.isfinite(value) or too_low or value > self.high:
            bound = "more than" if self.exclusive_low else "at least"
            raise InvalidJob(
                name, f"must be {bound} {self.low:g} and at most {self.high:g} seconds, got {value}"
            )
        return float(value)

    def json_schema(self) -> dict[str, Any]:
        low = "exclusiveMinimum" if self.exclusive_low else "minimum"
        return {"type": "number", low: self.low, "maximum": self.high}


# RFC 3339, the JSON Schema "date-time" format; the zone is checked apart,
# for a clearer error.
_RFC3339 = re.compile(
    r"\d{4}-\d\d-\d\d[Tt]\d\d:\d\d:\d\d(\.\d+)?(?P<zone>[Zz]|[+-]\d\d:\d\d)?", re.ASCII
)


@dataclass(frozen=True, slots=True)
class Moment:
    """A time with a zone (a datetime, or an RFC 3339 string), from 1970 up
    to ``max_ahead`` seconds from now. Earlier than now means now."""

    max_ahead: float

    def check(self, name: str, value: Any) -> datetime:
        if isinstance(value, str):
            value = self._parse(name, value)
        if not isinstance(value, datetime):
            raise InvalidJob(name, f"must be a datetime, got {type(value).__name__}")
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidJob(name, "must have a time zone (a naive datetime is ambiguous)")
        try:
            seconds = value.timestamp()
        except (OverflowError, ValueError):
            seconds = -math.inf
        if not _EARLIEST <= seconds <= time.time() + self.max_ahead:
            raise InvalidJob(
                name,
                f"must be after {MIN_YEAR}-01-01 and at most {self.max_ahead:g} seconds from now",
            )
        return value

    @staticmethod
    def _parse(name: str, text: str) -> datetime:
        match = _RFC3339.fullmatch(text)
        if match is not None and not match["zone"]:
            raise InvalidJob(name, "must have a time zone, e.g. 2030-01-01T09:00:00Z")
        parsed = None
        if match is not None:
            with contextlib.suppress(ValueError):  # a day that does not exist: 2030-02-30
                parsed = datetime.fromisoformat(text.upper())
        if parsed is None:
            raise InvalidJob(
                name, f"{text[:40]!r} is not an ISO 8601 time, e.g. 2030-01-01T09:00:00Z"
            )
        return parsed

    def json_schema(self) -> dict[str, Any]:
        return {"type": "string", "format": "date-time"}


@dataclass(frozen=True, slots=True)
class Key:
    """A string of 1 to ``max_length`` characters that PostgreSQL can store."""

    max_length: int

    def check(self, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise InvalidJob(name, f"must be a string, got {type(value).__name__}")
        if not 1 <= len(value) <= self.max_length:
            raise InvalidJob(name, f"must be 1 to {self.max_length} characters")
        storable(name, value)
        return value

    def json_schema(self) -> dict[str, Any]:
        return {
            "type": "string",
            "minLength": 1,
            "maxLength": self.max_length,
            "pattern": r"^[^\x00]+$",
        }


@dataclass(frozen=True, slots=True)
class OneOf:
    """One of a few strings."""

    values: tuple[str, ...]

    def check(self, name: str, value: Any) -> str:
        if not isinstance(value, str) or value not in self.values:
            shown = printable(repr(value)[:40])
            raise InvalidJob(name, f"must be one of {', '.join(self.values)}, got {shown}")
        return value

    def json_schema(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.values)}


@dataclass(frozen=True, slots=True)
class Cutoff:
    """A moment (as ``Moment``), or an age: a number of seconds (or a
    timedelta) before now, kept as a timedelta so that the database's clock
    turns it into a moment."""

    max_seconds: float

    def check(self, name: str, value: Any) -> datetime | timedelta:
        if isinstance(value, int | float | timedelta) and not isinstance(value, bool):
            return timedelta(seconds=Seconds(0.0, self.max_seconds).check(name, value))
        return Moment(self.max_seconds).check(name, value)

    def json_schema(self) -> dict[str, Any]:
        return {
            "anyOf": [
                Moment(self.max_seconds).json_schema(),
                {**Seconds(0.0, self.max_seconds).json_schema(), "description": "seconds ago"},
            ]
        }


# The top-level key of an encrypted payload's envelope (core/sealing.py):
# a job's own payload may not have it, or the worker would try to open it.
SEALED_KEY = "pgqueue:sealed"


@dataclass(frozen=True, slots=True)
class Payload:
    """A JSON object, kept as its JSON text (``dump_json``: at most
    ``max_bytes`` bytes of it, UTF-8); ``reserved``: top-level keys refused."""

    max_bytes: int = MAX_JSON_BYTES
    reserved: tuple[str, ...] = ()

    def check(self, name: str, value: Any) -> str:
        if not isinstance(value, dict):
            raise InvalidJob(name, f"must be a JSON object (dict), got {type(value).__name__}")
        for key in self.reserved:
            if key in value:
                raise InvalidJob(f"{name}.{key}", "this key is reserved for pgqueue's own use")
        return dump_json(value, name, max_bytes=self.max_bytes)

    def json_schema(self) -> dict[str, Any]:
        return {"type": "object"}


# -- text PostgreSQL can store ---------------------------------------------------
