"""Batches: ``batches show ID``, ``batches close ID``. A batch is opened by
the library (``Queue.open_batch``) or ``POST /batches``, and jobs join it
with ``batch``; these commands look at one and close it."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..core.batches import CALLBACKS, Batch
from . import output
from .app import app, state_of, wants_json
from .options import JsonFlag

__all__: list[str] = []

batches_app = typer.Typer(help="Batches (jobs with callbacks once all have ended): show, close.")
app.add_typer(batches_app, name="batches")

IdArgument = Annotated[str, typer.Argument(metavar="ID", help="The batch's id (a uuid).")]


@batches_app.command("show")
def show(ctx: typer.Context, batch_id: IdArgument, json_out: JsonFlag = False) -> None:
    """The batch's state, its jobs by state, and its callbacks."""
    _act(ctx, batch_id, "show", json_out)


@batches_app.command("close")
def close(ctx: typer.Context, batch_id: IdArgument, json_out: JsonFlag = False) -> None:
    """Close the batch: no more jobs may join; its callbacks run once its jobs have ended."""
    _act(ctx, batch_id, "close", json_out)


def _act(ctx: typer.Context, batch_id: str, action: str, json_out: bool) -> None:
    state = state_of(ctx)
    with state.queue() as q:
        batch = q.close_batch(batch_id) if action == "close" else q.get_batch(batch_id)
    if wants_json(ctx, json_out):
        output.emit_json(batch.to_dict())
        return
    counts = ", ".join(f"{n} {name}" for name, n in batch.counts.items() if n) or "no jobs"
    state.out.print(f"batch {batch.id}: {batch.state}, {batch.total} jobs ({counts})")
    state.out.print(_table(batch))


def _table(batch: Batch) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("callback", "task", "queue", "job"):
        table.add_column(name)
    for name in CALLBACKS:
        fields = batch.callbacks.get(name)
        if fields is None:
            continue
        job = batch.callback_jobs.get(name)
        table.add_row(
            name,
            escape(str(fields["task"])),
            escape(str(fields["queue"])),
            "-" if job is None else str(job),
        )
    return table
