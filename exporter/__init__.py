"""Events -> registry -> {Prometheus metrics, REST API, event log}, and the command line.

May import `capture.kafka.events` and `capture.kafka.api_table` (public reference data),
never the rest of `capture`.
"""
