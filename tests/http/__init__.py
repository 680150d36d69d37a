"""Tests of the sidecar's HTTP side: REST, models, metrics, auth, bounds, /docs, the page's
serving, Prometheus.
"""
