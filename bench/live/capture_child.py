"""bench.live's capture child (`python -m bench.live --capture CORE PORT BUFFER_MB`): the CLI's
live path on lo, pinned to one core. Prints {"ready"}; "mark" starts the measured window,
"finish" (or EOF) ends it; it then drains the ring and prints its report.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import Counter

from bench.child import emit_json
from bench.live.load import GO_TIMEOUT
from bench.machine import pin

TICK = 0.05
SETTLE = 0.3  # after the generator stopped: quiet this long (and nothing left in the ring)
DRAIN_LIMIT = 60.0  # a capture still behind this long after the generator stopped gives up


def capture_main(core: int, port: int, buffer_mb: int) -> int:
    """Child: the CLI's live path on lo. Prints {"ready"}; "mark" starts the measured window,
    "finish" (or EOF) ends it; the capture then drains the ring and prints its report."""
    pin(core)
    from capture.flows import FlowTracker
    from capture.listeners import ListenerMap
    from capture.live import run_live
    from capture.sources import LiveCapture
    from exporter.census.registry import ConnectionRegistry

    listeners = ListenerMap.parse([f"PLAINTEXT={port}"])
    source = LiveCapture("lo", listeners, buffer_mb=buffer_mb)
    registry = ConnectionRegistry()
    tracker = FlowTracker(listeners, registry.apply, name="lo", tally=True)  # as the CLI's capture runs it
    stop = threading.Event()
    commands: queue.Queue[str] = queue.Queue()

    def read_commands() -> None:
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("eof")

    threading.Thread(target=read_commands, name="commands", daemon=True).start()
    st = {"mark": None, "finish": None, "done": None, "timed_out": False, "last_packets": -1, "quiet_since": None,
          "started": time.monotonic()}

    def snapshot():
        return {"t": time.monotonic(), "cpu": time.process_time(), "packets": tracker.packets}

    def tick(tr) -> None:
        now = time.monotonic()
        while not commands.empty():
            cmd = commands.get_nowait()
            if cmd == "mark" and st["mark"] is None:
                st["mark"] = snapshot()
            elif cmd in ("finish", "eof") and st["finish"] is None:
                st["finish"] = snapshot()
        if now - st["started"] > GO_TIMEOUT and st["mark"] is None:
            st["timed_out"] = True
            stop.set()
        fin = st["finish"]
        if fin is None:
            return
        if tr.packets != st["last_packets"]:
            st["last_packets"], st["quiet_since"] = tr.packets, now
        # Drained: nothing new for SETTLE (> the 50 ms ring block timeout). Not `packets ==
        # received - dropped`: on lo the kernel also counts the outgoing copy of every packet,
        # which libpcap 1.9 (bundled with pcapy-ng) discards only in user space.
        if now - st["quiet_since"] >= SETTLE and now - fin["t"] >= SETTLE:
            st["done"] = snapshot()
            stop.set()
        elif now - fin["t"] > DRAIN_LIMIT:
            st["done"] = snapshot()
            st["timed_out"] = True
            stop.set()

    emit_json({"ready": True, "bpf": source.bpf})
    try:
        run_live(source, tracker, stop, tick=tick, tick_every=TICK)
        kernel = source.kernel_stats()
    finally:
        source.close()
    by_key: Counter[int] = Counter()
    decode_errors = desyncs = 0
    records = (*registry.open.values(), *registry.closed.values())
    for rec in records:
        decode_errors += rec.decode_errors
        desyncs += rec.desyncs
        for (api_key, _v), count in rec.requests.items():
            by_key[api_key] += count
    mark, fin, done = st["mark"], st["finish"], st["done"]
    window = (fin["t"] - mark["t"]) if mark and fin else None
    import capture
    emit_json({
        "hot_path": capture.hot_path(), "packets": tracker.packets, "bytes": tracker.bytes,
        "kernel_received": kernel[0], "kernel_dropped": kernel[1], "kernel_if_dropped": kernel[2],
        "requests_decoded": sum(by_key.values()), "requests_by_api_key": dict(sorted(by_key.items())),
        "decode_errors": decode_errors, "desyncs": desyncs, "connections": len(records),
        "identified": sum(1 for r in records if r.software_name), "flow_drops": dict(tracker.drops),
        "gaps": tracker.gaps,
        "window_seconds": window,
        "window_cpu_seconds": (fin["cpu"] - mark["cpu"]) if window else None,
        "window_packets": (fin["packets"] - mark["packets"]) if window else None,
        # What was still in the ring when the generator stopped (plus the last FINs/ACKs).
        "packets_behind_at_finish": (done["packets"] - fin["packets"]) if done and fin else None,
        "drain_seconds": max(0.0, done["t"] - fin["t"] - SETTLE) if done and fin else None,
        "total_cpu_seconds": (done["cpu"] - mark["cpu"]) if done and mark else None,
        "timed_out": st["timed_out"],
    })
    return 0
