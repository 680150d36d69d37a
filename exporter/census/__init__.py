"""The census: the registry of live connections and clients, and everything it decides.

Owns the connection record and its fields, the registry (events in, under one lock), the series
budget, the reads (copy, filter, order, census rows, upgrade readiness), client identity (the
identity basis, fingerprints, sibling inference) and churn. May import `capture.events` and
capture's public reference tables, and the standard library; never the HTTP, event-log,
aggregator, service or CLI packages (tests/test_layers.py).
"""
