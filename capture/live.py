"""The live capture loop: a `LiveCapture` feeding a `FlowTracker` until told to stop.

Owns `run_live()`. Runs in whichever thread calls it (the CLI's main thread, a test's worker
thread); `stop` is a threading.Event. Between batches, and at least every read timeout when
the wire is quiet, it expires idle flows and calls `tick(tracker)` so the caller can publish
health (kernel drop counters) without a second thread touching libpcap. Optionally tees every
batch into a pcap file (`PcapWriter`) so what the sidecar saw can be replayed later.
"""

from __future__ import annotations

import time

from capture.flows import FlowTracker
from capture.sources import LiveCapture


def run_live(source: LiveCapture, tracker: FlowTracker, stop, *, tick=None, tick_every: float = 1.0,
             writer=None) -> None:
    """`writer` (a PcapWriter) also gets every packet, before it is decoded."""
    linktype = source.linktype
    feed = tracker.feed
    next_tick = time.monotonic() + tick_every
    for buf, meta in source.batches(stop):
        if meta:
            if writer is not None:
                writer.write_batch(buf, meta)
            feed(linktype, buf, meta)
        now = time.monotonic()
        if now >= next_tick:
            next_tick = now + tick_every
            if not meta:  # quiet wire: packet time stands still, so use the wall clock
                tracker.expire(time.time())
            if tick is not None:
                tick(tracker)
    tracker.finish()
    if tick is not None:
        tick(tracker)
