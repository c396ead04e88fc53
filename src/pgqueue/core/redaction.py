"""Payload fields kept out of sight.

``Settings.redacted_fields`` names payload fields that the dashboard, the
HTTP API and the command line show as ``"[redacted]"``: ``"password"`` (that
key of every task's payload), ``"charge:card.number"`` (the key ``number``
inside ``card``, in the payloads of the task ``charge``). A path walks JSON
objects; across an array it applies to each element. A field a payload does
not have is left alone, and the handlers always get the payload as it was
enqueued: this is about what people see, not about what is stored (see
docs/api.md, "Sensitive payloads").
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidSettings

__all__ = ["REDACTED", "TRACEBACK_HIDDEN", "Redaction"]

REDACTED = "[redacted]"
# What replaces an error's traceback for those who may not see it.
TRACEBACK_HIDDEN = "(traceback hidden: shown to admin tokens only)"
# [task:]key(.key)*: a task name as a job's, keys without dots or colons.
_FIELD = re.compile(r"^(?:(?P<task>[^:\s]{1,200}):)?(?P<path>[^.:\s]{1,200}(?:\.[^.:\s]{1,200})*)$")


@dataclass(frozen=True, slots=True)
class Redaction:
    """The redacted fields, by task (None: every task); ``tracebacks``:
    whether errors are shown whole, or only their first line (an error's
    traceback names the server's files and code: the API shows it to admin
    tokens only, unless ``api_read_tracebacks``)."""

    fields: tuple[tuple[str | None, tuple[str, ...]], ...] = ()
    tracebacks: bool = True

    @classmethod
    def of(cls, names: Sequence[str]) -> Redaction:
        """From the setting's entries; InvalidSettings names a bad one."""
        fields = []
        for name in names:
            found = _FIELD.match(name) if isinstance(name, str) else None
            if found is None:
                raise InvalidSettings(
                    f"redacted_fields: {name!r} is not [task:]key or [task:]key.key...; "
                    "for example 'password' or 'charge:card.number'"
                )
            fields.append((found["task"], tuple(found["path"].split("."))))
        return cls(tuple(fields))

    def payload(self, task: str, payload: Any) -> Any:
        """``payload`` as people may see it: a copy with the task's
        redacted fields replaced (the payload itself when none applies)."""
        paths = [path for of_task, path in self.fields if of_task in (None, task)]
        for path in paths:
            payload = _blanked(payload, path)
        return payload

    def without_tracebacks(self) -> Redaction:
        return dataclasses.replace(self, tracebacks=False)

    def error(self, text: str | None) -> str | None:
        """An attempt's error as people may see it: whole, or its first line."""
        if self.tracebacks or text is None or "\n" not in text:
            return text
        return f"{text.split(chr(10), 1)[0]}\n{TRACEBACK_HIDDEN}"


def _blanked(value: Any, path: tuple[str, ...]) -> Any:
    """``value`` with the field at ``path`` replaced, copied only along the
    way (the original is never changed)."""
    if isinstance(value, list):
        return [_blanked(item, path) for item in value]
    if not isinstance(value, dict) or path[0] not in value:
        return value
    head, rest = path[0], path[1:]
    return {**value, head: _blanked(value[head], rest) if rest else REDACTED}
