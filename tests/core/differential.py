"""Differential harness: the census of a set of pcaps, as one implementation computes it.

`python -m tests.core.differential OUT.json PCAP=PORT ...` replays each pcap through the flow tracker
into a fresh ConnectionRegistry, once per request event (`tally=False`, the reference) and once in
tally mode (the serving commands' path), each with topics off and on (`topics=True`), and writes
per pcap and mode what an operator can see: every REST listing, the /metrics exposition and the
capture's counters; with topics on, also what the topic events said per connection (summed).
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
from capture.events import GroupMember, TopicIds, TopicUsage, TransactionalId
from capture.listeners import ListenerMap
from capture.replay import replay
from exporter.census.registry import ConnectionRegistry
from exporter.http.metrics import CensusCollector

# Series that measure this process (wall time, lock waits), not the traffic.
VOLATILE = ("kafka_census_scrape_duration_seconds", "kafka_census_registry_apply_lock_wait", "kafka_census_build_info")


def census(path: str, port: int, tally: bool, kinds: Counter, topics: bool = False) -> dict:
    """What the registry shows after a replay; `kinds` counts the events by type."""
    # A fixed clock and no age limit: nothing expires, idle times are the same in every run.
    registry = ConnectionRegistry(clock=lambda: 2e9, closed_ttl=1e12)
    told: dict = {}

    def emit(ev) -> None:
        kinds[type(ev).__name__] += 1
        registry.apply(ev)
        if isinstance(ev, (TopicUsage, TopicIds, GroupMember, TransactionalId)):
            topic_summary(told.setdefault(ev.conn_id, {"usage": {}, "dropped": 0, "unread": 0, "told": []}), ev)

    result = replay(path, ListenerMap.parse([f"PLAINTEXT={port}"]), emit, tally=tally, topics=topics)
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
        "topics": {conn: {**t, "usage": sorted([*k, *v] for k, v in t["usage"].items())} for conn, t in told.items()},
    }


def topic_summary(summary: dict, ev) -> None:
    """Per connection: TopicUsage summed (an event per frame or per run adds up alike), the others in order."""
    if isinstance(ev, TopicUsage):
        for use, name, tid, frames, nbytes in ev.usage:
            counts = summary["usage"].setdefault(f"{use} {name} {tid}", [0, 0])
            counts[0] += frames
            counts[1] += nbytes
        summary["dropped"] += ev.dropped
        summary["unread"] += ev.unread
    elif isinstance(ev, TopicIds):
        summary["told"].append(["ids", [list(pair) for pair in ev.ids], ev.dropped])
    elif isinstance(ev, GroupMember):
        summary["told"].append(["group", ev.api_key, ev.group_id, ev.member_id, ev.group_instance_id,
                                ev.protocol_type])
    else:
        summary["told"].append(["txn", ev.api_key, ev.transactional_id])


MODES = ("events", "tally", "topics-events", "topics-tally")


def main(argv: list[str]) -> int:
    out, cases = argv[0], argv[1:]
    results = {"hot_path": capture.hot_path(), "native_modules": capture.native_modules(), "cases": {},
               "event_counts": {mode: Counter() for mode in MODES}}
    for case in cases:
        path, port = case.rsplit("=", 1)
        results["cases"][path] = {mode: census(path, int(port), mode.endswith("tally"), results["event_counts"][mode],
                                               topics=mode.startswith("topics")) for mode in MODES}
    with open(out, "w") as f:
        json.dump(results, f, sort_keys=True, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
