"""The aggregator: one REST API for the whole cluster, in front of the sidecars (issue 16).

Its modules, each building only on those above it:

    defaults   the DEFAULT_* of `kafka-census aggregate`'s settings (imports nothing)
    peers      who to ask: static and DNS peers, each one's state, the peer token, PeerFailure
    cache      the answer cache and the peer failure cache
    merge      a peer's answer checked, and the answers merged: pure functions
    topics     the same for who writes and who reads each topic (merged by topic name)
    fanout     Aggregator: every peer asked at once, each answer read within its bounds
    models     the pydantic models of its answers (the sidecar's, with their peers)
    collector  its own /metrics
    app        create_app, the FastAPI application, and the background DNS and probe loop

May import `exporter.http` (the sidecar's models, query strings, auth, bounds, health, /docs and
the page) and the census's connection fields; never the registry, the service or the CLI
(tests/layout/test_layers.py). The command that runs it is exporter.cli.aggregate.

Memory, whatever the peers send (P = --peer-max-mb in bytes, I = --peer-max-items,
C = --peer-concurrency, S = --peer-parse-concurrency, K = --cache-max-mb in bytes, R = fan-outs
at once: --http-max-requests, plus the probe):

    RSS <= M0 + C x (1.125 P + 11 MiB) + S x (8 P + 300 B x I) + R x W + K

- M0, the process at rest (interpreter, FastAPI, httpx): 72 MiB measured, 100 MiB allowed.
- C x (...): an answer being read, or waiting for a parse slot, in its peer slot: its bytes
  (a bytearray grows by 1/8), what the socket read ahead of them (at most 8 MiB under uvloop,
  whose libuv reads 32 x 256 KB a wakeup before anyio pauses it), or a small answer (64 KiB at
  most) parsed on the event loop (48 bytes a byte at most: 3 MiB).
- S x (...): a large answer is decoded, parsed, checked and merged only in one of S slots, on
  S threads of its own, held until the merge is done (parsing holds the GIL: more slots only
  hold more parsed answers). In a slot: the text (P if ASCII, as the sidecar's listings are; up
  to 4 P for UTF-8 with characters past U+FFFF), its strings (up to 4 P likewise) and the
  values: at most 300 bytes of RSS a counted item (287 measured for the costliest shapes,
  one-key objects nested with distinct keys; the sidecar's 10,000-row page costs 62).
- R x W: a fan-out's merge: for connections, twice `limit` rows kept and the answer's bytes,
  ~8 KiB x limit (the bench's 10,000-row pages over 3 peers: 80 MiB); for clients, topics and
  upgrade-readiness, the union of the peers' rows. A peer adds at most I items to it.
- K: the answer cache's bytes; the peer failure cache is at most --cache-entries small entries.

Nothing outlives its slot: a failure is kept without its traceback, the read's buffer is
emptied when it fails, and the exchange's httpx.Response is unlinked from its stream (the two
refer to each other, which kept the socket's read-ahead until the cyclic GC ran).

tests/aggregator/test_aggregate_bounds.py measures VmHWM against this with a peer that streams tiny rows
and one that answers just under the item budget in the costliest shape (docs/aggregator.md).
"""
