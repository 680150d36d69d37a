"""Replay a pcap or pcapng file through the flow tracker, as fast as libpcap reads it.

Owns `replay()` and `ReplayResult`. Imports the packet source and the flow tracker; events go
to the caller's `emit`. Progress goes to the caller's `progress(packets, fraction)` callback at
most every `progress_every` seconds of wall time, so large files show life without slowing
small ones down.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from capture.events import CaptureStats
from capture.flows import FlowTracker
from capture.sources import PcapFile


@dataclass(frozen=True, slots=True)
class ReplayResult:
    packets: int
    bytes: int
    seconds: float  # wall time of the replay
    stats: CaptureStats
    truncated: str | None  # why the file ended early, if it did


def replay(path, listeners, emit, *, progress=None, progress_every: float = 1.0, **tracker_options) -> ReplayResult:
    source = PcapFile(path)
    tracker = FlowTracker(listeners, emit, name=str(path), **tracker_options)
    linktype = source.linktype
    started = time.perf_counter()
    next_report = started + progress_every
    read = 24  # pcap file header; per packet a 16-byte record header: an estimate for pcapng
    try:
        for buf, meta in source.batches():
            tracker.feed(linktype, buf, meta)
            read += len(buf) + len(meta)
            if progress is not None and time.perf_counter() >= next_report:
                next_report = time.perf_counter() + progress_every
                progress(tracker.packets, min(1.0, read / source.size) if source.size else 1.0)
    finally:
        source.close()
    tracker.finish()
    return ReplayResult(packets=tracker.packets, bytes=tracker.bytes, seconds=time.perf_counter() - started,
                        stats=tracker.stats(), truncated=source.truncated)
