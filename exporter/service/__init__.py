"""The serving process: the registry, the capture or proxy, the HTTP server and the event
log wired in one process, and the state file that carries identity over a restart.

May import the census, the event log and the HTTP package; never the CLI (tests/layout/test_layers.py).
"""
