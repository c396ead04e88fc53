"""A flame graph of one default worker process draining no-op jobs.

    python -m bench.perf.profile_worker [--jobs 60000] [--out docs/img/worker_profile.svg]

Enqueues JOBS no-op jobs on a fresh server on disk (fsync on), then runs one
worker process with the default settings (concurrency 100) under py-spy
(``pip install py-spy``; it must be allowed to trace its child) until they
are drained, and writes py-spy's SVG. ``--native`` adds C frames (psycopg's,
the kernel's send). Not a result record: the SVG is the result.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from bench.common import bench_database, has_live_jobs, rate
from bench.perf.worker_throughput import ROOT
from pgqueue import Queue, Settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=60_000)
    parser.add_argument("--out", default=str(ROOT / "docs" / "img" / "worker_profile.svg"))
    parser.add_argument("--native", action="store_true")
    parser.add_argument("--format", default="flamegraph", help="py-spy's: flamegraph, raw, ...")
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or str(ROOT / ".venv" / "bin" / "py-spy")
    with bench_database("profile") as url:
        with Queue(url, settings=Settings(database_url=url)) as q:
            q.enqueue_many([{"task": "noop"}] * args.jobs)
            command = [spy, "record", "--rate", "250", "--format", args.format]
            command += ["--native"] if args.native else []
            command += ["-o", args.out, "--", sys.executable, "-m"]
            command += ["bench.perf.worker_child", url, "noop", "100"]
            proc = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
            try:
                with psycopg.connect(url, autocommit=True) as conn:
                    while has_live_jobs(conn):
                        time.sleep(0.1)
            finally:
                proc.send_signal(signal.SIGINT)  # py-spy passes it on and writes the graph
                proc.wait(timeout=120)
        # py-spy writes the command line into the graph: not the URL's password.
        out = Path(args.out)
        out.write_text(out.read_text().replace(url, "postgresql://(the benchmark database)"))
        print(f"{rate(url, args.jobs):,.0f} jobs/s under the profiler; written to {args.out}")


if __name__ == "__main__":
    main()
