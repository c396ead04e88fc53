"""The checks one value of a new job passes, each also readable as JSON Schema.

``jobs.JOB_FIELDS`` puts them together into the shape of a job. Each rule's
``check`` returns the value as it is stored or raises ``InvalidJob`` naming
the field; its ``json_schema`` is the same rule for the HTTP API's OpenAPI
document. Every string that reaches PostgreSQL must be valid Unicode without
NUL: ``storable`` and ``dump_json`` check that.

A job's JSON values (payload, metadata, a handler's result) must also read
back as they were written: ``dump_json`` refuses a value nested deeper than
``MAX_JSON_DEPTH`` levels, larger than ``MAX_JSON_BYTES``, or with a key that
is not a string. ``loads_stored`` is the other side: it reads any JSON text
PostgreSQL holds (a row written by SQL or by an older version), cutting what
lies deeper than ``MAX_READ_DEPTH`` levels, so that every reader can show it.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from .errors import InvalidJob

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_READ_DEPTH",
    "TOO_DEEP",
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
    "dump_json",
    "json_depth_over",
    "loads_stored",
    "printable",
    "storable",
]

# A run_at in the past means "now"; one before this year is a mistake.
MIN_YEAR = 1970
_EARLIEST = datetime(MIN_YEAR, 1, 1, tzinfo=UTC).timestamp()

# How deep a job's JSON value may nest ({} is one level, {"a": []} two).
# PostgreSQL's jsonb takes far deeper values (about 1,500 levels under the
# default max_stack_depth), but its readers do not: Python's json gives up
# near 1,000 levels (the recursion limit), pydantic's serialiser (every answer
# of the HTTP API) at 255 levels of the answer, and common clients sooner
# (Rust's serde_json: 128). 64 is half the tightest of them, which leaves room
# for the levels an answer wraps a job in (GET /jobs: a page, a list, a job).
MAX_JSON_DEPTH = 64
# Values are read with one level more: a job with dependencies is given its
# parents' results as one array of them (the claim's ``parents`` column).
MAX_READ_DEPTH = MAX_JSON_DEPTH + 1
# A payload's or a result's largest JSON text (UTF-8 bytes). jsonb refuses a
# string or a container past 256 MiB, but only after the value has crossed
# the network, and as a statement's error; a job carries arguments, not files.
MAX_JSON_BYTES = 16 * 1024 * 1024
# What a value stored deeper than MAX_READ_DEPTH (by SQL, or by a version
# before the limit) reads back as, in place of its containers past that depth.
TOO_DEEP = f"[cut: nested deeper than {MAX_READ_DEPTH} levels]"


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


@dataclass(frozen=True, slots=True)
class Payload:
    """A JSON object, kept as its JSON text (``dump_json``: at most
    ``max_bytes`` bytes of it, UTF-8)."""

    max_bytes: int = MAX_JSON_BYTES

    def check(self, name: str, value: Any) -> str:
        if not isinstance(value, dict):
            raise InvalidJob(name, f"must be a JSON object (dict), got {type(value).__name__}")
        return dump_json(value, name, max_bytes=self.max_bytes)

    def json_schema(self) -> dict[str, Any]:
        return {"type": "object"}


# -- text PostgreSQL can store ---------------------------------------------------

# Built once: json.dumps with non-default options builds an encoder per call.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
# An escaped NUL in JSON text: \u0000 after an even number of backslashes
# (after an odd number, it is the text "\u0000" with its backslash escaped).
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_NUL = "contains a NUL character, which PostgreSQL cannot store"


def dump_json(value: Any, field: str, *, max_bytes: int = MAX_JSON_BYTES) -> str:
    """Serialise to JSON that PostgreSQL's jsonb accepts and that reads back
    as it was written, or raise InvalidJob.

    jsonb refuses NaN/Infinity, the NUL character and lone surrogates;
    json.dumps would write the first two, escape the third and pass the last,
    so all are checked here. A value too deep or too large to read back
    (``MAX_JSON_DEPTH``, ``max_bytes``) is refused, and so is a key that is
    not a string: JSON would make a string of it ({1: "a"} would come back
    as {"1": "a"}, and {1: "a", "1": "b"} as one key).
    """
    try:
        text = _ENCODER.encode(value)
    except RecursionError:  # a thousand levels deep: far past the limit
        raise InvalidJob(field, _TOO_DEEP_TO_WRITE) from None
    except (TypeError, ValueError) as exc:
        raise InvalidJob(field, f"not JSON-serialisable ({exc})") from None
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise InvalidJob(field, _NUL)
    size = _utf8_size(field, text)
    if size > max_bytes:
        raise InvalidJob(field, f"must be at most {max_bytes} bytes as JSON, got {size}")
    if json_depth_over(text, MAX_JSON_DEPTH):
        raise InvalidJob(field, _TOO_DEEP_TO_WRITE)
    if _KEY_NOT_STRING.search(text):
        _keys_are_strings(field, value)
    return text


def storable(field: str, text: str) -> None:
    """Raise InvalidJob unless PostgreSQL can store ``text`` in a text column."""
    if "\x00" in text:
        raise InvalidJob(field, _NUL)
    _utf8_size(field, text)


def _utf8_size(field: str, text: str) -> int:
    """The length of ``text`` in UTF-8, or InvalidJob if it has none."""
    # A lone surrogate such as "\ud800" (which json.loads makes of a JSON
    # escape) has no UTF-8 form, so PostgreSQL could not be sent it.
    if text.isascii():  # the common case, at C speed
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        bad = printable(exc.object[exc.start : exc.end])
        raise InvalidJob(
            field, f"contains a lone surrogate ({bad}), which is not valid Unicode text"
        ) from None


# -- how deep JSON text nests ------------------------------------------------------

_TOO_DEEP_TO_WRITE = f"must be nested at most {MAX_JSON_DEPTH} levels deep"
# The UTF-8 bytes of JSON text reduced to its brackets (both kinds as {}) and
# quotes: bytes of other characters, multi-byte ones included, are deleted.
_AS_BRACES = bytes.maketrans(b"[]", b"{}")
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'{}[]"')))


def json_depth_over(text: str, depth: int) -> bool:
    """Whether the JSON text ``text`` nests deeper than ``depth`` levels.

    Done on the text with str and bytes methods (no Python loop per value or
    per character): a text with no more opening brackets than ``depth``
    cannot nest deeper, which is every common payload. Otherwise: without its
    escaped backslashes and quotes, each quote of the text opens or closes a
    string; reduced to brackets and quotes, the strings are taken out (most
    are two quotes side by side), and each pass then takes away the innermost
    pairs of brackets, exactly one level a pass."""
    if text.count("{") + text.count("[") <= depth:
        return False
    if "\\" in text:
        text = text.replace("\\\\", "").replace('\\"', "")
    brackets = text.encode("utf-8", "surrogatepass").translate(_AS_BRACES, _NOT_STRUCTURE)
    brackets = brackets.replace(b'""', b"")  # strings without a bracket in them
    if b'"' in brackets:  # strings with one: every other piece is inside a string
        brackets = b"".join(brackets.split(b'"')[::2])
    for _ in range(depth):
        if not brackets:
            return False
        brackets = brackets.replace(b"{}", b"")
    return bool(brackets)


# A key that json.dumps wrote for a key that was not a string (1, 1.5, True,
# None) starts with a digit, a minus, or is true, false or null. (A string
# key may look the same: then the value is walked, to be sure.) In JSON text
# a quote inside a string is escaped, so '{"' and ',"' start a key or an
# array's string. (The quote first, then the look behind: re finds a literal
# first character at C speed, a character class one char at a time.)
_KEY_NOT_STRING = re.compile(r'"(?<=[{,]")(?:-?[0-9]|true"|false"|null")')


def _keys_are_strings(field: str, value: Any) -> None:
    """Raise InvalidJob naming the first key of ``value`` (at any depth) that
    is not a string. Iterative: the value is at most MAX_JSON_DEPTH deep,
    but a walk should not depend on it."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    shown = printable(repr(key)[:40])
                    raise InvalidJob(
                        field,
                        f"keys must be strings, got the {type(key).__name__} {shown} "
                        "(JSON would make a string of it)",
                    )
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)


# -- JSON text as stored -----------------------------------------------------------

# A token of JSON text as PostgreSQL writes jsonb: punctuation, a string, or
# a bare word (a number, true, false, null).
_TOKEN = re.compile(r'\s*(?:([\[\]{}:,])|("[^"\\]*(?:\\.[^"\\]*)*")|([^\s\[\]{}:,"]+))')
_DECODE = json.JSONDecoder().raw_decode


def loads_stored(text: str) -> Any:
    """The JSON value of ``text`` (jsonb as PostgreSQL writes it), however it
    was written: each container deeper than ``MAX_READ_DEPTH`` levels reads
    as the string ``TOO_DEEP``, and a number Python cannot read (more than
    sys.get_int_max_str_digits() digits) as a string saying so. For a value
    pgqueue wrote, this is json.loads, at its speed."""
    if not json_depth_over(text, MAX_READ_DEPTH):
        try:
            return _DECODE(text)[0]
        except ValueError:  # a number of 4,301 digits or more
            pass
    return _loads_cut(text)


def _loads_cut(text: str) -> Any:
    """``loads_stored`` for the rare value json.loads cannot read or readers
    could not show: one token at a time, with a stack rather than recursion."""
    containers: list[Any] = []  # the open ones, outermost first; None: one past the cut
    keys: list[Any] = []  # for each, the key waiting for its value (objects)
    done: list[Any] = []

    def put(value: Any) -> None:
        if not containers:
            done.append(value)
        elif isinstance(containers[-1], dict):
            containers[-1][keys[-1]] = value
            keys[-1] = None
        elif containers[-1] is not None:
            containers[-1].append(value)

    for match in _TOKEN.finditer(text):
        punctuation, string, word = match.groups()
        if punctuation in ("{", "["):
            cut = len(containers) >= MAX_READ_DEPTH or (containers and containers[-1] is None)
            containers.append(None if cut else {} if punctuation == "{" else [])
            keys.append(None)
        elif punctuation in ("}", "]"):
            container = containers.pop()
            keys.pop()
            put(TOO_DEEP if container is None else container)
        elif string is not None:
            value = json.loads(string)
            if containers and isinstance(containers[-1], dict) and keys[-1] is None:
                keys[-1] = value
            else:
                put(value)
        elif word is not None:
            put(_word(word))
    return done[0] if done else None


def _word(word: str) -> Any:
    try:
        return json.loads(word)
    except ValueError:
        return f"[a number of {len(word)} characters, too long to read]"


def printable(text: str) -> str:
    """``text`` with lone surrogates written as escapes, so that a message
    that quotes it can itself be printed, stored and sent as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
