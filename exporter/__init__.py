"""Events -> registry -> {Prometheus metrics, REST API, event log}, and the command line.

One package per part, each in a layer that imports only the layers below it (docs/architecture.md,
"The packages and their rules"; held by tests/layout/test_layers.py):

    cli          the composition root: anything (the only one to take capture's packet sources and proxy)
    service      census, eventlog, http
    aggregator   http, census.fields
    incident     http.auth
    http         census
    eventlog     census.basis
    census       nothing of the exporter
    version.py, textsafe.py: leaves every layer may use.
"""
