"""The core's state machines (capture/kafka/states.py): the tables connection.py's docstring shows
are the tables the code checks every change against, every change goes through that check, and
an illegal change raises instead of happening.

The docstring is read from the source (as a reader sees it), in both builds; the walks through
the states read each direction's and the wait's state off a real connection fed real frames.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as Hs0
from kio.schema.sasl_handshake.v0.response import SaslHandshakeResponse as Hs0Resp

from capture.kafka import ConnectionClosed, DecodeError, Desync, Direction, KafkaConnection, Kind, Resynced
from capture.kafka import states as st
from harness.kafka_frames import raw_request, request_frame, response_frame, sized

CORE = pathlib.Path(__file__).resolve().parents[2] / "capture" / "kafka"
C, B = Direction.FROM_CLIENT, Direction.FROM_BROKER


def _docstring() -> str:
    doc = ast.get_docstring(ast.parse((CORE / "connection.py").read_text()), clean=False)
    assert doc
    return doc


def documented_table(doc: str, states: tuple[str, ...]) -> dict[tuple[str, str], str]:
    """The rows `STATE  meaning  EVENT, EVENT  -> NEXT` of the table whose states are `states`:
    a row starts at a state name indented four spaces; the lines under it (no state of their
    own) continue it. Columns are two or more spaces apart."""
    table: dict[tuple[str, str], str] = {}
    current = None
    for line in doc.splitlines():
        left, arrow, right = line.partition("->")
        if not arrow or right.strip() not in states:
            current = None  # a header, another table, or prose
            continue
        cells = re.split(r"\s{2,}", left.strip())
        if re.match(r" {4}\S", line):
            assert cells[0] in states, line
            current = cells[0]
        assert current is not None, f"a row without a state: {line!r}"
        for event in cells[-1].split(", "):
            assert (current, event) not in table, f"{current} on {event} twice"
            table[current, event] = right.strip()
    return table


def documented_events(doc: str, events: tuple[str, ...]) -> set[str]:
    """The events the legend under a table explains: lines `    EVENT  what it is`."""
    return {m.group(1) for m in re.finditer(r"^ {4}([A-Z0-9_]+) {2,}\S", doc, re.M) if m.group(1) in events}


def named(table: dict, states: tuple[str, ...], events: tuple[str, ...]) -> dict[tuple[str, str], str]:
    return {(states[s], events[e]): states[n] for (s, e), n in table.items()}


def test_the_documented_direction_table_is_the_one_the_code_checks():
    doc = _docstring()
    code = named(st.STREAM_TRANSITIONS, st.STREAM_STATES, st.STREAM_EVENTS)
    assert documented_table(doc, st.STREAM_STATES) == code
    assert documented_events(doc, st.STREAM_EVENTS) == set(st.STREAM_EVENTS)
    assert {s for s, _ in code} == set(st.STREAM_STATES)  # every state can be left (or closed again)


def test_the_documented_sasl_wait_table_is_the_one_the_code_checks():
    doc = _docstring()
    code = named(st.SASL_WAIT_TRANSITIONS, st.SASL_WAIT_STATES, st.SASL_WAIT_EVENTS)
    assert documented_table(doc, st.SASL_WAIT_STATES) == code
    assert documented_events(doc, st.SASL_WAIT_EVENTS) == set(st.SASL_WAIT_EVENTS)


def test_the_parser_sees_a_changed_row():
    doc = _docstring()
    assert "RESYNC               -> SYNCED" in doc
    changed = documented_table(doc.replace("RESYNC               -> SYNCED", "RESYNC               -> SCANNING", 1),
                               st.STREAM_STATES)
    assert changed != named(st.STREAM_TRANSITIONS, st.STREAM_STATES, st.STREAM_EVENTS)
    assert changed["SCANNING", "RESYNC"] == "SCANNING"


@pytest.mark.parametrize("check, table, states, events", [
    (st.next_stream_state, st.STREAM_TRANSITIONS, st.STREAM_STATES, st.STREAM_EVENTS),
    (st.next_sasl_wait_state, st.SASL_WAIT_TRANSITIONS, st.SASL_WAIT_STATES, st.SASL_WAIT_EVENTS),
])
def test_the_check_allows_exactly_the_table(check, table, states, events):
    for state in range(len(states)):
        for event in range(len(events)):
            if (state, event) in table:
                assert check(state, event) == table[state, event]
            else:
                with pytest.raises(st.IllegalTransition, match=f"{states[state]} has no transition on {events[event]}"):
                    check(state, event)


def test_an_illegal_transition_raises_and_changes_nothing():
    conn = KafkaConnection("t")
    conn.close("fin", 1.0)
    assert isinstance(conn.events()[-1], ConnectionClosed)
    assert conn._client.state == st.IGNORED
    with pytest.raises(AssertionError):  # IllegalTransition: a bug, never a ProtocolError
        conn._client.move(st.DESYNC)
    assert conn._client.state == st.IGNORED


def _assignments(tree: ast.AST, attribute: str) -> set[str]:
    """The functions of `tree` that assign `<anything>.<attribute>`."""
    found = set()
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef):
            continue
        for node in ast.walk(func):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and t.attr == attribute:
                        found.add(func.name)
    return found


def test_every_state_change_goes_through_the_one_check():
    """A direction's state is set in `_setup` (its initial state) and `move` only; the wait's in
    `__init__` and `_move_sasl_wait` only; no other module of the core sets either."""
    tree = ast.parse((CORE / "connection.py").read_text())
    assert _assignments(tree, "state") == {"_setup", "move"}
    assert _assignments(tree, "_sasl_wait") == {"__init__", "_move_sasl_wait"}
    for path in CORE.glob("*.py"):
        if path.name != "connection.py":
            other = ast.parse(path.read_text())
            assert not _assignments(other, "state") | _assignments(other, "_sasl_wait"), path.name


def test_the_assignment_check_sees_one():
    tree = ast.parse("def f(s):\n    s.state = 1\ndef g(s):\n    s.state += 1\ndef h(s):\n    s.other = 2\n")
    assert _assignments(tree, "state") == {"f", "g"}


# --- walks through the states, read off a real connection -----------------------------------------


def metadata(corr: int) -> bytes:
    return request_frame(MetadataRequest(topics=None, allow_auto_topic_creation=True,
                                         include_topic_authorized_operations=False), corr, "app")


def test_a_direction_walks_desync_scan_verify_and_resync():
    """SYNCED -> SCANNING on a bad size; a large candidate that the buffer cannot verify ->
    VERIFYING, its frame skipped unread; the next header plausible -> SYNCED (Resynced)."""
    conn = KafkaConnection("t", max_decoded_frame=1024, max_frame_size=1 << 20)
    assert conn._client.state == st.SYNCED and conn._broker.state == st.SYNCED
    conn.receive(C, b"\x7f\xff\xff\xff", 1.0)  # a size beyond max_frame_size
    assert [type(e) for e in conn.events()] == [Desync] and conn._client.state == st.SCANNING
    large = raw_request(0, 9, 7, "app", b"\x00" * 5000)  # larger than the scan window
    conn.receive(C, large[:2000], 2.0)
    assert conn.events() == [] and conn._client.state == st.VERIFYING
    conn.receive(C, large[2000:] + metadata(8), 3.0)
    events = conn.events()
    assert isinstance(events[0], Resynced) and conn._client.state == st.SYNCED


def test_a_direction_walks_back_to_scanning_when_the_skipped_frame_is_not_followed_by_a_header():
    conn = KafkaConnection("t", max_decoded_frame=1024, max_frame_size=1 << 20)
    conn.receive(C, b"\x7f\xff\xff\xff", 1.0)
    large = raw_request(0, 9, 7, "app", b"\x00" * 5000)
    conn.receive(C, large + b"\xff" * 16, 2.0)
    assert [type(e) for e in conn.events()] == [Desync] and conn._client.state == st.SCANNING


def test_the_sasl_wait_walks_its_table():
    """ANSWER_AWAITED while the answer can come in order; ANSWER_MAYBE_LOST once the held bytes
    outgrow a token (the frames dropped and counted); ANSWER_NOT_AWAITED when the answer is read;
    and, the row that is easy to miss: a response to a frame dropped in that earlier wait ends a
    later wait too (ANSWER_AWAITED on KAFKA_RESUMED), since it proves Kafka frames resumed."""
    conn = KafkaConnection("t", max_decoded_frame=64, max_frame_size=1 << 16)
    assert conn._sasl_wait == st.ANSWER_NOT_AWAITED
    conn.receive(C, request_frame(Hs0(mechanism="PLAIN"), 1), 1.0)
    conn.events()
    assert conn._sasl_wait == st.ANSWER_AWAITED
    conn.receive(C, metadata(2) + b"\x00\x00\x00\x50" + b"\x01" * 80, 2.0)
    dropped = [e for e in conn.events() if isinstance(e, DecodeError)]
    assert [e.kind for e in dropped] == [Kind.SASL_UNCERTAIN] * 2 and conn._sasl_wait == st.ANSWER_MAYBE_LOST
    refused = response_frame(Hs0Resp(error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=("SCRAM",)), 1)
    conn.receive(B, refused, 3.0)
    conn.events()
    assert conn._sasl_wait == st.ANSWER_NOT_AWAITED
    conn.receive(C, request_frame(Hs0(mechanism="PLAIN"), 3), 4.0)
    conn.events()
    assert conn._sasl_wait == st.ANSWER_AWAITED
    conn.receive(B, sized((2).to_bytes(4, "big") + b"\x00" * 8), 5.0)  # answers the frame dropped at 2.0
    conn.events()
    assert conn._sasl_wait == st.ANSWER_NOT_AWAITED
