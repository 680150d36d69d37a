"""The sidecar's HTTP side: the REST app and its models, the Prometheus collector, bearer
auth, the HTTP bounds, /docs, the incident page and health.

May import `exporter.census` (what it serves), never the aggregator, the service or the CLI
(tests/layout/test_layers.py). Named after what it serves; the standard library's `http` is still
`http` inside it (absolute imports).
"""
