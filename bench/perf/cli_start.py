"""How long a command of the command line takes, start to exit, as a user
types it: the interpreter, the imports, parsing the command line, one
statement, the output.

    python -m bench.perf.cli_start [--repeats 15] [--out PATH]

Each command runs REPEATS times (the commands interleaved, so that the
shared machine's drift hits all alike) against a migrated database of its
own that holds a few jobs. Per command: the wall time and the CPU time
(user and system, of the process) at the median. The parameters record
which Typer ran and whether parsing the command line imported pydantic
(Typer 0.29 does, for every parameter; pyproject.toml keeps it below).

Writes results/cli_start.json.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import resource
import subprocess
import sys
import time
from typing import Any

from bench.common import bench_database, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from pgqueue import Queue, Settings

COMMANDS = ("jobs_list", "jobs_show", "enqueue", "queues")


def command_lines(job_id: int) -> dict[str, list[str]]:
    """Each command's line; ``job_id``: a job of the database, to show."""
    return {
        "jobs_list": ["jobs", "list"],
        "jobs_show": ["jobs", "show", str(job_id)],
        "enqueue": ["enqueue", "noop", "--payload", '{"n": 1}'],
        "queues": ["queues"],
    }


PYDANTIC_PROBE = (
    "import runpy, sys; sys.argv = ['pgqueue', *sys.argv[1:]]\n"
    "try: runpy.run_module('pgqueue', run_name='__main__')\n"
    "except SystemExit: pass\n"
    "print('pydantic' in sys.modules, file=sys.__stdout__)"
)


def run_once(url: str, line: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ``pgqueue`` command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "pgqueue", "--database-url", url, *line],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def imports_pydantic(url: str) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", PYDANTIC_PROBE, "--database-url", url, "jobs", "list"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1] == "True"


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    with bench_database("cli_start") as url:
        with Queue(url, settings=Settings(database_url=url)) as queue:
            jobs = queue.enqueue_many([{"task": "noop"}] * 10)
        lines = command_lines(jobs[0].id)
        for _ in range(args.repeats):
            for name, line in lines.items():
                runs[name].append(run_once(url, line))
        pydantic = imports_pydantic(url)
        server = server_info(url)
    cells: dict[str, Any] = {}
    for name, pairs in runs.items():
        cells[name] = {
            "wall_seconds": summary([wall for wall, _ in pairs]),
            "cpu_seconds": summary([cpu for _, cpu in pairs]),
        }
        print(
            f"{name}: {cells[name]['wall_seconds']['median'] * 1000:.0f} ms wall, "
            f"{cells[name]['cpu_seconds']['median'] * 1000:.0f} ms CPU",
            flush=True,
        )
    record = ResultRecord(
        name="cli_start",
        command=command_line(__spec__, argv),
        server=server,
        parameters={
            **vars(args),
            "typer": importlib.metadata.version("typer"),
            "parsing_imports_pydantic": pydantic,
        },
        results={"commands": cells},
    )
    path = write_result(record, args.out)
    print(f"-> {path}")
    return record


if __name__ == "__main__":
    main()
