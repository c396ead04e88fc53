"""Running a transition on the caller's asyncpg connection.

Only for transactional enqueue from code that already uses asyncpg: the
statements are the same named queries, with psycopg's ``%(name)s``
placeholders turned into asyncpg's ``$n``. asyncpg returns jsonb as text, so
the JSON columns are decoded here.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, TypeVar

from .sql import QUERIES
from .transitions import Flow

T = TypeVar("T")

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")
_JSON_COLUMNS = ("payload", "result")


def is_asyncpg_connection(connection: Any) -> bool:
    return type(connection).__module__.split(".", 1)[0] == "asyncpg"


@functools.cache
def positional(name: str) -> tuple[str, tuple[str, ...]]:
    """The query ``name`` with $n placeholders, and the parameter names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return _PLACEHOLDER.sub(number, QUERIES[name]), tuple(names)


async def drive(flow: Flow[T], connection: Any) -> T:
    """Run each statement the transition yields on ``connection``."""
    try:
        statement = next(flow)
        while True:
            if statement.copy_rows is not None:
                raise TypeError("COPY statements are not run over asyncpg")
            query, names = positional(statement.name)
            records = await connection.fetch(query, *(statement.params[n] for n in names))
            statement = flow.send([_decoded(dict(record)) for record in records])
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    for column in _JSON_COLUMNS:
        if isinstance(row.get(column), str):
            row[column] = json.loads(row[column])
    return row
