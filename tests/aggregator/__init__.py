"""Tests of the aggregator: peers, fan-out, merge, bounds, and a real cluster behind it."""
