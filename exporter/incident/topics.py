"""The incident CLI's topic views (issue 31): `kafka-census topics` and `kafka-census topic NAME`.

Owns the columns of the topics table (`TOPIC_COLUMNS`: a topic, how many distinct clients
write and read it, its bytes in and out, when it was last used) and of a topic's client tables
(`TOPIC_CLIENT_COLUMNS`: software, client_id, principal, address, group, transactional id,
bytes, connections), the check of a topic named on the command line (`topic_path`: a valid
Kafka topic name or topic id, so nothing else reaches the URL), and the two frames
(`frame_topics`, `frame_topic`: "who writes" and "who reads" tables, admins below them, the
other clients -- metadata only, replication -- in `-o wide`). Rows an aggregator merged carry
their `peer`: `rows_table` adds the PEER column.

Standard library, exporter.textsafe and the incident package's client and tables only; must not
import capture, the census, FastAPI or the CLI. Text from the wire goes through `visible()`
(every cell of `render`; the head lines here).
"""

from __future__ import annotations

import re

from exporter.incident.client import API_PREFIX, EXIT_SERVER, EXIT_USAGE, Answer, Failure
from exporter.incident.tables import _age, _list, _text, cut, rows_table, software

#: A Kafka topic name (1-249 of [a-zA-Z0-9._-], neither "." nor ".."), which a topic id (22
#: characters of URL-safe base64) also is; "<other>" is the census's overflow topic.
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
OVERFLOW_TOPIC = "<other>"
_INFERRED_SOURCES = ("sibling", "fingerprint", "restored_sibling", "restored_fingerprint")
ROLE_TITLES = (("producers", "WHO WRITES"), ("consumers", "WHO READS"), ("admins", "ADMIN CLIENTS"),
               ("others", "OTHER CLIENTS (metadata only, replication)"))


def topic_path(name: str) -> str:
    """The detail's path for a topic name or id typed on the command line; Failure (exit 2)
    for anything Kafka could not have named."""
    from urllib.parse import quote

    from exporter.textsafe import visible

    if name != OVERFLOW_TOPIC and (not _TOPIC.fullmatch(name) or name in (".", "..")):
        raise Failure(EXIT_USAGE, f"{visible(name)[:80]!r} is not a Kafka topic name or id (1-249 characters "
                      "of letters, digits, '.', '_' and '-')")
    return API_PREFIX + "/topics/" + quote(name, safe="")


def _bytes(n) -> str:
    return f"{n:,}" if isinstance(n, int) else "-"


def topic_label(t: dict) -> str:
    """A topic as shown: its name, else its id marked (no peer saw a Metadata answer naming it)."""
    if t.get("topic") is not None:
        return str(t["topic"])
    return f"{t.get('topic_id')} (id, unnamed)"


def _identity(c: dict) -> tuple:
    return tuple(c.get(k) for k in ("software_name", "software_version", "client_id", "principal",
                                    "client_address", "group_id", "transactional_id"))


def clients_of(t: dict, role: str) -> int:
    """Distinct clients of a role: an aggregator lists a client once per sidecar that saw it."""
    rows = t.get(role)
    return len({_identity(c) for c in rows if isinstance(c, dict)}) if isinstance(rows, list) else 0


TOPIC_COLUMNS = [
    ("TOPIC", lambda t, now: topic_label(t), True),
    ("PRODUCERS", lambda t, now: str(clients_of(t, "producers")), True),
    ("CONSUMERS", lambda t, now: str(clients_of(t, "consumers")), True),
    ("BYTES-IN", lambda t, now: _bytes(t.get("bytes_produced")), True),
    ("BYTES-OUT", lambda t, now: _bytes(t.get("bytes_fetched")), True),
    ("LAST-SEEN", lambda t, now: _age(t.get("last_seen"), now), True),
    ("TOPIC-ID", lambda t, now: _text(t.get("topic_id")), False),
    ("ADMINS", lambda t, now: str(clients_of(t, "admins")), False),
    ("OTHERS", lambda t, now: str(clients_of(t, "others")), False),
    ("FIRST-SEEN-AT", lambda t, now: _text(t.get("first_seen")), False),
    ("LAST-SEEN-AT", lambda t, now: _text(t.get("last_seen")), False),
]

TOPIC_CLIENT_COLUMNS = [
    ("SOFTWARE", lambda c, now: software(c.get("software_name"), c.get("software_version"),
                                         inferred_source=c.get("identity_source") in _INFERRED_SOURCES), True),
    ("CLIENT-ID", lambda c, now: _text(c.get("client_id")), True),
    ("PRINCIPAL", lambda c, now: _text(c.get("principal")), True),
    ("ADDRESS", lambda c, now: _text(c.get("client_address")), True),
    ("GROUP", lambda c, now: _text(c.get("group_id")), True),
    ("TXN-ID", lambda c, now: _text(c.get("transactional_id")), True),
    ("BYTES", lambda c, now: _bytes(c.get("bytes")), True),
    ("CONNECTIONS", lambda c, now: _text(c.get("connections")), True),
    ("LAST-SEEN", lambda c, now: _age(c.get("last_seen"), now), True),
    ("USES", lambda c, now: ",".join(map(str, c.get("uses") or [])) or "-", False),
    ("FRAMES", lambda c, now: _bytes(c.get("frames")), False),
    ("OPEN", lambda c, now: _text(c.get("open_connections")), False),
    ("IDENTITY", lambda c, now: _text(c.get("identity_source")), False),
    ("FIRST-SEEN-AT", lambda c, now: _text(c.get("first_seen")), False),
    ("LAST-SEEN-AT", lambda c, now: _text(c.get("last_seen")), False),
    ("CONNECTION-IDS", lambda c, now: ",".join(map(str, c.get("conn_ids") or [])) or "-", False),
]


def frame_topics(answer: Answer, args, width, now) -> tuple[list[str], list[str]]:
    body = answer.body
    rows = _list(body, "topics", "topics")
    notes = []
    overflowed = body.get("topics_overflowed")
    if isinstance(overflowed, int) and overflowed > 0:
        notes.append(f"note: {overflowed:,} topics past the server's --max-topics are counted under {OVERFLOW_TOPIC}")
    unresolved = body.get("unresolved_ids")
    if isinstance(unresolved, int) and unresolved > 0:
        notes.append(f"note: {unresolved:,} topic ids are not named yet (no Metadata answer naming them was seen)")
    if not rows:
        return [], notes + ["note: no topics match"]
    lines, more = rows_table(TOPIC_COLUMNS, [r for r in rows if isinstance(r, dict)], args.output, width, now)
    return lines, notes + more


def frame_topic(answer: Answer, args, width, now) -> tuple[list[str], list[str]]:
    from exporter.textsafe import visible

    t = answer.body
    if not isinstance(t, dict) or not all(isinstance(t.get(role), list) for role, _ in ROLE_TITLES):
        raise Failure(EXIT_SERVER, "topic: unreadable answer: not a topic")
    wide = args.output == "wide"
    head = (f"topic {visible(topic_label(t))}" + (f" (id {visible(str(t['topic_id']))})"
                                                  if t.get("topic") is not None and t.get("topic_id") else "")
            + f": {_bytes(t.get('bytes_produced'))} bytes produced, {_bytes(t.get('bytes_fetched'))} fetched, "
            f"last seen {_age(t.get('last_seen'), now)} ago")
    lines = [head if wide or width is None else cut(head, width)]
    notes: list[str] = []
    for role, title in ROLE_TITLES:
        rows = [c for c in t[role] if isinstance(c, dict)]
        if role in ("admins", "others") and not rows:
            continue
        if role == "others" and not wide:
            notes.append(f"note: {clients_of(t, role)} other clients (metadata only, replication): -o wide lists them")
            continue
        lines += ["", f"{title}: {clients_of(t, role)} client{'s' if clients_of(t, role) != 1 else ''}"
                  + ("" if rows else ", none seen")]
        if rows:
            table, more = rows_table(TOPIC_CLIENT_COLUMNS, rows, args.output, width, now)
            lines += table
            notes += [n for n in more if n not in notes]
    return lines, notes
