"""The fingerprint recordings (tests/fixtures/fingerprints, MANIFEST.json) replayed through the
registry, for the tests of what the census makes of them (tests/census/test_java_recordings.py,
tests/census/test_go_recordings.py): each recording's events (checked clean), the registry after them,
its connections, and the verdict on a client that announces nothing. Imports the project's
capture and registry, and pytest nothing."""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

from capture.events import DecodeError, Desync, Resynced
from capture.listeners import ListenerMap
from capture.replay import replay
from exporter.census.fingerprint import range_contains
from exporter.census.registry import ConnectionRegistry

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "fingerprints"
RECORDINGS: dict[str, dict] = json.loads((HERE / "MANIFEST.json").read_text())["recordings"]


@functools.cache
def events_of(name: str, tally: bool = False) -> tuple:
    """The recording's events, replayed (`tally`: as the serving commands count requests, in runs):
    no gap, no truncation, no decode error or desync."""
    e = RECORDINGS[name]
    events: list = []
    result = replay(str(HERE / e["file"]), ListenerMap.parse([f"PLAINTEXT={e['port']}"]), events.append,
                    tally=tally)
    assert result.stats.gaps == 0 and result.truncated is None, (name, result.stats)
    assert not [ev for ev in events if isinstance(ev, (DecodeError, Desync, Resynced))], name
    return tuple(events)


def census(name: str, until: float | None = None, tally: bool = False) -> ConnectionRegistry:
    """The registry after the recording's events up to wall-clock second `until` (all: None)."""
    # Every connection is fingerprinted when due: the per-second budget is not what these test.
    reg = ConnectionRegistry(clock=lambda: 2e9, closed_ttl=1e12, max_fingerprints_per_second=10 ** 6)
    for ev in events_of(name, tally):
        if until is None or ev.ts <= until:
            reg.apply(ev)
    return reg


@functools.cache
def connections(name: str) -> tuple[dict, ...]:
    return tuple(census(name).connections())


def silent_verdicts(name: str, library: str | None = None) -> Counter:
    """Per connection of a client that announces nothing: "named" (by fingerprint, as `library`,
    the recording's own by default, with a range that holds the recorded version) or "unknown";
    anything else (another library, a range without the truth) fails."""
    e = RECORDINGS[name]
    library = library or e["library"]
    out: Counter = Counter()
    for c in connections(name):
        assert c["client_software_name"] is None and c["client_software_version"] is None, c
        inferred = c["inferred_software"]
        if inferred is None:
            out["unknown"] += 1
            continue
        assert inferred["source"] == "fingerprint", c
        assert inferred["name"] == library, c  # never another library
        assert range_contains(inferred["version_range"], e["version"]), c
        out["named"] += 1
    return out
