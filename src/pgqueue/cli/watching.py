"""Watching the queues: ``queues`` (one table; the command is in queues.py)
and ``top`` (the same, refreshed)."""

from __future__ import annotations

import contextlib
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.live import Live

from ..core import stats
from ..core.workers import list_workers
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
    """The queues table, refreshing (like top), with jobs done per second (since
    the last refresh) and the workers alive. On a narrow terminal the columns
    least needed are left out. Ctrl-C leaves."""
    state = state_of(ctx)
    as_json = wants_json(ctx, json_out)
    rates = _Rates()
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
                per_queue = rates.update(rows)
                workers = q.run(list_workers())
                alive = sum(w.alive for w in workers)
                stalled = sum(w.stalled for w in workers)
                count += 1
                if live is None:
                    output.emit_json(
                        {
                            **_as_json(rows, total),
                            "at": datetime.now(UTC),
                            "done_per_second": None
                            if per_queue is None
                            else sum(per_queue.values()),
                            "done_per_second_by_queue": per_queue,
                            "workers": {"alive": alive, "stalled": stalled},
                        }
                    )
                else:
                    title = _title(per_queue, alive, stalled, interval)
                    table = output.queues_table(
                        rows, total, title=title, rates=per_queue or {}, width=state.out.width
                    )
                    live.update(table, refresh=True)
                if iterations is not None and count >= iterations:
                    break
                time.sleep(interval)
        except KeyboardInterrupt:
            pass


class _Rates:
    """Jobs done (succeeded or dead) per second and queue, from the counter
    totals of two refreshes: nothing is read twice, whatever the history."""

    def __init__(self) -> None:
        self._last: tuple[float, dict[str, int]] | None = None

    def update(self, rows: dict[str, stats.QueueStats]) -> dict[str, float] | None:
        """The rates since the previous call (None on the first)."""
        now = time.monotonic()
        done = {name: row.succeeded + row.dead for name, row in rows.items()}
        last, self._last = self._last, (now, done)
        if last is None or now <= last[0]:
            return None
        seconds = now - last[0]
        # A queue new since then has no rate yet (its totals are not all recent).
        return {name: (n - last[1][name]) / seconds for name, n in done.items() if name in last[1]}


def _title(rates: dict[str, float] | None, alive: int, stalled: int, interval: float) -> str:
    stamp = datetime.now().strftime("%H:%M:%S")
    done = f"  {sum(rates.values()):.1f} jobs/s" if rates is not None else ""
    late = f" ([bold yellow]{stalled} stalled[/])" if stalled else ""
    return (
        f"pgqueue top  {stamp}{done}  {alive} worker{'s' * (alive != 1)}{late}"
        f"  [dim](every {interval:g}s, Ctrl-C leaves)[/]"
    )
