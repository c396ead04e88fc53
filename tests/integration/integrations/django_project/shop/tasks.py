"""The shop's handlers: a receipt names the order it was sent for."""

from pgqueue.worker import TaskRegistry

tasks = TaskRegistry()


@tasks.task
def receipt(order: int) -> dict:
    return {"sent_for": order}
