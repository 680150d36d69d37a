"""The packet commands' summary line on stderr (exporter.cli.output): capture health and
the protocol problems the registry counted, by kind, with wire text escaped. In-process: a real
registry fed real events, no kafka-census started."""

from __future__ import annotations

from capture.events import CaptureStats, ConnectionOpened, DecodeError, Desync, Direction
from exporter.census.registry import ConnectionRegistry
from exporter.cli.output import print_summary


def _stats(**kw) -> CaptureStats:
    fields = dict(conn_id="lo", ts=1.0, packets=10, bytes=1000, drops=(("not_listener", 2),), gaps=1, gap_bytes=5,
                  flows_open=1, flows_opened=1, flows_evicted=0, tls_flows=0, kernel_received=None,
                  kernel_dropped=None, kernel_if_dropped=None)
    return CaptureStats(**{**fields, **kw})


def _summary(capsys, registry, **kw) -> str:
    print_summary("replay", _stats(**kw), 2.0, registry)
    out = capsys.readouterr()
    assert out.out == ""
    return out.err


def test_the_summary_names_each_problem_by_kind(capsys):
    reg = ConnectionRegistry(max_closed=100, closed_ttl=float("inf"))
    reg.apply(ConnectionOpened(conn_id="c1", ts=1.0, client_address="10.0.0.1", client_port=40000,
                               broker_address="10.0.0.2", broker_port=9092, listener="PLAINTEXT",
                               security_protocol="PLAINTEXT", mid_stream=False, source="capture"))
    for kind in ("truncated", "truncated", "bad\nkind"):
        reg.apply(DecodeError(conn_id="c1", ts=1.5, direction=Direction.FROM_CLIENT, kind=kind, api_key=3,
                              api_version=12, detail="x"))
    reg.apply(Desync(conn_id="c1", ts=1.6, direction=Direction.FROM_BROKER, kind="frame_too_large", detail="y"))
    err = _summary(capsys, reg)
    assert err.count("\n") == 1, err  # one line: a kind from the wire cannot start another
    assert ("protocol problems: decode_error:bad\\nkind 1, decode_error:truncated 2, desync:frame_too_large 1\n"
            in err), err
    assert err.startswith("replay: 10 packets, 1000 bytes in 2.00 s (5 packets/s); 1 connections"), err
    assert "not decoded: not_listener 2" in err


def test_no_problems_say_none_and_kernel_drops_warn(capsys):
    err = _summary(capsys, ConnectionRegistry(), kernel_dropped=7, kernel_if_dropped=1, kernel_received=100)
    lines = err.splitlines()
    assert lines[0].endswith("protocol problems: none"), err
    assert lines[1].startswith("warning: the kernel dropped 7 packets (interface drops 1;"), err
