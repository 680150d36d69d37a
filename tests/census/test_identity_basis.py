"""The identity basis (exporter/census/basis.py) is written once: the registry, its identity
resolver, the fingerprint, the event log's rollup and the pipeline take it from there (they used
to restate it, held equal by tests), and the registry and the rollup fold a connection's first
requests by its one rule, at its sync points.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from capture.events import (
    ApiVersionsAnswer,
    ClientSoftware,
    ConnectionClosed,
    ConnectionOpened,
    DecodeError,
    Desync,
    Direction,
    RequestSeen,
    RequestTally,
    SaslHandshake,
    SaslIdentity,
    TlsDetected,
    TrafficUpdate,
)
from exporter.census import basis, fingerprint, identity
from exporter.census.basis import BASIS_SYNC, MAX_FIRST_REQUESTS, fold_first_requests
from exporter.census.registry import ConnectionRegistry
from exporter.eventlog import rollup
from exporter.eventlog.rollup import Rollup

ROOT = Path(__file__).resolve().parents[2]
# The basis's names, and the names its restatements had (the pipeline's, the fingerprint's).
BASIS_NAMES = {"MAX_FIRST_REQUESTS", "BASIS_SYNC", "DEFAULT_SIBLING_WINDOW", "SIBLING_CONFIDENCE",
               "FINGERPRINT_THRESHOLD", "THRESHOLD", "DEFAULT_WINDOW", "ANNOUNCED_SIBLING_CONFIDENCE"}
# Its users, each taking (some of) it from exporter.census.basis.
USERS = {"exporter/census/registry.py", "exporter/census/identity.py", "exporter/census/fingerprint.py",
         "exporter/eventlog/rollup.py", "pipeline/identity.py"}


def _module_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
    return names


def test_the_basis_is_defined_in_one_module_and_taken_from_it():
    """No module of the exporter or the pipeline but the basis defines (restates) its constants
    or FingerprintBasis, and each of their users imports them from exporter.census.basis."""
    restated = {}
    importers = set()
    for package in ("exporter", "pipeline"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text())
            if rel != "exporter/census/basis.py":
                found = _module_level_names(tree) & (BASIS_NAMES | {"FingerprintBasis"})
                if found:
                    restated[rel] = found
            if any(isinstance(n, ast.ImportFrom) and n.module == "exporter.census.basis" for n in ast.walk(tree)) \
                    or any(isinstance(n, ast.ImportFrom) and n.module == "exporter.census"
                           and any(a.name == "basis" for a in n.names) for n in ast.walk(tree)):
                importers.add(rel)
    assert restated == {}
    assert USERS <= importers


def test_the_users_hold_the_basis_itself():
    """The values the registry, the resolver, the fingerprint and the rollup work with are the
    basis's own objects (and the registry bounds a fingerprint's candidates by the fingerprint's)."""
    assert rollup.MAX_FIRST_REQUESTS is fingerprint.MAX_FIRST_REQUESTS is basis.MAX_FIRST_REQUESTS == 8
    assert rollup.BASIS_SYNC is basis.BASIS_SYNC
    assert fingerprint.FINGERPRINT_THRESHOLD is basis.FINGERPRINT_THRESHOLD == 0.75
    assert identity.SIBLING_CONFIDENCE is basis.SIBLING_CONFIDENCE == 0.9
    default = inspect.signature(ConnectionRegistry).parameters["sibling_window"].default
    assert default is basis.DEFAULT_SIBLING_WINDOW == 300.0
    assert identity.MAX_CANDIDATES == fingerprint.MAX_CANDIDATES
    # The pipeline (pyspark) without importing it: its window default and its sibling confidence.
    tree = ast.parse((ROOT / "pipeline" / "identity.py").read_text())
    (identities,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "identities"]
    assert ast.unparse(identities.args.defaults[-1]) == "DEFAULT_SIBLING_WINDOW"
    assert "F.lit(SIBLING_CONFIDENCE)" in ast.unparse(identities)


def test_the_first_requests_fold_in_key_order_up_to_the_bound():
    first = ((18, 3), (3, 12))
    assert fold_first_requests(first, {(0, 9), (3, 12), (1, 11)}) == ((18, 3), (3, 12), (0, 9), (1, 11))
    assert fold_first_requests(first, set()) is first  # nothing new: the same tuple
    assert fold_first_requests(first, {(3, 12)}) is first
    many = {(k, 0) for k in range(20)}
    folded = fold_first_requests((), many)
    assert folded == tuple((k, 0) for k in range(MAX_FIRST_REQUESTS))
    full = tuple((k, 1) for k in range(MAX_FIRST_REQUESTS))
    assert fold_first_requests(full, many) is full  # full: nothing more is kept


def _opened(conn: str, ts: float) -> ConnectionOpened:
    return ConnectionOpened(conn_id=conn, ts=ts, client_address="10.0.1.1", client_port=40000,
                            broker_address="10.0.0.5", broker_port=9092, listener="PLAINTEXT",
                            security_protocol="PLAINTEXT", mid_stream=False, source="capture")


def _request(conn: str, ts: float, key: int, version: int) -> RequestSeen:
    return RequestSeen(conn_id=conn, ts=ts, api_key=key, api_name=None, api_version=version, correlation_id=1,
                       client_id="app", size=10)


SYNC_EVENTS = {
    ClientSoftware: lambda c, t: ClientSoftware(conn_id=c, ts=t, request_version=0, name=None, version=None,
                                                valid=None, error_code=0, accepted=True),
    ApiVersionsAnswer: lambda c, t: ApiVersionsAnswer(
        conn_id=c, ts=t, request_version=0, error_code=0, api_ranges=((0, 0, 11), (3, 0, 12)), throttle_time_ms=0,
        supported_features=(), finalized_features_epoch=-1, finalized_features=(), zk_migration_ready=False,
        unknown_tags=()),
    SaslHandshake: lambda c, t: SaslHandshake(conn_id=c, ts=t, handshake_version=1, mechanism="PLAIN", error_code=0,
                                              enabled_mechanisms=("PLAIN",)),
    SaslIdentity: lambda c, t: SaslIdentity(conn_id=c, ts=t, mechanism="PLAIN", principal="alice", outcome="success",
                                            error_code=0, framing="SaslAuthenticate"),
    TlsDetected: lambda c, t: TlsDetected(conn_id=c, ts=t),
    DecodeError: lambda c, t: DecodeError(conn_id=c, ts=t, direction=Direction.FROM_CLIENT, kind="bad_size",
                                          api_key=None, api_version=None, detail="x"),
    Desync: lambda c, t: Desync(conn_id=c, ts=t, direction=Direction.FROM_CLIENT, kind="lost", detail="x"),
    ConnectionClosed: lambda c, t: ConnectionClosed(conn_id=c, ts=t, reason="fin", pending_requests=0),
}


def test_every_sync_point_of_the_basis_has_an_event_here():
    assert set(SYNC_EVENTS) == BASIS_SYNC


@pytest.mark.parametrize("sync", sorted(SYNC_EVENTS, key=lambda cls: cls.__name__), ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("tally", [False, True], ids=["per-request", "tally"])
def test_the_registry_and_the_rollup_fold_at_the_same_sync_points(sync, tally):
    """Pairs seen between two sync points fold in key order at the next one, in the registry and
    in the event log's rollup alike; a traffic sweep folds nothing (the registry's fingerprint
    reads them provisionally)."""
    if tally:
        traffic = [RequestTally(conn_id="a", ts=1.1, client_id="app", requests=((3, 12, 2, 20), (10, 2, 1, 10)),
                                responses=(), acks=())]
    else:
        traffic = [_request("a", 1.1, 10, 2), _request("a", 1.2, 3, 12), _request("a", 1.3, 10, 2)]
    sweep = TrafficUpdate(conn_id="a", ts=1.4, bytes_from_client=50, bytes_from_broker=0, segments_from_client=3,
                          segments_from_broker=0)
    events = [_opened("a", 1.0), *traffic, sweep]
    reg = ConnectionRegistry(closed_ttl=1e9)
    log = Rollup()
    for ev in events:
        reg.apply(ev)
        if type(ev) in rollup.TRAFFIC:
            log.add(ev)
        else:
            log.note(ev)
    assert reg.get("a")["first_requests"] == [] and log.bases["a"].first == ()  # not at a sweep
    ev = SYNC_EVENTS[sync]("a", 1.5)
    reg.apply(ev)
    log.note(ev)
    expected = ((3, 12), (10, 2))  # key order, whatever the wire order
    assert tuple((r["api_key"], r["api_version"]) for r in reg.get("a")["first_requests"]) == expected
    assert log.bases["a"].first == expected
