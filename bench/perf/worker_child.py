"""One spawned worker process, as an application starts its worker: import
pgqueue's worker and the tasks, build the Worker, run it until SIGTERM.
Nothing of the benchmarks' machinery is imported (their start-up is not
the queue's).

    python -m bench.perf.worker_child URL TASK CONCURRENCY [PREFETCH]

TASK is a bench.handlers name, ``_isolated`` appended to run it isolated;
PREFETCH a number (default: the setting's).
"""

from __future__ import annotations

import sys

from bench.handlers import HANDLERS
from pgqueue import Settings
from pgqueue.worker import TaskRegistry, Worker


def main(url: str, task: str, concurrency: str, prefetch: str | None = None) -> int:
    settings = Settings(database_url=url, concurrency=int(concurrency))
    if prefetch is not None:
        settings = settings.replace(prefetch=int(prefetch))
    registry = TaskRegistry()
    isolated = task.endswith("_isolated")
    registry.add(task, HANDLERS[task.removesuffix("_isolated")], isolated=isolated)
    return Worker(registry, settings=settings).run()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
