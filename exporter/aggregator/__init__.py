"""The aggregator: one REST API for the whole cluster, in front of the sidecars.

Owns the peers (static and DNS), the fan-out, the merge of their answers and the aggregator's
app. May import `exporter.http` (the sidecar's models, auth, bounds, health, /docs and the
page) and the census's connection fields; never the registry, the service or the CLI
(tests/test_layers.py).
"""
