"""Tally mode's counting: the ordinary requests and responses of one connection counted in place,
and handed over as the fields of one `RequestTally` event.

Owns: `TallyRun`, what a connection in tally mode (`KafkaConnection(tally=True)`) has counted
since its last `RequestTally`: requests per (api_key, api_version) with their bytes, responses
with their bytes, latency sum and histogram buckets (`LATENCY_BUCKETS`, `le` semantics), and
Produce requests per (acks, transactional), acks outside {-1, 0, 1} under `OTHER_ACKS`. When a
run ends (connection.py's docstring: just before any other event, at `flush_tally()` and before
`ConnectionClosed`) is the connection's decision, not this module's. Imports only `events` (for
the bucket bounds) and the standard library: no framing, no state, no event construction.

A run of requests of one kind (the same api_key, api_version, acks and transactional flag: a
producer's stream of Produce requests) is counted in two integers, the streak, and added to the
per-kind dicts only when another kind comes or the run is handed over: no tuple key and dict
update per request. A response goes straight to the counts of the last response's (api,
version) while the run lasts.
"""

from __future__ import annotations

from bisect import bisect_left

from .events import LATENCY_BUCKETS

OTHER_ACKS = 2  # a tally's key for any acks outside {-1, 0, 1}
# Not an int16: the request carries no readable acks (not a Produce, or its prefix is unreadable).
NO_ACKS = _NO_ACKS = -0x10000


class TallyRun:
    """What a connection in tally mode counted since its last `RequestTally`. The dicts are
    cleared in place, never replaced."""

    __slots__ = ("requests", "responses", "acks", "client_id", "ts", "streak_count", "streak_bytes",
                 "streak_api_key", "streak_api_version", "streak_acks", "streak_transactional",
                 "response_counts", "response_api_key", "response_api_version")

    def __init__(self) -> None:
        self._setup()

    def _setup(self) -> None:
        self.requests: dict = {}  # (api_key, api_version) -> [count, bytes]
        self.responses: dict = {}  # (api_key, api_version) -> [count, bytes, latency sum, buckets]
        self.acks: dict = {}  # (acks, transactional) -> count
        self.client_id: str | None = None  # last non-null client_id of the run
        self.ts = 0.0  # of the last request or response counted
        # The current streak of requests of one (api_key, api_version) (and for Produce, one
        # (acks, transactional)): counted in these integers, added to the dicts above when
        # another kind of request comes or the run is handed over (_add_streak).
        self.streak_count = 0
        self.streak_bytes = 0
        self.streak_api_key = 0
        self.streak_api_version = 0
        self.streak_acks = _NO_ACKS
        self.streak_transactional = False
        self.response_counts: list | None = None  # the entry of the last response's (api, version) ...
        self.response_api_key = 0  # ... which these name; None once the run is handed over
        self.response_api_version = 0

    def counted(self) -> bool:
        """Whether the run holds anything to hand over."""
        return bool(self.streak_count or self.requests or self.responses)

    def count_request(self, api_key: int, api_version: int, acks: int, transactional: bool, size: int,
                      client_id: str | None, ts: float) -> None:
        """One request; `acks` is NO_ACKS but for a Produce whose prefix was read."""
        if (api_key != self.streak_api_key or api_version != self.streak_api_version
                or acks != self.streak_acks or transactional != self.streak_transactional):
            self._add_streak()
            self.streak_api_key, self.streak_api_version = api_key, api_version
            self.streak_acks, self.streak_transactional = acks, transactional
        self.streak_count += 1
        self.streak_bytes += size
        if client_id is not None:
            self.client_id = client_id
        self.ts = ts

    def count_response(self, api_key: int, api_version: int, size: int, latency: float, ts: float) -> None:
        """One response to a request of (api_key, api_version), `latency` seconds after it."""
        counts = self.response_counts  # those of the last response's (api, version), if still in the run
        if counts is None or api_key != self.response_api_key or api_version != self.response_api_version:
            key = (api_key, api_version)
            counts = self.responses.get(key)
            if counts is None:
                counts = self.responses[key] = [0, 0, 0.0, [0] * (len(LATENCY_BUCKETS) + 1)]
            self.response_counts = counts
            self.response_api_key, self.response_api_version = api_key, api_version
        counts[0] += 1
        counts[1] += size
        counts[2] += latency
        counts[3][bisect_left(LATENCY_BUCKETS, latency)] += 1  # le semantics, as the exporter's histogram
        self.ts = ts

    def _add_streak(self) -> None:
        """Add the current streak of one kind of request to the per-kind dicts."""
        n = self.streak_count
        if not n:
            return
        key = (self.streak_api_key, self.streak_api_version)
        counts = self.requests.get(key)
        if counts is None:
            self.requests[key] = [n, self.streak_bytes]
        else:
            counts[0] += n
            counts[1] += self.streak_bytes
        if self.streak_acks != _NO_ACKS:
            acks = self.streak_acks
            # Bounded whatever the wire says: only -1, 0 and 1 mean something (ProduceRequest.json),
            # every other int16 is counted under OTHER_ACKS, as the registry labels it "other".
            key = (acks if -1 <= acks <= 1 else OTHER_ACKS, self.streak_transactional)
            self.acks[key] = self.acks.get(key, 0) + n
        self.streak_count = 0
        self.streak_bytes = 0

    def hand_over(self, conn_id: str) -> tuple:
        """End the run: the fields of its `RequestTally`, in the dataclass's order (the caller
        builds the event positionally); the next run starts empty."""
        self._add_streak()
        requests, responses, acks = self.requests, self.responses, self.acks
        # An empty part is () without a sort: a run is often one kind (a handshake's request).
        handed = (
            conn_id, self.ts, self.client_id,
            tuple(sorted([(k[0], k[1], a[0], a[1]) for k, a in requests.items()])) if requests else (),
            tuple(sorted([(k[0], k[1], a[0], a[1], tuple(a[3]), a[2]) for k, a in responses.items()]))
            if responses else (),
            tuple(sorted([(k[0], k[1], n) for k, n in acks.items()])) if acks else ())
        if requests:
            requests.clear()
        if responses:
            responses.clear()
            self.response_counts = None
        if acks:
            acks.clear()
        self.client_id = None
        return handed


def new_tally_run() -> TallyRun:
    """A TallyRun without a call to its class (compiled: a C function filling the struct)."""
    run = TallyRun.__new__(TallyRun)
    run._setup()
    return run
