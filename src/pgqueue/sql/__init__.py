"""All SQL of pgqueue: ``queries.sql`` loaded into a dict keyed by name, and
the migration files of ``pgqueue/migrations``.

Each block in queries.sql starts with ``-- name: <entity>_<action>``; one
more, ``job_claim_explain``, is job_claim's EXPLAIN. Nothing else in the
package holds SQL.

A block that starts with ``-- fragment: <name>`` is lines that several
statements share (the filters of the job listings, say): a statement's line
``--> <name>`` stands for them, so that they are written once.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import LiteralString

__all__ = ["QUERIES", "READS", "migration_files", "migration_versions", "parse"]

_BLOCK = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^[ \t]*--> (\w+)[ \t]*$", re.MULTILINE)

# The files are read where pip installs them, beside this module, not through
# importlib.resources: its import and first use cost every worker process
# about 0.01 s of its start (pgqueue is never imported from a zip).
_HERE = Path(__file__).parent


def _without_comments(body: str) -> str:
    # Comments stay in the file for readers; the server gets the statement.
    return "\n".join(line for line in body.splitlines() if not line.strip().startswith("--"))


def parse(text: str) -> dict[str, LiteralString]:
    """The statements of a queries.sql text by name, fragments put in place.
    Raises RuntimeError for a name given twice, an unknown fragment, or a
    fragment that no statement uses."""
    parts = _BLOCK.split(text)
    blocks: dict[str, dict[str, str]] = {"name": {}, "fragment": {}}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        if name in blocks["name"] or name in blocks["fragment"]:
            raise RuntimeError(f"{name!r} is defined twice in queries.sql")
        blocks[kind][name] = body
    fragments = {
        name: _without_comments(body).strip("\n") for name, body in blocks["fragment"].items()
    }
    used: set[str] = set()

    def fragment(found: re.Match[str]) -> str:
        if found[1] not in fragments:
            raise RuntimeError(f"queries.sql: no fragment named {found[1]!r}")
        used.add(found[1])
        return fragments[found[1]]

    queries: dict[str, LiteralString] = {
        name: _without_comments(_INCLUDE.sub(fragment, body)).strip().rstrip(";")
        for name, body in blocks["name"].items()
    }
    if unused := sorted(fragments.keys() - used):
        raise RuntimeError(f"queries.sql: fragments no statement uses: {', '.join(unused)}")
    return queries


QUERIES = parse((_HERE / "queries.sql").read_text(encoding="utf-8"))

# The claim's plan as the planner would choose it now (EXPLAIN without
# ANALYZE: nothing runs), for the doctor's claim_plan check: the same text
# as job_claim, so that what is checked is what the worker sends.
QUERIES["job_claim_explain"] = "EXPLAIN (FORMAT JSON) " + QUERIES["job_claim"]

# What may change data: a write, a sequence, a notification, DDL, or a call
# of one of pgqueue's functions (some of which write). pgqueue_key_held
# (migration 0004) and pgqueue_error_kind (0024) are IMMUTABLE,
# pgqueue_key_lags (0042) and pgqueue_live_counts (0043) are STABLE.
_WRITES = re.compile(
    r"\b(insert|update|delete|copy|nextval|setval|pg_notify|truncate|alter|create|drop)\b"
    r"|\bpgqueue_(?!key_held\b|error_kind\b|key_lags\b|live_counts\b)\w+\s*\(",
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
    found = sorted((_HERE.parent / "migrations").glob("*.sql"), key=lambda p: p.name)
    return [(p.name.removesuffix(".sql"), p.read_text("utf-8")) for p in found]


def migration_versions() -> list[str]:
    """The versions this code expects, in order."""
    return [version for version, _ in migration_files()]
