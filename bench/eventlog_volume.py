"""Event-log volume: bytes of event log per 1M Produce requests, schema 1 against schema 2, and
what the capture thread pays per event for each.

Input: a real produce capture, `bench/data/produce.pcap` (`python -m bench.record_produce_pcap`:
8 confluent-kafka producers, 1 KiB messages, linger 1 ms, against Tansu; its `.json` names the
broker port), replayed through the flow tracker twice: once with one event per request (the
library's default: RequestSeen, ResponseSeen, ProduceAcks per request) and once in tally mode
(what the serving commands' core hands on: RequestTally runs at each traffic sweep).

The capture holds some 50k Produce requests in ~5 s. To reach 1M it is stretched in time, not
in connections: the same connections keep producing at the captured rate. Each connection's
request traffic (RequestSeen/ResponseSeen/ProduceAcks, or RequestTally) and its TrafficUpdates
are repeated K times, shifted by K x the capture's duration; its ConnectionOpened and identity
records come once at the start and its ConnectionClosed once at the end. The streams are
generated, never held whole. Written:

* schema 1, one line per request: every event, `encode(event, schema=1)`;
* schema 1, tally runs: what the serving commands wrote before schema 2 (one RequestTally per
  connection per sweep; its volume follows time and connections, not requests);
* schema 2: the tally stream through `exporter.eventlog.rollup.rolled` at the default 60 s interval of
  event time and `encode`/`encode_rollup`, i.e. the records the serving commands' writer makes
  (checked: the real `QueuedEventLog` writer gives the same bytes for the capture as-is).

Bytes per 1M Produce requests = bytes x 1M / Produce requests in the stream. Since schema 2
grows with connections x (duration / interval), the figure depends on the request rate per
connection: it is also given for a rate 100x lower (the same traffic spread over 100x the time,
computed the same way), the case where rollups weigh most.

`--cpu`: the capture thread's cost per event of `QueuedEventLog.write` for schema 1 (encode and
queue) and schema 2 (count in place), and of the alternative for schema 2 (queue the event for
the writer thread to count: its capture-side part, a locked deque append, plus the writer's
count, which shares the same core under the GIL), on the capture's per-request and tally
streams; best of `--repeat`, all in the same run.

    python -m bench.eventlog_volume [--pcap bench/data/produce.pcap] [--cpu] [--repeat 5]

Prints a Markdown table and writes bench/results/eventlog_volume.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.machine import describe
from capture.events import (
    ConnectionClosed,
    ProduceAcks,
    RequestSeen,
    RequestTally,
    ResponseSeen,
    TrafficUpdate,
)
from capture.listeners import ListenerMap
from capture.replay import replay
from exporter.eventlog.format import encode, encode_rollup
from exporter.eventlog.queued import QueuedEventLog
from exporter.eventlog.reader import list_logs
from exporter.eventlog.rollup import DEFAULT_INTERVAL, Rollup, rolled
from exporter.eventlog.writer import EventLog

DEFAULT_PCAP = Path("bench/data/produce.pcap")
DEFAULT_OUT = Path("bench/results/eventlog_volume.json")
TARGET = 1_000_000
REPEATED = (RequestSeen, ResponseSeen, ProduceAcks, RequestTally, TrafficUpdate)


def load(pcap: Path, port: int | None) -> tuple[list, list, int]:
    if port is None:
        port = json.loads(pcap.with_suffix(pcap.suffix + ".json").read_text())["broker_port"]
    listeners = ListenerMap.parse([f"PLAINTEXT={port}"])
    per_request, tally = [], []
    replay(str(pcap), listeners, per_request.append)
    replay(str(pcap), listeners, tally.append, tally=True)
    return per_request, tally, port


def produce_requests(events) -> int:
    n = 0
    for e in events:
        if type(e) is RequestSeen and e.api_key == 0:
            n += 1
        elif type(e) is RequestTally:
            n += sum(c for k, _, c, _ in e.requests if k == 0)
    return n


def stretched(events, repeats: int, duration: float, spread: float = 1.0):
    """The events with their request traffic repeated `repeats` times (see the module
    docstring). `spread` > 1 also stretches every timestamp (a lower rate); the captured
    TrafficUpdates are then replaced by one per connection and second with traffic, the
    flow tracker's cadence."""
    from dataclasses import replace

    t0 = events[0].ts
    span = duration * spread
    last_traffic = {e.conn_id: e for e in events if type(e) is TrafficUpdate}
    second: dict[str, int] = {}

    def at(e, k):
        return replace(e, ts=t0 + (e.ts - t0) * spread + k * span)

    def out(e, k):
        if spread == 1.0:
            yield at(e, k) if k else e
            return
        if type(e) is TrafficUpdate:
            return
        e = at(e, k)
        yield e
        if type(e) in REPEATED and int(e.ts) != second.get(e.conn_id) and e.conn_id in last_traffic:
            second[e.conn_id] = int(e.ts)
            yield replace(last_traffic[e.conn_id], ts=e.ts)

    closes = []
    for e in events:
        if type(e) is ConnectionClosed:
            closes.append(e)
        else:
            yield from out(e, 0)
    for k in range(1, repeats):
        for e in events:
            if type(e) in REPEATED:
                yield from out(e, k)
    for e in closes:
        yield at(e, repeats - 1)


def emulated_tally(stream):
    """A per-request stream as the core in tally mode hands it on: one RequestTally per
    connection and second with traffic (the sweep), the other events as they come."""
    from exporter.eventlog.format import to_event
    from exporter.eventlog.rollup import record

    for item in rolled(stream, interval=1.0):
        if type(item) is not tuple:
            yield item
            continue
        conn_id, acc = item
        if acc.counted():
            yield to_event(json.loads(json.dumps(record(conn_id, acc))))
        if acc.traffic is not None:
            yield acc.traffic


def v1_bytes(stream) -> tuple[int, int]:
    size = lines = 0
    for e in stream:
        size += len(encode(e, schema=1))
        lines += 1
    return size, lines


def v2_bytes(stream) -> tuple[int, int]:
    size = lines = 0
    for item in rolled(stream, interval=DEFAULT_INTERVAL):
        size += len(encode_rollup(*item) if type(item) is tuple else encode(item))
        lines += 1
    return size, lines


def real_writer_bytes(events) -> int:
    """The serving commands' writer (QueuedEventLog with rollups, clock at event time) on the
    capture as-is."""
    with tempfile.TemporaryDirectory() as tmp:
        now = [events[0].ts]
        log = QueuedEventLog(EventLog(tmp, host="bench", clock=lambda: now[0]), rollup_seconds=DEFAULT_INTERVAL)
        for e in events:
            now[0] = e.ts
            log.write(e)
        log.close()
        assert log.dropped == 0
        return sum(os.path.getsize(p) for p in list_logs(tmp))


# --- CPU -----------------------------------------------------------------------------------------


def _time_writes(events, make, repeat: int) -> tuple[float, float]:
    """(best capture-thread seconds per event of make().write, process CPU seconds per event
    until close in that pass)."""
    best = (math.inf, math.inf)
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            log = make(tmp)
            write = log.write
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            for e in events:
                write(e)
            wall = time.perf_counter() - t0
            log.close()
            cpu = time.process_time() - cpu0
        if wall < best[0]:
            best = (wall, cpu)
    return best[0] / len(events), best[1] / len(events)


class _QueueForWriter:
    """The alternative to counting in place: `write` is QueuedEventLog.write's path for a
    traffic event if it queued the event object for the writer thread to count (the same lock,
    closing check, byte bound and wake-up); `drain` is the writer's side."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque = collections.deque()
        self._queued_bytes = 0
        self._closing = False
        self.max_queue_bytes = 1 << 40  # never full here: the cost of the path, not of drops

    def write(self, event) -> None:
        if type(event) in _TRAFFIC:
            with self._cond:
                if self._closing:
                    return
                if self._queued_bytes + 200 > self.max_queue_bytes:  # an object's estimated size
                    return
                self._queue.append(event)
                self._queued_bytes += 200
                self._cond.notify()  # the writer must count before the queue grows

    def drain(self) -> None:
        rollup = Rollup()
        add = rollup.add
        queue = self._queue
        while queue:
            add(queue.popleft())


_TRAFFIC = (RequestSeen, ResponseSeen, ProduceAcks, RequestTally)


def _time_queue_then_count(events, repeat: int) -> tuple[float, float]:
    """(capture-side seconds per event, capture side + the writer's count per event), best of
    `repeat`. Only traffic events are timed on both sides, as only they differ."""
    traffic = [e for e in events if type(e) in _TRAFFIC]
    best_queue = best_total = math.inf
    for _ in range(repeat):
        alt = _QueueForWriter()
        write = alt.write
        t0 = time.perf_counter()
        for e in traffic:
            write(e)
        t1 = time.perf_counter()
        alt.drain()
        t2 = time.perf_counter()
        best_queue = min(best_queue, t1 - t0)
        best_total = min(best_total, t2 - t0)
    return best_queue / len(traffic), best_total / len(traffic)


def _time_in_place(events, repeat: int) -> float:
    """QueuedEventLog.write's in-place path alone, on the same traffic events."""
    traffic = [e for e in events if type(e) in _TRAFFIC]
    best = math.inf
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            log = QueuedEventLog(EventLog(tmp, host="b"), rollup_seconds=60)
            write = log.write
            t0 = time.perf_counter()
            for e in traffic:
                write(e)
            best = min(best, time.perf_counter() - t0)
            log.close()
    return best / len(traffic)


def cpu_table(per_request, tally, repeat: int) -> dict:
    out = {}
    for name, events in (("per_request", per_request), ("tally", tally)):
        v1 = _time_writes(events, lambda tmp: QueuedEventLog(EventLog(tmp, host="b")), repeat)
        v2 = _time_writes(events, lambda tmp: QueuedEventLog(EventLog(tmp, host="b"), rollup_seconds=60), repeat)
        alt = _time_queue_then_count(events, repeat)
        in_place = _time_in_place(events, repeat)
        out[name] = {"events": len(events), "v1_write_us": v1[0] * 1e6, "v1_cpu_us": v1[1] * 1e6,
                     "v2_write_us": v2[0] * 1e6, "v2_cpu_us": v2[1] * 1e6, "in_place_traffic_us": in_place * 1e6,
                     "queue_for_writer_us": alt[0] * 1e6, "queue_and_count_us": alt[1] * 1e6}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pcap", type=Path, default=DEFAULT_PCAP)
    ap.add_argument("--port", type=int, help="broker port (default: from the pcap's .json)")
    ap.add_argument("--cpu", action="store_true", help="also time the capture thread's cost per event")
    ap.add_argument("--repeat", type=int, default=5, help="passes of the CPU timing; the best counts")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if not args.pcap.exists():
        print(f"error: {args.pcap} is missing; make it with `python -m bench.record_produce_pcap --out {args.pcap}`",
              file=sys.stderr)
        return 1
    per_request, tally, port = load(args.pcap, args.port)
    produce = produce_requests(per_request)
    assert produce == produce_requests(tally) > 0, "tally mode must count the same Produce requests"
    duration = per_request[-1].ts - per_request[0].ts
    connections = sum(1 for e in per_request if type(e) is ConnectionClosed)
    repeats = math.ceil(TARGET / produce)
    rows = []
    for spread in (1.0, 100.0):
        n = produce * repeats
        v1 = v1_bytes(stretched(per_request, repeats, duration, spread))
        if spread == 1.0:  # the core's own tally runs, stretched
            v1t = v1_bytes(stretched(tally, repeats, duration, spread))
            v2 = v2_bytes(stretched(tally, repeats, duration, spread))
        else:  # a run per connection and second of the slower traffic
            v1t = v1_bytes(emulated_tally(stretched(per_request, repeats, duration, spread)))
            v2 = v2_bytes(emulated_tally(stretched(per_request, repeats, duration, spread)))
        v2r = v2_bytes(stretched(per_request, repeats, duration, spread))  # the library default's events
        scale = TARGET / n
        rows.append({
            "spread": spread, "v2_from_per_request_bytes": v2r[0] * scale,
            "rate_per_connection_per_s": n / (duration * spread * repeats) / connections,
            "seconds_for_1M": duration * spread * repeats * scale, "produce_requests": n,
            "v1_per_request_bytes": v1[0] * scale, "v1_per_request_lines": v1[1] * scale,
            "v1_tally_bytes": v1t[0] * scale, "v1_tally_lines": v1t[1] * scale,
            "v2_bytes": v2[0] * scale, "v2_lines": v2[1] * scale,
        })
    as_is = {"produce_requests": produce, "seconds": duration, "connections": connections,
             "v1_per_request_bytes": v1_bytes(per_request)[0], "v1_tally_bytes": v1_bytes(tally)[0],
             "v2_bytes": v2_bytes(tally)[0], "v2_real_writer_bytes": real_writer_bytes(tally),
             "v2_real_writer_from_per_request_bytes": real_writer_bytes(per_request)}
    result = {"machine": describe(), "pcap": str(args.pcap), "as_is": as_is, "per_1M": rows}
    if args.cpu:
        result["cpu"] = cpu_table(per_request, tally, args.repeat)

    mb = 1 << 20
    print(f"{args.pcap}: {produce} Produce requests on {connections} connections in {duration:.2f} s; "
          f"machine: {result['machine']}\n")
    print(f"as captured: schema 1 per request {as_is['v1_per_request_bytes'] / 1024:,.0f} KiB, schema 1 tally "
          f"{as_is['v1_tally_bytes'] / 1024:,.1f} KiB, schema 2 {as_is['v2_bytes'] / 1024:,.1f} KiB (real writer "
          f"{as_is['v2_real_writer_bytes'] / 1024:,.1f} KiB)\n")
    print("| per 1M Produce requests | rate / connection | duration | schema 1, a line per request | "
          "schema 1, tally runs | schema 2, rollups | 1 vs 2 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        label = "captured rate" if r["spread"] == 1.0 else f"{r['spread']:.0f}x lower rate"
        print(f"| {label} "
              f"| {r['rate_per_connection_per_s']:,.0f} req/s | {r['seconds_for_1M']:,.0f} s "
              f"| {r['v1_per_request_bytes'] / mb:,.1f} MiB ({r['v1_per_request_lines']:,.0f} lines) "
              f"| {r['v1_tally_bytes'] / mb:,.2f} MiB ({r['v1_tally_lines']:,.0f} lines) "
              f"| {r['v2_bytes'] / 1024:,.1f} KiB ({r['v2_lines']:,.0f} lines; from per-request events "
              f"{r['v2_from_per_request_bytes'] / 1024:,.1f} KiB) "
              f"| {r['v1_per_request_bytes'] / r['v2_bytes']:,.0f}x |")
    if args.cpu:
        print("\n| capture thread, per event (all events; process CPU until close) | schema 1: encode + queue | "
              "schema 2: count in place |")
        print("|---|---:|---:|")
        for name, c in result["cpu"].items():
            print(f"| {name} ({c['events']:,} events) | {c['v1_write_us']:.2f} us (CPU {c['v1_cpu_us']:.2f}) "
                  f"| {c['v2_write_us']:.2f} us (CPU {c['v2_cpu_us']:.2f}) |")
        print("\n| schema 2, per traffic event | count in place (capture thread) | queue for the writer "
              "(capture thread) | queue + the writer's count (same core) |")
        print("|---|---:|---:|---:|")
        for name, c in result["cpu"].items():
            print(f"| {name} | {c['in_place_traffic_us']:.2f} us | {c['queue_for_writer_us']:.2f} us "
                  f"| {c['queue_and_count_us']:.2f} us |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
