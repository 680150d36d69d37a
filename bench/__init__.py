"""Benchmarks, not tests: each runs kafka-census and a peer on the same input in the same run
and reports the ratio, with the machine noted. `make bench` runs them all."""
