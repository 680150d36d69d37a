"""Differential harness: the census of a set of pcaps, as one implementation computes it.

`python -m tests.core.differential OUT.json PCAP=PORT ...` replays each pcap through the flow tracker
into a fresh ConnectionRegistry twice, once per request event (`tally=False`, the reference)
and once in tally mode (the serving commands' path), and writes per pcap and mode what an
operator can see: every REST listing, the /metrics exposition and the capture's counters.
tests/core/test_differential.py runs it with the compiled hot path and with
KAFKA_CENSUS_PURE_PYTHON=1 and asserts all four results equal. Imports the project the way
the CLI does (capture -> exporter), nothing from other tests.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter

from prometheus_client import CollectorRegistry, generate_latest

import capture
from capture.listeners import ListenerMap
from capture.replay import replay
from exporter.census.registry import ConnectionRegistry
from exporter.http.metrics import CensusCollector

# Series that measure this process (wall time, lock waits), not the traffic.
VOLATILE = ("kafka_census_scrape_duration_seconds", "kafka_census_registry_apply_lock_wait", "kafka_census_build_info")


def census(path: str, port: int, tally: bool, kinds: Counter) -> dict:
    """What the registry shows after a replay; `kinds` counts the events by type."""
    # A fixed clock and no age limit: nothing expires, idle times are the same in every run.
    registry = ConnectionRegistry(clock=lambda: 2e9, closed_ttl=1e12)

    def emit(ev) -> None:
        kinds[type(ev).__name__] += 1
        registry.apply(ev)

    result = replay(path, ListenerMap.parse([f"PLAINTEXT={port}"]), emit, tally=tally)
    registry.apply(result.stats)
    prom = CollectorRegistry()
    prom.register(CensusCollector(registry))
    metrics = [line for line in generate_latest(prom).decode().splitlines()
               if not line.startswith("#") and not line.startswith(VOLATILE)]
    return {
        "connections": sorted(registry.connections(), key=lambda c: c["id"]),
        "clients": registry.clients(),
        "brokers": registry.brokers(),
        "upgrade_readiness": registry.upgrade_readiness("4.0"),
        "metrics": sorted(metrics),
        "stats": dataclasses.asdict(result.stats),
        "packets": result.packets,
    }


def main(argv: list[str]) -> int:
    out, cases = argv[0], argv[1:]
    results = {"hot_path": capture.hot_path(), "native_modules": capture.native_modules(), "cases": {},
               "event_counts": {"events": Counter(), "tally": Counter()}}
    for case in cases:
        path, port = case.rsplit("=", 1)
        results["cases"][path] = {mode: census(path, int(port), mode == "tally", results["event_counts"][mode])
                                  for mode in ("events", "tally")}
    with open(out, "w") as f:
        json.dump(results, f, sort_keys=True, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
