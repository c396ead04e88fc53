"""``workers``: the workers registry, one row per worker process."""

from __future__ import annotations

from datetime import UTC, datetime

import typer
from rich.markup import escape
from rich.table import Table

from ..core import workers
from ..core.workers import WorkerRow
from . import output
from .app import app, state_of, wants_json
from .options import JsonFlag

__all__: list[str] = []


@app.command("workers")
def workers_cmd(ctx: typer.Context, json_out: JsonFlag = False) -> None:
    """Every worker process: alive or gone, where, since when, holding what.

    A worker is gone when it missed 3 heartbeats (killed, or cut off); its row
    is pruned an hour later. STALLED: alive with free slots, yet it has not
    claimed work that has waited 30 s or more.
    """
    state = state_of(ctx)
    with state.queue() as q:
        rows = q.run(workers.list_workers())
    if wants_json(ctx, json_out):
        output.emit_json({"workers": [row.to_dict() for row in rows]})
    elif not rows:
        state.out.print("no workers registered")
    else:
        state.out.print(_table(rows, datetime.now(UTC)))


def _table(rows: list[WorkerRow], now: datetime) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("worker", "state", "queues", "held", "slots", "claimed", "seen", "up"):
        table.add_column(column, justify="right" if column in ("held", "claimed") else "left")
    for row in rows:
        if not row.alive:
            status = "[red]gone[/]"
        elif row.stalled:
            status = "[bold yellow]STALLED[/]"
        elif row.hung:
            status = "[yellow]degraded[/]"
        else:
            status = "[green]alive[/]"
        table.add_row(
            escape(row.name),
            status,
            escape(",".join(row.queues)) if row.queues else "*",
            str(row.held),
            f"{row.running + row.hung}/{row.concurrency}",
            str(row.claimed),
            output.age(row.last_seen_seconds) + " ago",
            output.age((now - row.started_at).total_seconds()),
        )
    return table
