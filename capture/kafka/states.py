"""The core's state machines as data: the framing state of each direction of a connection, the
connection's wait for a SaslHandshake v0 answer, and the one check every change of either goes
through (h11's `_state.py` is the model).

Owns: the states, the events that move them, the two transition tables (`STREAM_TRANSITIONS`,
`SASL_WAIT_TRANSITIONS`: (state, event) -> next state, each declared once, here) and
`next_stream_state` / `next_sasl_wait_state`, which look a change up and raise
`IllegalTransition` for one the table does not hold. What each state means and why each event
happens is connection.py's docstring, whose tables tests/core/test_core_states.py holds equal to
these. Imports nothing, not even the other modules of `capture.kafka`.

An illegal transition is a bug in the core, never a property of the input: it raises (an
`AssertionError`, which the fuzz and differential tests treat as the bug it is) rather than
leave a direction in a state no rule was written for. The check is one byte read in a table
built at import; compiled (setup.py), a C call, paid on a state change and never per frame.
"""

from __future__ import annotations

# --- each direction's framing state (KafkaConnection's _Stream.state) -------------------------
SYNCED, SCANNING, VERIFYING, SASL_RAW, IGNORED = range(5)
STREAM_STATES = ("SYNCED", "SCANNING", "VERIFYING", "SASL_RAW", "IGNORED")  # by value

# What moves it (connection.py's docstring says when each happens).
DESYNC, RESYNC, LARGE_CANDIDATE, IMPLAUSIBLE, SASL_V0_ACCEPTED, RAW_DONE, TLS, CLOSE = range(8)
STREAM_EVENTS = ("DESYNC", "RESYNC", "LARGE_CANDIDATE", "IMPLAUSIBLE", "SASL_V0_ACCEPTED", "RAW_DONE", "TLS",
                 "CLOSE")

STREAM_TRANSITIONS = {
    (SYNCED, DESYNC): SCANNING,
    (SYNCED, SASL_V0_ACCEPTED): SASL_RAW,
    (SYNCED, TLS): IGNORED,
    (SYNCED, CLOSE): IGNORED,
    (SCANNING, RESYNC): SYNCED,
    (SCANNING, LARGE_CANDIDATE): VERIFYING,
    (SCANNING, DESYNC): SCANNING,
    (SCANNING, TLS): IGNORED,
    (SCANNING, CLOSE): IGNORED,
    (VERIFYING, RESYNC): SYNCED,
    (VERIFYING, IMPLAUSIBLE): SCANNING,
    (VERIFYING, DESYNC): SCANNING,
    (VERIFYING, TLS): IGNORED,
    (VERIFYING, CLOSE): IGNORED,
    (SASL_RAW, RAW_DONE): SYNCED,
    (SASL_RAW, DESYNC): SCANNING,
    (SASL_RAW, TLS): IGNORED,
    (SASL_RAW, CLOSE): IGNORED,
    (IGNORED, CLOSE): IGNORED,
}

# --- the connection's wait for a SaslHandshake v0 answer (KafkaConnection._sasl_wait) ---------
ANSWER_NOT_AWAITED, ANSWER_AWAITED, ANSWER_MAYBE_LOST = range(3)
SASL_WAIT_STATES = ("ANSWER_NOT_AWAITED", "ANSWER_AWAITED", "ANSWER_MAYBE_LOST")

V0_HANDSHAKE_SENT, V0_HANDSHAKE_SENT_UNSYNCED, ANSWER_LOST, ANSWER_READ, KAFKA_RESUMED = range(5)
SASL_WAIT_EVENTS = ("V0_HANDSHAKE_SENT", "V0_HANDSHAKE_SENT_UNSYNCED", "ANSWER_LOST", "ANSWER_READ",
                    "KAFKA_RESUMED")

SASL_WAIT_TRANSITIONS = {
    (ANSWER_NOT_AWAITED, V0_HANDSHAKE_SENT): ANSWER_AWAITED,
    (ANSWER_NOT_AWAITED, V0_HANDSHAKE_SENT_UNSYNCED): ANSWER_MAYBE_LOST,
    (ANSWER_NOT_AWAITED, KAFKA_RESUMED): ANSWER_NOT_AWAITED,
    (ANSWER_AWAITED, ANSWER_LOST): ANSWER_MAYBE_LOST,
    (ANSWER_AWAITED, ANSWER_READ): ANSWER_NOT_AWAITED,
    (ANSWER_AWAITED, KAFKA_RESUMED): ANSWER_NOT_AWAITED,
    (ANSWER_MAYBE_LOST, ANSWER_READ): ANSWER_NOT_AWAITED,
    (ANSWER_MAYBE_LOST, KAFKA_RESUMED): ANSWER_NOT_AWAITED,
}


class IllegalTransition(AssertionError):
    """A state change the table does not hold: a bug in the core."""


def _lookup(table: dict, states: tuple, events: tuple) -> bytes:
    """The table as one byte per (state, event), at state * len(events) + event: the next
    state + 1, or 0 where the table holds no transition."""
    return bytes(table[s, e] + 1 if (s, e) in table else 0 for s in range(len(states)) for e in range(len(events)))


_STREAM_NEXT = _lookup(STREAM_TRANSITIONS, STREAM_STATES, STREAM_EVENTS)
_STREAM_EVENT_COUNT = len(STREAM_EVENTS)
_SASL_WAIT_NEXT = _lookup(SASL_WAIT_TRANSITIONS, SASL_WAIT_STATES, SASL_WAIT_EVENTS)
_SASL_WAIT_EVENT_COUNT = len(SASL_WAIT_EVENTS)


def next_stream_state(state: int, event: int) -> int:
    """The state a direction in `state` moves to on `event` (STREAM_TRANSITIONS)."""
    following = _STREAM_NEXT[state * _STREAM_EVENT_COUNT + event]
    if not following:
        _illegal("a direction", STREAM_STATES, STREAM_EVENTS, state, event)
    return following - 1


def next_sasl_wait_state(state: int, event: int) -> int:
    """The state the SaslHandshake v0 wait in `state` moves to on `event` (SASL_WAIT_TRANSITIONS)."""
    following = _SASL_WAIT_NEXT[state * _SASL_WAIT_EVENT_COUNT + event]
    if not following:
        _illegal("the SaslHandshake v0 wait", SASL_WAIT_STATES, SASL_WAIT_EVENTS, state, event)
    return following - 1


def _illegal(what: str, states: tuple, events: tuple, state: int, event: int) -> None:
    raise IllegalTransition(f"{what} in {states[state]} has no transition on {events[event]}")
