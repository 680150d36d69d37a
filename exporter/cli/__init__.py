"""The `kafka-census` command line: the exporter's composition root.

The only package of the exporter that may import the capture's packet sources and its proxy,
to wire them to the registry; every other package takes capture's event types and generated
reference tables only (tests/layout/test_layers.py). It may import any package of the exporter.

    main       the parser (each command module's `add_parser(sub)`) and the dispatch to its `run(args)`
    __main__   `python -m exporter.cli`
    settings   every setting declared once: its parser, default and help text; the precedence
    options    the shared flags (serving, event log, capture), each setting's help from settings
    common     exit-code errors, --http parsing and binding, the registry, flow tracker, event log
               and state file built from the settings
    output     the connection table and the summary line on stderr
    logs       the stderr log format (escaped) and --log-level
    api_table, replay, capture, proxy, aggregate   the commands, one module each
    incident   the incident CLI's commands (connections, clients, churn, upgrade-readiness)
"""
