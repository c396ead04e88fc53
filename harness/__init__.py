"""The fault harness: what the fault tests and the benchmarks both use.

    fault_tasks.py  handlers that leave evidence of every run, and the worker
                    processes (spawn, warm spares, stop) that run them
    invariants.py   the checks every fault run ends with (also a command)
    tcp_proxy.py    a loopback TCP proxy that freezes: a partition on demand
    history.py      a realistic table: finished jobs, and a live load

It belongs to neither tests/ nor bench/: both import it (see README.md).
"""
