"""What tests/ and bench/ share: real peers and the ways to drive and witness them.

* `net`: `free_port` and `wait_for` (the one poll for a condition; no fixed sleeps).
* `process`: stopping a child, the tail of its log, and PR_SET_PDEATHSIG for it.
* `census`: `Census`, the one runner of a real `kafka-census` process (any command, with
  --http, ready when /readyz or /healthz answers, stopped with SIGTERM).
* `peers`: the Tansu broker and the six real clients.
* `oracles`: tshark and tcpdump, the independent witnesses.
* `kafka_frames`: Kafka frames built with kio, independently of the capture core.

Not a test module and not shipped (setup.py packages capture, exporter, pipeline only). Imports
neither pytest nor tests/ nor bench/; oracles and kafka_frames import nothing of the project
either, so they cannot share a bug with the code they check.
"""
