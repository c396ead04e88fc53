"""POST /jobs against the framework's own limit, and group commit off against on.

    python -m bench.perf.api_group_commit [--requests 4000] [--clients 4]
                                          [--concurrency 8] [--rounds 5] [--out PATH]

Three uvicorn servers, each started as ``pgqueue api`` starts its app (one
process, the same uvicorn options): a no-op FastAPI POST /jobs that
validates the same JSON body and writes nothing (bench.perf.noop_api), and
``pgqueue api`` twice over one embedded PostgreSQL (fsync and
synchronous_commit on), with group commit on (the default) and off
(``api_group_commit = false``). Each round sends the same POST /jobs load
(``--clients`` processes of httpx, ``--concurrency`` requests in flight
each: bench.perf.api_enqueue's client) to each server in turn, the order
rotating from round to round; per round the rates and the ratios of the
round; medians over the rounds. Every accepted job must be in the table.

On a shared machine the clients may be the bottleneck, which brings every
ratio near 1; so each run also records the CPU time per request of the
server's process and of PostgreSQL (the postmaster and its children, from
/proc), which the machine's load does not change much.

Writes results/api_group_commit.json.
"""

from __future__ import annotations

import os
import statistics
import sys
from contextlib import ExitStack

import psycopg

from bench.common import (
    TICKS,
    bench_database,
    postmaster_pid,
    proc_stat,
    server_cpu_seconds,
    summary,
)
from bench.perf.api_enqueue import (
    api_process,
    count_jobs,
    served,
    single_load_parser,
    single_rate,
)
from bench.record import ResultRecord, command_line, server_info, write_result

SERVERS = ("noop", "group_commit", "single_commits")


def cpu_seconds(pid: int) -> float:
    """User and system CPU of a process and of its children that ended."""
    return sum(int(v) for v in proc_stat(pid)[11:15]) / TICKS


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = single_load_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    runs: dict[str, list[float]] = {name: [] for name in SERVERS}
    cpu_ms: dict[str, dict[str, list[float]]] = {
        name: {"server": [], "postgres": []} for name in SERVERS
    }
    ratios: dict[str, list[float]] = {"jobs_over_noop": [], "group_over_single": []}
    with bench_database("api-group-commit") as url, ExitStack() as stack:
        noop = [sys.executable, "-m", "bench.perf.noop_api"]
        servers = {
            "noop": stack.enter_context(served(noop, dict(os.environ))),
            "group_commit": stack.enter_context(api_process(url)),
            "single_commits": stack.enter_context(api_process(url, api_group_commit="false")),
        }
        with psycopg.connect(url) as conn:
            database = postmaster_pid(conn)
        sent = args.requests // args.clients * args.clients
        for round_ in range(args.rounds):
            order = SERVERS[round_ % 3 :] + SERVERS[: round_ % 3]
            for name in order:
                base, pid = servers[name]
                before = cpu_seconds(pid), server_cpu_seconds(database)
                rate = single_rate(base, args.requests, args.clients, args.concurrency)
                runs[name].append(rate)
                cpu_ms[name]["server"].append((cpu_seconds(pid) - before[0]) * 1000 / sent)
                used = server_cpu_seconds(database) - before[1]
                cpu_ms[name]["postgres"].append(used * 1000 / sent)
            ratios["jobs_over_noop"].append(runs["group_commit"][-1] / runs["noop"][-1])
            ratios["group_over_single"].append(
                runs["group_commit"][-1] / runs["single_commits"][-1]
            )
            print(
                f"round {round_ + 1}: "
                + ", ".join(
                    f"{name} {runs[name][-1]:.0f}/s "
                    f"(cpu {cpu_ms[name]['server'][-1]:.2f}+{cpu_ms[name]['postgres'][-1]:.2f} ms)"
                    for name in SERVERS
                )
                + ", "
                + ", ".join(f"{name} x{values[-1]:.2f}" for name, values in ratios.items())
            )
        assert count_jobs(url) == 2 * args.rounds * sent, "every accepted job must be in the table"
        info = server_info(url)
    record = ResultRecord(
        name="api_group_commit",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "servers": {
                "noop": "bench.perf.noop_api: FastAPI, same body model, writes nothing",
                "group_commit": "pgqueue api, defaults (group commit on), auth on",
                "single_commits": "pgqueue api, api_group_commit = false, auth on",
            },
            "uvicorn": "one process each, pgqueue.api.server.uvicorn_config, access log off",
            "client": "httpx.AsyncClient processes on the same machine (api_enqueue.single_rate)",
            "requests_per_run": sent,
            "client_processes": args.clients,
            "in_flight_per_process": args.concurrency,
            "rounds": args.rounds,
            "order": "rotating per round",
            "payload": '{"task": "noop", "payload": {"i": <n>}}',
            "load_average_at_end": os.getloadavg(),
        },
        results={
            "jobs_per_second": {name: summary(values) for name, values in runs.items()},
            "ratios_per_round": ratios,
            "ratio_medians": {name: statistics.median(v) for name, v in ratios.items()},
            "cpu_ms_per_request": {
                name: {part: summary(v) for part, v in parts.items()}
                for name, parts in cpu_ms.items()
            },
            "runs": runs,
        },
    )
    path = write_result(record, args.out)
    print(f"wrote {path}")
    return record


if __name__ == "__main__":
    main()
