"""A job's JSON values (payload, metadata, a handler's result), written so that
they read back as they were, and read back whatever PostgreSQL holds.

``dump_json`` refuses a value nested deeper than ``MAX_JSON_DEPTH`` levels,
larger than ``MAX_JSON_BYTES``, or with a key that is not a string; every
string that reaches PostgreSQL must be valid Unicode without NUL
(``storable``). ``loads_stored`` is the other side: it reads any JSON text
PostgreSQL holds (a row written by SQL or by an older version), cutting what
lies deeper than ``MAX_READ_DEPTH`` levels, so that every reader can show it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import InvalidJob

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_READ_DEPTH",
    "TOO_DEEP",
    "dump_json",
    "json_depth_over",
    "loads_stored",
    "printable",
    "storable",
]

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
