"""All SQL of pgqueue, loaded from ``queries.sql`` into a dict keyed by name.

Each block in the file starts with ``-- name: <entity>_<action>``. Nothing
else in the package holds SQL, except the migrations.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import LiteralString

__all__ = ["QUERIES"]

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _load() -> dict[str, LiteralString]:
    text = files(__package__).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"query {name!r} is defined twice in queries.sql")
        # Comments stay in the file for readers; the server gets the statement.
        lines = [line for line in body.splitlines() if not line.strip().startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


QUERIES = _load()
