"""The `kafka-census` commands, one module each, with what they share.

Owns nothing of its own: `exporter.cli.main` builds the parser from each command module's
`add_parser(sub)` and dispatches to its `run(args)`. Why a subpackage and not more modules in
`exporter/`: this package, exporter/cli/main.py and exporter/cli/settings.py are the composition root,
the only exporter modules that import capture's packet sources and proxy to wire them to the
registry; everything else in `exporter` takes capture's event types only (tests/layout/test_layers.py).

    options    the shared flags (serving, event log, capture), each setting's help from exporter.cli.settings
    common     exit-code errors, --http parsing and binding, the registry, flow tracker, event log
               and state file built from the settings
    output     the connection table and the summary line on stderr
    logs       the stderr log format (escaped) and --log-level
    api_table, replay, capture, proxy     the commands
(`aggregate` and the incident CLI's commands are exporter.cli.aggregate and exporter.cli.incident.)
"""
