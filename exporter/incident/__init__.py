"""The incident CLI's engine: an HTTP client of the REST API and the terminal tables.

Talks to a sidecar or the aggregator over HTTP only: imports nothing of the census, the service
or the aggregator; its commands' parser lives in `exporter.cli.incident` (tests/test_layers.py).
"""
