"""What reading claimed rows costs the worker's process: the rows of
``pgqueue_jobs`` fetched on the worker's kind of cursor (pgqueue's jsonb
loader) and made into Jobs, as a claim's result is, per row.

    python -m bench.perf.row_reading [--rows 20000] [--repeats 9] [--out PATH]

For three payload shapes (an empty object, a small one of ~70 bytes, one
of ~1 KB), ROWS jobs are enqueued, then REPEATS times all their columns are
read (``SELECT *``: the claim returns ``j.*``) and made into Jobs; the
client's CPU time per row (``time.process_time``: the server's part is not
the worker's), median of the repeats. To compare two checkouts, run it from
each (``PYTHONPATH=OTHER/src:.``).

Writes results/row_reading.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg

from bench.common import bench_database, clear, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from pgqueue import Job, Queue, Settings
from pgqueue.db.driver import tuple_cursor

PAYLOADS: dict[str, dict[str, Any]] = {
    "empty": {},
    "small": {"user_id": 12345, "email": "someone@example.com", "items": [1, 2, 3]},
    "kilobyte": {"lines": [{"sku": f"SKU-{i:05d}", "qty": i, "price": 9.99} for i in range(20)]},
}
READ = "SELECT *, NULL::jsonb AS parents FROM pgqueue_jobs"


def read_seconds_per_row(url: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = tuple_cursor(conn)
        started = time.process_time()
        cur.execute(READ)
        names = [column.name for column in cur.description or ()]
        jobs = Job.from_tuples(names, cur.fetchall())
        took = time.process_time() - started
    return took / len(jobs)


def main(argv: list[str] | None = None) -> ResultRecord:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    cells: dict[str, Any] = {}
    with bench_database("row_reading") as url:
        for shape, payload in PAYLOADS.items():
            clear(url, checkpoint=False)
            with Queue(url, settings=Settings(database_url=url)) as queue:
                queue.enqueue_many([{"task": "noop", "payload": payload}] * args.rows)
            runs = [read_seconds_per_row(url) * 1e6 for _ in range(args.repeats)]
            cells[shape] = {"client_us_per_row": summary(runs)}
            print(f"{shape}: {statistics.median(runs):.2f} us a row", flush=True)
        server = server_info(url)
    record = ResultRecord(
        name="row_reading",
        command=command_line(__spec__, argv),
        server=server,
        parameters=vars(args),
        results={"payloads": cells},
    )
    path = write_result(record, args.out)
    print(f"-> {path}")
    return record


if __name__ == "__main__":
    main()
