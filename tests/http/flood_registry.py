"""A registry as the issue's flood left it, for the HTTP side's bounds: `big_registry(n)`, n
announced connections each with a distinct long client id. Used by tests/http/test_http_limits.py
and test_http_bounds.py.
"""

from __future__ import annotations

from capture.events import ClientSoftware, ConnectionOpened, RequestSeen
from exporter.census.registry import ConnectionRegistry


def big_registry(n: int, client_id_chars: int = 256) -> ConnectionRegistry:
    """`n` announced connections, each with a distinct long client id (what the issue's flood made)."""
    reg = ConnectionRegistry(max_open=n + 1)
    for i in range(n):
        cid = f"10.0.0.1:9092-10.1.{i // 250}.{i % 250}:4000-{i}"
        reg.apply(ConnectionOpened(conn_id=cid, ts=1.0, client_address=f"10.1.{i // 250}.{i % 250}", client_port=4000,
                                   broker_address="10.0.0.1", broker_port=9092, listener="PLAINTEXT",
                                   security_protocol="PLAINTEXT", mid_stream=False, source="capture"))
        reg.apply(ClientSoftware(conn_id=cid, ts=1.0, request_version=3, name="census-flood", version="1.0",
                                 valid=True, error_code=0, accepted=True))
        reg.apply(RequestSeen(conn_id=cid, ts=1.0, api_key=18, api_name="ApiVersions", api_version=3,
                              correlation_id=1, client_id=f"flood-{i:06d}-".ljust(client_id_chars, "x"), size=64))
    return reg
