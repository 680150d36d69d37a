"""The sans-IO Kafka protocol core: one connection's byte streams in, events out.

Public surface: `KafkaConnection`, `Direction`, `NEED_DATA`, `ProtocolError`, `Kind`, the
event classes, and the generated `API_TABLE`. Everything in this package is pure: it must
not import sockets, threads, clocks, logging, scapy, pcapy, prometheus_client, fastapi,
uvicorn or pyspark (tests/test_core_imports.py enforces it). `gen_apis` is a build tool
run by hand, not imported at run time.
"""

from .api_table import API_TABLE, ApiSpec
from .connection import KafkaConnection
from .errors import Kind, ProtocolError
from .events import (
    LATENCY_BUCKETS,
    NEED_DATA,
    ApiVersionsAnswer,
    ClientSoftware,
    ConnectionClosed,
    DecodeError,
    Desync,
    Direction,
    Event,
    GroupSeen,
    ProduceAcks,
    RequestSeen,
    RequestTally,
    ResponseSeen,
    Resynced,
    SaslHandshake,
    SaslIdentity,
    TlsDetected,
)

__all__ = [
    "API_TABLE", "ApiSpec", "KafkaConnection", "Kind", "ProtocolError", "NEED_DATA", "Direction", "Event",
    "ApiVersionsAnswer", "ClientSoftware", "ConnectionClosed", "DecodeError", "Desync", "GroupSeen",
    "LATENCY_BUCKETS", "ProduceAcks", "RequestSeen", "RequestTally", "Resynced", "ResponseSeen", "SaslHandshake", "SaslIdentity", "TlsDetected",
]
