from pgqueue.worker import TaskRegistry

tasks = TaskRegistry()


@tasks.task
def resize(path: str, width: int) -> dict:
    return {"width": width}


@tasks.task
def boom(job) -> None:
    raise ValueError("no")
