"""What the hostile-traffic tests (tests/core/test_hostile.py, tests/core/test_hostile_flows.py)
share, and the memory tests of tests/capture borrow: `Budget`, the memory and wall-time bound
each case asserts, and frames packed by hand.

Memory is the peak of what the code under test allocated while it ran (tracemalloc; inputs built
before the measurement are not counted), time is wall time (bounds are loose: CI machines are
shared). Each case prints its figures (`pytest -s` on either module shows them).

Floods (1M frames, 200k SYNs) run too slowly under tracemalloc (x7-x14) to trace whole: they are
traced over a head window that takes every table to its bound, then untraced, then over a tail
window. Their peak is what the head window retained (the full tables) plus the tail window's own
peak (churn on top of them: dict resizes). That nothing accumulates after the head window is
checked with sys.getallocatedblocks() (`allocated_blocks`), which costs nothing per allocation.

Frames are packed by hand where kio cannot encode the hostile field (a varint of 6 bytes, a
count of 2^31-1); the layouts follow the message schemas named in capture/kafka/bodies.py.
"""

from __future__ import annotations

import gc
import struct
import sys
import time
import tracemalloc

from harness.kafka_frames import raw_request, sized

KiB, MiB = 1024, 1024 * 1024


PEAKS: dict[str, int] = {}  # case -> peak bytes (collected for the hardening report)


class Budget:
    """`with Budget(case, max_bytes=..., max_seconds=...):` traces allocations in the block and
    asserts the peak and the wall time. `under` is a footprint already in place (what an earlier
    window retained): the peak reported and bounded is `under` + this window's own. Works under
    `python -X tracemalloc` too (the peak is then taken relative to what was traced at entry)."""

    def __init__(self, case: str, *, max_bytes: int, max_seconds: float, under: int = 0) -> None:
        self.case, self.max_bytes, self.max_seconds, self.under = case, max_bytes, max_seconds, under

    def __enter__(self):
        gc.collect()
        self.was_tracing = tracemalloc.is_tracing()
        if not self.was_tracing:
            tracemalloc.start()
        tracemalloc.reset_peak()
        self.base = tracemalloc.get_traced_memory()[0]
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.seconds = time.perf_counter() - self.t0
        current, peak = tracemalloc.get_traced_memory()
        self.retained = current - self.base
        self.peak = self.under + peak - self.base
        if not self.was_tracing:
            tracemalloc.stop()
        PEAKS[self.case] = self.peak
        print(f"\n[hostile] {self.case}: peak {self.peak / KiB:,.0f} KiB (bound {self.max_bytes / KiB:,.0f} KiB), "
              f"retained {self.retained / KiB:,.0f} KiB, {self.seconds:.2f} s (bound {self.max_seconds:.0f} s)")
        if exc_type is None:
            assert self.peak <= self.max_bytes, f"{self.case}: peak {self.peak} > {self.max_bytes}"
            assert self.seconds <= self.max_seconds, f"{self.case}: {self.seconds:.1f} s > {self.max_seconds} s"
        return False


def allocated_blocks() -> int:
    gc.collect()
    return sys.getallocatedblocks()


def of(events, cls):
    return [e for e in events if isinstance(e, cls)]


# --- hand-packed frames -------------------------------------------------------------------


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


OVERLONG_VARINT = b"\xff\xff\xff\xff\xff\x01"  # 6 bytes: Kafka's unsigned varints stop at 5


def compact_string(s: bytes) -> bytes:
    return uvarint(len(s) + 1) + s


def api_versions_v3_request(corr: int, *, header_tags: bytes = b"\x00", name: bytes | None = None,
                            body_tags: bytes = b"\x00", client_id: bytes = b"hostile") -> bytes:
    """RequestHeader v2 (client_id int16 string, tags) + ApiVersionsRequest v3 body
    (ClientSoftwareName, ClientSoftwareVersion as compact strings, tags). `name` replaces the
    encoded name field whole."""
    header = struct.pack(">hhih", 18, 3, corr, len(client_id)) + client_id + header_tags
    body = (compact_string(b"census-hostile") if name is None else name) + compact_string(b"1.0") + body_tags
    return sized(header + body)


def api_versions_v3_response(corr: int, *, count: bytes | None = None, ranges=((18, 0, 3),), tags: bytes = b"\x00",
                             error_code: int = 0) -> bytes:
    """ResponseHeader v0 (always, KIP-511) + ApiVersionsResponse v3: ErrorCode, ApiKeys
    (compact array of key/min/max + tags), ThrottleTimeMs, tagged fields."""
    entries = b"".join(struct.pack(">hhh", *r) + b"\x00" for r in ranges)
    count = uvarint(len(ranges) + 1) if count is None else count
    return sized(struct.pack(">ih", corr, error_code) + count + entries + struct.pack(">i", 0) + tags)


def metadata_request(corr: int, client_id: str | None = "app-1") -> bytes:
    """Metadata v8 (header v1), whose body the core skips unread."""
    return raw_request(3, 8, corr, client_id, b"\xff\xff\xff\xff\x01\x00\x00")


def opaque_response(corr: int, body: bytes = bytes(8)) -> bytes:
    return sized(struct.pack(">i", corr) + body)
