"""``queues history NAME``: a queue's last minutes, from the per-minute
snapshots of its counters (pgqueue.history)."""

from __future__ import annotations

from datetime import UTC
from typing import Annotated

import typer
from rich.table import Table

from ..core import history
from ..core.jobs import QUEUE_NAME
from . import output
from .app import state_of, wants_json
from .options import JsonFlag
from .queues import Name, queues_app

__all__: list[str] = []


@queues_app.command("history")
def history_cmd(
    ctx: typer.Context,
    name: Name,
    minutes: Annotated[
        int,
        typer.Option(
            min=1, max=history.MAX_MINUTES, help="How many minutes, the current one last."
        ),
    ] = 60,
    json_out: JsonFlag = False,
) -> None:
    """A queue's last minutes: jobs enqueued, attempts that succeeded or failed,
    jobs dead, attempts started, and the start latency (p50, p95).

    A minute in which no worker ran shows zeros: what happened then counts in
    the last minute before it that a worker snapshotted.
    """
    if not QUEUE_NAME.fullmatch(name):
        raise typer.BadParameter(f"not a queue name: {name!r}", param_hint="'NAME'")
    state = state_of(ctx)
    with state.queue() as q:
        found = q.run(
            history.queue_history(name, minutes, q.settings.latency_buckets), transaction=True
        )
    if wants_json(ctx, json_out):
        output.emit_json(found.to_dict())
    else:
        state.out.print(_table(found))


def _table(found: history.QueueHistory) -> Table:
    table = Table(
        box=None,
        header_style="bold",
        pad_edge=False,
        title=f"queue {found.queue}: the last {found.minutes} minute(s), UTC",
        title_justify="left",
    )
    table.add_column("minute", no_wrap=True)
    for column in ("enqueued", "ok", "failed", "dead", "started", "p50", "p95"):
        table.add_column(column, justify="right", no_wrap=True)
    for point in found.points:
        table.add_row(
            point.minute.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
            str(point.enqueued),
            str(point.succeeded),
            f"[red]{point.failed}[/]" if point.failed else "0",
            f"[red]{point.dead}[/]" if point.dead else "0",
            str(point.started),
            output.age(point.latency_p50),
            output.age(point.latency_p95),
        )
    return table
