"""Benchmarks, not tests: each runs kafka-census and a peer on the same input in the same run
and reports the ratio, with the machine noted. `make bench` runs them all.

Each benchmark is `python -m bench.NAME`: a module (bench/replay.py) or, when it has several
parts, a package whose `__main__` holds the command line (bench/proxy/, bench/live/,
bench/exporter/, bench/fingerprint_eval/). What several of them share: bench/machine.py (the
machine and its CPUs, from /proc), bench/child.py (a child process spoken to in JSON lines),
bench/runs.py (quiet rounds, medians, the results file), bench/census_process.py (kafka-census
and Tansu pinned to a core) and bench/frames.py (the requests pinged one at a time). What they
share with the tests is in harness/; nothing here imports tests/.
"""
