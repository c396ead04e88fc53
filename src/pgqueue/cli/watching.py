"""Watching the queues: ``queues`` (one table; the command is in queues.py)
and ``top`` (the same, refreshed)."""

from __future__ import annotations

import contextlib
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.live import Live

from .. import stats
from ..queue import Queue
from . import output
from .app import app, state_of, wants_json

__all__ = ["print_queues"]


def _read(q: Queue) -> tuple[dict[str, stats.QueueStats], stats.QueueStats]:
    """Every queue, and their total, from one snapshot."""
    rows = q.run(stats.per_queue(), transaction=True)
    return rows, stats.total(rows.values())


def _as_json(rows: dict[str, stats.QueueStats], total: stats.QueueStats) -> dict[str, Any]:
    return {
        "queues": [{"queue": name, **row.to_dict()} for name, row in rows.items()],
        "total": total.to_dict(),
        "window_seconds": stats.THROUGHPUT_WINDOW_SECONDS,
    }


def print_queues(ctx: typer.Context, json_out: bool) -> None:
    """The table of ``pgqueue queues`` (a group: its controls are in queues.py)."""
    state = state_of(ctx)
    with state.queue() as q:
        rows, total = _read(q)
    if wants_json(ctx, json_out):
        output.emit_json(_as_json(rows, total))
    elif not rows:
        state.out.print("no jobs yet")
    else:
        state.out.print(output.queues_table(rows, total))


@app.command("top")
def top_cmd(
    ctx: typer.Context,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between refreshes.")] = 2.0,
    iterations: Annotated[
        int | None,
        typer.Option(min=1, help="Stop after this many refreshes (default: until Ctrl-C)."),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON document per refresh (JSON lines).")
    ] = False,
) -> None:
    """The queues table, refreshing (like top). Ctrl-C leaves."""
    state = state_of(ctx)
    as_json = wants_json(ctx, json_out)
    previous: tuple[float, int] | None = None
    count = 0
    with contextlib.ExitStack() as stack:
        q = stack.enter_context(state.queue())
        live = (
            None
            if as_json
            else stack.enter_context(Live(console=state.out, auto_refresh=False, transient=False))
        )
        try:
            while True:
                rows, total = _read(q)
                now = time.monotonic()
                done = total.succeeded + total.dead
                rate = None
                if previous is not None and now > previous[0]:
                    rate = (done - previous[1]) / (now - previous[0])
                previous = (now, done)
                count += 1
                if live is None:
                    output.emit_json(
                        {**_as_json(rows, total), "at": datetime.now(UTC), "done_per_second": rate}
                    )
                else:
                    stamp = datetime.now().strftime("%H:%M:%S")
                    title = (
                        f"pgqueue top  {stamp}  "
                        + (f"{rate:.1f} jobs/s" if rate is not None else "")
                        + f"  (every {interval:g}s, Ctrl-C leaves)"
                    )
                    live.update(output.queues_table(rows, total, title=title), refresh=True)
                if iterations is not None and count >= iterations:
                    break
                time.sleep(interval)
        except KeyboardInterrupt:
            pass
