"""The incident CLI's engine: an HTTP client of the REST API, terminal tables, and --watch.

    client.py   fetch (one GET of the REST API: an Answer or a Failure with its exit code), the
                token file, an aggregator's partial answers, the exit codes, the defaults of the
                client's settings (server, timeout, max response size)
    tables.py   the terminal tables: columns, cells, widths, cutting, fitting; each command's frame
    watch.py    --watch: the refresh loop, one screen at a time

Talks to a sidecar or the aggregator over HTTP only: imports nothing of the census, the service
or the aggregator, nor of the CLI; its commands (parsers, filters, dispatch) are
`exporter.cli.incident` (tests/layout/test_layers.py).
"""
