"""What the state-file tests share (test_state.py, test_state_inferred.py): a clock, the events
of numbered connections (connection n: from 10.0.1.n, port 40000 + n, to a PLAINTEXT listener at
10.0.0.5:9092), a registry fed with them, a StateKeeper over it, and the warnings a log caught
(the log is tests/census/conftest.py's `census_log`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from capture.events import ClientSoftware, ConnectionOpened, RequestSeen
from exporter.census.registry import ConnectionRegistry
from exporter.service.state import StateKeeper

IDLE = 660.0
NOW = 1_763_762_580.0


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def cid(n: int, seq: int = 1) -> str:
    return f"10.0.0.5:9092-10.0.1.{n}:{40000 + n}-{seq}"


def opened(n: int, ts: float, *, mid_stream: bool, seq: int = 1) -> ConnectionOpened:
    return ConnectionOpened(conn_id=cid(n, seq), ts=ts, client_address=f"10.0.1.{n}", client_port=40000 + n,
                            broker_address="10.0.0.5", broker_port=9092, listener="PLAINTEXT",
                            security_protocol="PLAINTEXT", mid_stream=mid_stream, source="capture")


def software(conn_id: str, ts: float, name: str | None, version: str | None, request_version: int = 3):
    return ClientSoftware(conn_id=conn_id, ts=ts, request_version=request_version, name=name, version=version,
                          valid=None if name is None else True, error_code=0, accepted=True)


def request(conn_id: str, ts: float, client_id: str = "app"):
    return RequestSeen(conn_id=conn_id, ts=ts, api_key=3, api_name="Metadata", api_version=12, correlation_id=7,
                       client_id=client_id, size=40)


def feed(reg: ConnectionRegistry, *events) -> ConnectionRegistry:
    for ev in events:
        reg.apply(ev)
    return reg


def keeper(path: Path, reg: ConnectionRegistry, clock: Clock, **kw) -> StateKeeper:
    kw.setdefault("interval", 60.0)
    kw.setdefault("idle_timeout", IDLE)
    kw.setdefault("max_entries", 1000)
    return StateKeeper(str(path), reg, clock=clock, **kw)


def warnings(log) -> list[str]:
    return [r.getMessage() for r in log.records if r.levelno >= logging.WARNING]
