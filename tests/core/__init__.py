"""Tests of the sans-IO protocol core (capture/kafka): framing, states, readers, golden frames,
properties, fuzzing, the compiled hot path, the API table.
"""
