"""Benchmarks and fault-injection runs. Each writes results/NAME.json."""
