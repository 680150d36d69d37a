"""The incident CLI's terminal tables: what an answer of the REST API looks like on a terminal.

Owns the columns of each command's table (`CONNECTION_COLUMNS`, `CLIENT_COLUMNS`,
`CHURN_COLUMNS`, `UPGRADE_COLUMNS`: header, cell, shown by default), the cells (ages, software
with its `(inferred)` mark), cell widths (`cell_width`: wide and combining characters), cutting
(`cut`) and fitting a table to the terminal (`render`, `table_width`, `rows_table`), and each
command's frame (`frame_connections`, ...: an answer's lines and notes) as a `Frame`, written by
`emit`. Output forms: `table` (the columns that fit), `wide` (every column, uncut). Must not
import capture, the census, FastAPI or the CLI; standard library, exporter.textsafe and the
client (exporter.incident.client: `Answer`, `Failure`) only.

Text from the wire (client ids, software names, principals, addresses) goes through
`textsafe.visible` before the terminal: every cell of `render`.
"""

from __future__ import annotations

import os
import sys

from exporter.incident.client import EXIT_SERVER, LIMIT_MAX, Answer, Failure

# --- cells ------------------------------------------------------------------------------------

def _age(stamp, now: float) -> str:
    """kubectl-style age of an RFC 3339 UTC time: 42s, 7m, 5h, 3d."""
    if not isinstance(stamp, str):
        return "-"
    from datetime import datetime

    try:
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return stamp
    seconds = max(0, int(now - then))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def _text(value) -> str:
    return "-" if value is None or value == "" else str(value)


INFERRED = " (inferred)"
SOFTWARE_MIN = len(INFERRED) + 11  # a cut software column still shows 10 cells of the name before the mark


def software(name, version, inferred=None, *, inferred_source: bool = False) -> str:
    """`name version` as announced; an inferred identity only when none was announced, and
    always marked: `kafkajs 2.0.0-2.0.1 (inferred)`."""
    if name:
        label = f"{name} {version}" if version else str(name)
        return label + INFERRED if inferred_source else label
    if isinstance(inferred, dict) and inferred.get("name"):
        rng = inferred.get("version_range")
        return f"{inferred['name']} {rng}{INFERRED}" if rng else f"{inferred['name']}{INFERRED}"
    return "-"


def _count(requests) -> int:
    if not isinstance(requests, list):
        return 0
    return sum(r.get("count", 0) for r in requests if isinstance(r, dict) and isinstance(r.get("count"), int))


def _removed(items, wide: bool) -> str:
    if not isinstance(items, list):
        return "-"
    parts = []
    for r in items:
        if not isinstance(r, dict):
            continue
        part = f"{r.get('api')} v{r.get('api_version')}"
        if wide:
            minimum = r.get("minimum_version")
            part += f" x{r.get('count')} ({'removed' if minimum is None else f'min v{minimum}'})"
        parts.append(part)
    return ", ".join(parts) or "-"


def _confidence(inferred) -> str:
    if isinstance(inferred, dict) and isinstance(inferred.get("confidence"), (int, float)):
        return f"{inferred['confidence']:.2f}"
    return "-"


# Columns: (header, cell(row, now) -> str, shown in the default table?). The first column is
# never dropped; under a narrow terminal the widest column is cut first.
CONNECTION_COLUMNS = [
    ("CLIENT", lambda c, now: f"{c.get('client_address')}:{c.get('client_port')}", True),
    ("CLIENT-ID", lambda c, now: _text(c.get("client_id")), True),
    ("SOFTWARE", lambda c, now: software(c.get("client_software_name"), c.get("client_software_version"),
                                         c.get("inferred_software")), True),
    ("PRINCIPAL", lambda c, now: _text(c.get("principal")), True),
    ("STATE", lambda c, now: _text(c.get("state")) if c.get("state") == "open"
        else f"closed/{c.get('close_reason') or '?'}", True),
    ("LISTENER", lambda c, now: _text(c.get("listener")), True),
    ("LAST-SEEN", lambda c, now: _age(c.get("last_seen"), now), True),
    ("AGE", lambda c, now: _age(c.get("first_seen"), now), True),
    ("REQUESTS", lambda c, now: str(_count(c.get("requests"))), True),
    ("ID", lambda c, now: _text(c.get("id")), False),
    ("BROKER", lambda c, now: f"{c.get('broker_address')}:{c.get('broker_port')}", False),
    ("PROTOCOL", lambda c, now: _text(c.get("security_protocol")), False),
    ("IDENTITY", lambda c, now: _text(c.get("identity_source")), False),
    ("CONFIDENCE", lambda c, now: _confidence(c.get("inferred_software")), False),
    ("SASL", lambda c, now: _text(c.get("sasl_mechanism")), False),
    ("BYTES-IN", lambda c, now: _text(c.get("bytes_from_client")), False),
    ("BYTES-OUT", lambda c, now: _text(c.get("bytes_from_broker")), False),
    ("DECODE-ERRORS", lambda c, now: _text(c.get("decode_errors")), False),
    ("DESYNCS", lambda c, now: _text(c.get("desyncs")), False),
    ("FIRST-SEEN", lambda c, now: _text(c.get("first_seen")), False),
    ("LAST-SEEN-AT", lambda c, now: _text(c.get("last_seen")), False),
]

CLIENT_COLUMNS = [
    ("SOFTWARE", lambda r, now: software(r.get("client_software_name"), r.get("client_software_version"),
                                         r.get("inferred_software")), True),
    ("CLIENT-ID", lambda r, now: _text(r.get("client_id")), True),
    ("PRINCIPAL", lambda r, now: _text(r.get("principal")), True),
    ("LISTENER", lambda r, now: _text(r.get("listener")), True),
    ("OPEN", lambda r, now: _text(r.get("open_connections")), True),
    ("TOTAL", lambda r, now: _text(r.get("total_connections")), True),
    ("LAST-SEEN", lambda r, now: _age(r.get("last_seen"), now), True),
    ("IDENTITY", lambda r, now: _text(r.get("identity_source")), False),
    ("CONFIDENCE", lambda r, now: _confidence(r.get("inferred_software")), False),
    ("ADDRESSES", lambda r, now: ",".join(map(str, r.get("client_addresses") or [])) or "-", False),
    ("REQUESTS", lambda r, now: str(_count(r.get("requests"))), False),
    ("FIRST-SEEN", lambda r, now: _text(r.get("first_seen")), False),
    ("LAST-SEEN-AT", lambda r, now: _text(r.get("last_seen")), False),
]

CHURN_COLUMNS = [
    ("CLIENT", lambda r, now: _text(r.get("client_address")), True),
    ("CLIENT-ID", lambda r, now: _text(r.get("client_id")), True),
    ("PER-MINUTE", lambda r, now: _text(r.get("connections_per_minute")), True),
    ("TOTAL", lambda r, now: _text(r.get("connections_total")), True),
    ("LAST-SEEN", lambda r, now: _age(r.get("last_seen"), now), True),
    ("FIRST-SEEN", lambda r, now: _age(r.get("first_seen"), now), True),
    ("FIRST-SEEN-AT", lambda r, now: _text(r.get("first_seen")), False),
    ("LAST-SEEN-AT", lambda r, now: _text(r.get("last_seen")), False),
]

_INFERRED_SOURCES = ("sibling", "fingerprint")
UPGRADE_COLUMNS = [
    ("SOFTWARE", lambda r, now: software(r.get("software_name"), r.get("software_version"),
                                         inferred_source=r.get("identity_source") in _INFERRED_SOURCES), True),
    ("CLIENT-ID", lambda r, now: _text(r.get("client_id")), True),
    ("PRINCIPAL", lambda r, now: _text(r.get("principal")), True),
    ("LISTENERS", lambda r, now: ",".join(map(str, r.get("listeners") or [])) or "-", True),
    ("OPEN", lambda r, now: _text(r.get("open_connections")), True),
    ("TOTAL", lambda r, now: _text(r.get("total_connections")), True),
    ("REMOVED", lambda r, now: _removed(r.get("removed_requests"), False), True),
    ("MIN-COMPATIBLE", lambda r, now: _text(r.get("min_compatible")), True),
    ("REMOVED-DETAIL", lambda r, now: _removed(r.get("removed_requests"), True), False),
    ("IDENTITY", lambda r, now: _text(r.get("identity_source")), False),
    ("CONFIDENCE", lambda r, now: _confidence(r.get("inferred_software")), False),
    ("EVIDENCE", lambda r, now: "; ".join(map(str, r.get("evidence") or [])) or "-", False),
]


# --- the table --------------------------------------------------------------------------------

def cell_width(text: str) -> int:
    """Terminal cells `text` takes: East Asian wide and full-width characters two, combining
    marks none (`text` is already `visible()`: no controls)."""
    import unicodedata

    if text.isascii():
        return len(text)
    width = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


def cut(text: str, width: int) -> str:
    """`text` in at most `width` cells; a cut one ends with an ellipsis. The `(inferred)` mark
    survives the cut (`kafka… (inferred)`): an inferred name must never pass for an announced one."""
    if cell_width(text) <= width:
        return text
    if width <= 0:
        return ""
    if text.endswith(INFERRED) and width > len(INFERRED):
        return cut(text[:-len(INFERRED)], width - len(INFERRED)) + INFERRED
    out, used = [], 0
    for ch in text:
        w = cell_width(ch)
        if used + w > width - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + "…"


def _pad(text: str, width: int) -> str:
    return text + " " * (width - cell_width(text))


GAP = 3  # spaces between columns, as kubectl
MIN_COLUMN = 12  # columns are not cut narrower than this: the rightmost ones are hidden first


def _fit(natural: list[int], floors: list[int], room: int) -> list[int] | None:
    """Widths for columns of `natural` widths within `room` cells, or None if even their floors
    do not fit. Each column gets up to its floor first; what room is left goes to the wider
    ones at one level (the widest are cut the most), the narrower keeping their width."""
    base = [min(n, f) for n, f in zip(natural, floors)]
    if sum(base) > room:
        return None
    need = [n - b for n, b in zip(natural, base)]
    left = room - sum(base)
    out = list(base)
    order = sorted(range(len(need)), key=lambda i: need[i])
    for k, i in enumerate(order):
        share = left // (len(order) - k)
        if need[i] <= share:
            out[i] += need[i]
            left -= need[i]
            continue
        rest = order[k:]
        spare = left - share * len(rest)
        for j in sorted(rest, key=lambda j: -need[j]):  # the remainder to the widest
            out[j] += share + (1 if spare > 0 else 0)
            spare -= 1
        break
    return out


def render(headers: list[str], rows: list[list[str]], width: int | None,
           mins: dict[int, int] | None = None) -> tuple[list[str], int]:
    """Lines of a left-aligned table and how many columns were hidden. Every cell goes through
    `visible()`. With `width`, no line is longer: the widest columns are cut (ellipsis) to fit,
    down to MIN_COLUMN (or the column's own minimum in `mins`); past that the rightmost columns
    are hidden; never wrapped."""
    from exporter.textsafe import visible

    cells = [[visible(c) for c in row] for row in rows]
    natural = [max([cell_width(h)] + [cell_width(row[i]) for row in cells]) for i, h in enumerate(headers)]
    widths, shown = natural, len(headers)
    if width is not None:
        floors = [(mins or {}).get(i, MIN_COLUMN) for i in range(len(headers))]
        while True:
            fitted = _fit(natural[:shown], floors[:shown], width - GAP * (shown - 1))
            if fitted is not None or shown == 1:
                break
            shown -= 1  # the rightmost column goes: the others would be cut below their floors
        widths = fitted or [width]
    lines = []
    for row in [headers] + cells:
        parts = [_pad(cut(row[i], widths[i]), widths[i]) for i in range(shown)]
        line = (" " * GAP).join(parts).rstrip()
        if width is not None:
            line = cut(line, width)
        lines.append(line)
    return lines, len(headers) - shown


def table_width() -> int | None:
    """The terminal's columns (COLUMNS wins, as shutil reads it); None when stdout is not a
    terminal and COLUMNS is unset: a pipe gets whole lines, as kubectl gives it."""
    import shutil

    if "COLUMNS" not in os.environ and not sys.stdout.isatty():
        return None
    return max(20, shutil.get_terminal_size().columns)


def rows_table(columns, rows: list, output: str, width: int | None, now: float) -> tuple[list[str], list[str]]:
    chosen = [c for c in columns if output == "wide" or c[2]]
    # An aggregator names each connection's peer (`peer`) and each merged census row's (`peers`).
    if any(isinstance(r, dict) and "peer" in r for r in rows):
        chosen = chosen[:1] + [("PEER", lambda r, now: _text(r.get("peer")), True)] + chosen[1:]
    if output == "wide" and any(isinstance(r, dict) and isinstance(r.get("peers"), list) for r in rows):
        chosen = chosen + [("PEERS", lambda r, now: ",".join(map(str, r.get("peers") or [])) or "-", False)]
    cells = [[fn(r, now) for _, fn, _ in chosen] for r in rows if isinstance(r, dict)]
    mins = {i: SOFTWARE_MIN for i, c in enumerate(chosen) if c[0] == "SOFTWARE"}
    lines, hidden = render([name for name, _, _ in chosen], cells, None if output == "wide" else width, mins)
    notes = [f"note: {hidden} column{'s' if hidden > 1 else ''} hidden to fit {width} columns; -o wide shows "
             "every column"] if hidden else []
    return lines, notes


# --- what one request shows -------------------------------------------------------------------

class Frame:
    """What one request shows: `lines` for stdout, `notes` (warnings) for stderr, the exit code."""

    def __init__(self, lines: list[str], notes: list[str], code: int) -> None:
        self.lines, self.notes, self.code = lines, notes, code


def emit(frame: Frame) -> None:
    """The frame's lines on stdout, its notes on stderr."""
    if frame.lines:
        sys.stdout.write("\n".join(frame.lines) + "\n")
        sys.stdout.flush()
    for note in frame.notes:
        print(note, file=sys.stderr, flush=True)


def _list(body: dict, key: str, shown: str) -> list:
    value = body.get(key)
    if not isinstance(value, list):
        raise Failure(EXIT_SERVER, f"{shown}: unreadable answer: no {key!r} list")
    return value


# Each command's frame: (its answer, the parsed flags (`output`; upgrade-readiness: `target`), the
# terminal's width or None, now) -> (lines, notes). Failure (exit 1) if the answer lacks its list.

def frame_connections(answer: Answer, args, width, now) -> tuple[list[str], list[str]]:
    rows = _list(answer.body, "connections", "connections")
    notes = []
    total = answer.body.get("total")
    if isinstance(total, int) and total > len(rows):
        notes.append(f"note: showing {len(rows)} of {total} connections; raise --limit (at most {LIMIT_MAX}) "
                     "or narrow with filters")
    if not rows:
        return [], notes + ["note: no connections match"]
    lines, more = rows_table(CONNECTION_COLUMNS, rows, args.output, width, now)
    return lines, notes + more


def frame_clients(answer: Answer, args, width, now) -> tuple[list[str], list[str]]:
    rows = _list(answer.body, "clients", "clients")
    notes = []
    overflow = answer.body.get("census_overflow")
    if isinstance(overflow, int) and overflow > 0:
        notes.append(f"note: {overflow} closed connections are not in the census (it was full: --max-census-rows)")
    if not rows:
        return [], notes + ["note: no clients match"]
    lines, more = rows_table(CLIENT_COLUMNS, rows, args.output, width, now)
    return lines, notes + more


def frame_churn(answer: Answer, args, width, now) -> tuple[list[str], list[str]]:
    rows = _list(answer.body, "churning", "churn")
    threshold = answer.body.get("threshold_per_minute")
    evicted = answer.body.get("evicted")
    notes = [f"note: {evicted} clients were forgotten at --max-churn-clients (the least recently seen first)"] \
        if isinstance(evicted, int) and evicted > 0 else []
    if not rows:
        return [], notes + [f"note: no client opens {_text(threshold)} connections a minute or more"]
    lines, more = rows_table(CHURN_COLUMNS, rows, args.output, width, now)
    return lines, notes + more


def frame_upgrade(answer: Answer, args, width, now) -> tuple[list[str], list[str]]:
    from exporter.textsafe import visible

    body = answer.body
    rows = _list(body, "clients_by_software", "upgrade-readiness")
    target = visible(str(body.get("target", args.target)))
    if body.get("ready") is True:
        head = f"Kafka {target}: ready (no connection and no census row uses an API version it removes)"
        return [cut(head, width) if width is not None and args.output != "wide" else head], []
    head = f"Kafka {target}: NOT ready, {len(rows)} client group{'s' if len(rows) != 1 else ''} use API " \
           "versions it removes"
    if width is not None and args.output != "wide":
        head = cut(head, width)
    lines, notes = rows_table(UPGRADE_COLUMNS, rows, args.output, width, now)
    return [head, ""] + lines, notes
