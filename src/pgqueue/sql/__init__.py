"""All SQL of pgqueue: ``queries.sql`` loaded into a dict keyed by name, and
the migration files of ``pgqueue/migrations``.

Each block in queries.sql starts with ``-- name: <entity>_<action>``; one
more, ``job_claim_explain``, is job_claim's EXPLAIN. Nothing else in the
package holds SQL.
"""

from __future__ import annotations

import functools
import re
from importlib.resources import files
from typing import LiteralString

__all__ = ["QUERIES", "READS", "migration_files", "migration_versions"]

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

# The claim's plan as the planner would choose it now (EXPLAIN without
# ANALYZE: nothing runs), for the doctor's claim_plan check: the same text
# as job_claim, so that what is checked is what the worker sends.
QUERIES["job_claim_explain"] = "EXPLAIN (FORMAT JSON) " + QUERIES["job_claim"]

# What may change data: a write, a sequence, a notification, DDL, or a call
# of one of pgqueue's functions (some of which write). pgqueue_key_held
# (migration 0004) and pgqueue_error_kind (0024) are IMMUTABLE,
# pgqueue_key_lags (0042) is STABLE.
_WRITES = re.compile(
    r"\b(insert|update|delete|copy|nextval|setval|pg_notify|truncate|alter|create|drop)\b"
    r"|\bpgqueue_(?!key_held\b|error_kind\b|key_lags\b)\w+\s*\(",
    re.IGNORECASE,
)

# The statements that write nothing: one whose answer was lost left nothing
# written (retrying.py judges a call's outcome by them).
# An EXPLAIN without ANALYZE runs nothing, whatever it explains.
READS = frozenset(
    name
    for name, query in QUERIES.items()
    if query.startswith("EXPLAIN (FORMAT JSON) ") or not _WRITES.search(query)
)


@functools.cache
def migration_files() -> list[tuple[str, LiteralString]]:
    """(version, SQL) of every migration, in the order they apply."""
    folder = files("pgqueue").joinpath("migrations")
    found = sorted((p for p in folder.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name)
    return [(p.name.removesuffix(".sql"), p.read_text("utf-8")) for p in found]


def migration_versions() -> list[str]:
    """The versions this code expects, in order."""
    return [version for version, _ in migration_files()]
