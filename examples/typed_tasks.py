"""Typed tasks: the function's parameters are the payload, checked by mypy
and again at enqueue. Run a worker on them with

    pgqueue worker --handlers examples.typed_tasks:tasks

and enqueue from anywhere that can import this module:

    from examples.typed_tasks import Receipt, send_receipt
    send_receipt.enqueue(Receipt(email="ada@example.com", amount_cents=1200))
"""

from __future__ import annotations

from dataclasses import dataclass

from pgqueue.worker import TaskRegistry

tasks = TaskRegistry()


@dataclass(frozen=True)
class Receipt:
    email: str
    amount_cents: int


@tasks.task(queue="email", max_attempts=3, timeout=30)
async def send_receipt(receipt: Receipt, *, copy_to: str | None = None) -> dict[str, str]:
    """Arrives as a Receipt, though it travelled as JSON."""
    return {"sent_to": receipt.email, "copy_to": copy_to or ""}


@tasks.task(priority=5)
def resize(path: str, width: int, height: int = 0) -> dict[str, int]:
    """A plain function runs on the worker's thread pool."""
    return {"width": width, "height": height or width}
