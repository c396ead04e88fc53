"""Benchmarks and full-size fault runs; each writes results/NAME.json.

    perf/      throughput, latency, enqueue, history, maintenance costs
    faults/    workers killed, the database restarted, a long soak
    compare/   pgqueue against procrastinate and PgQueuer
    plots/     charts and Markdown tables from results/*.json
    record.py  the result record every script writes
    common.py  a database to run on; rates and latencies read back from it
    workers.py forked AsyncWorker processes with no-op handlers

README.md lists every script. The fault harness they share with the tests
is the top-level package ``harness``.
"""
