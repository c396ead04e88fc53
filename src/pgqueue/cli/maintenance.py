"""Maintenance: ``prune`` (finished jobs past retention, now: rows of the hot
table deleted, the archive's old day partitions dropped)."""

from __future__ import annotations

from typing import Annotated

import typer

from . import output
from .app import app, state_of, wants_json
from .options import JsonFlag, option, parse_duration

__all__: list[str] = []


@app.command("prune")
def prune_cmd(
    ctx: typer.Context,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            help="Delete finished jobs older than this, e.g. 7d or 12h "
            "(default: the retention_seconds setting).",
        ),
    ] = None,
    batch: Annotated[int | None, typer.Option(min=1, help="Rows per delete.")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Delete succeeded, dead and cancelled jobs past retention, in batches, until none is left.

    The archive's day partitions wholly past retention are dropped whole
    (docs/howto/retention.md). Counters (queues, metrics) keep their totals.
    """
    state = state_of(ctx)
    retention = option(parse_duration, older_than, "--older-than") if older_than else None
    if retention is not None and retention <= 0:
        raise typer.BadParameter("must be more than 0", param_hint="'--older-than'")
    settings = state.settings(retention_seconds=retention, prune_batch=batch)
    total = 0
    with state.queue(settings) as q:
        while True:
            pruned = q.prune(settings.prune_batch)
            total += pruned
            if pruned < settings.prune_batch:
                break
        dropped = q.drop_archived()
    archived = sum(max(d.estimated_rows, 0) for d in dropped)
    if wants_json(ctx, json_out):
        output.emit_json(
            {
                "pruned": total,
                "older_than_seconds": settings.retention_seconds,
                "archive_partitions_dropped": [d.partition for d in dropped],
                "archived_jobs_dropped_estimate": archived,
            }
        )
    else:
        state.out.print(
            f"pruned {total} finished job(s) older than {output.age(settings.retention_seconds)}"
        )
        if dropped:
            state.out.print(
                f"dropped {len(dropped)} archive partition(s) "
                f"({', '.join(d.partition for d in dropped)}; about {archived} job(s))"
            )
