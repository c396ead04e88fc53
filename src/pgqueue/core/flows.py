"""What a flow is: the I/O-free generators of transitions.py (and of
presence, schedules, bulk and stats) yield ``Statement``s and are sent
their rows; ``driver.py`` runs them."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

__all__ = ["Flow", "Row", "Statement", "db_now"]

Row = dict[str, Any]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement to run: a query name and its parameters, or for a COPY
    statement, the rows to send. With ``jobs``, the flow is sent its rows as
    ``Job`` objects instead of dicts (the statement returns whole job rows)."""

    name: str
    params: dict[str, Any]
    copy_rows: list[tuple[Any, ...]] | None = None
    jobs: bool = False


# A flow is sent a list of dict rows, or of Jobs for a ``jobs`` statement.
Flow = Generator[Statement, list[Any], T]


def db_now() -> Flow[datetime]:
    """The database's clock."""
    rows = yield Statement("db_now", {})
    now: datetime = rows[0]["now"]
    return now
