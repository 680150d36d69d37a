"""Text from the wire made safe for a terminal or a log line.

Owns `visible()`: client ids, software names, principals, TLS subjects and HTTP request paths
are chosen by whoever opens a connection, and a newline in one would start a forged log line
(`GET /x%0Aerror: ...`), an escape sequence would drive the operator's terminal, a bidi
override would reorder what the table shows. `visible()` renders every such character as a
visible escape, so one log record stays one line and a table cell shows what was sent.
Applied once where text leaves the process for a human: the log formatter and the table
printer (exporter/cli/output.py). JSON output needs nothing: `json.dumps` escapes control characters
(and, with its default `ensure_ascii`, every non-ASCII one).

Imports only the standard library; the capture package must not import this module
(its log records pass through the formatter that uses it).
"""

from __future__ import annotations

import re

# C0 controls, DEL and C1 controls (NEL U+0085 among them); U+061C, U+200E/F and U+202A-E,
# U+2066-9 are the bidi marks, embeddings, overrides and isolates (Unicode UAX #9, the
# "Trojan Source" characters); U+2028/9 are the line and paragraph separators, which some
# terminals and most log viewers treat as line breaks.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    ch = match.group()
    return _SHORT.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def visible(text: str) -> str:
    """`text` with every control, line-separator and bidi character as a visible escape
    (`\\n`, `\\r`, `\\t`, `\\x1b`, `\\u2028`); anything else, backslashes included, as it
    is. The result holds no line break and cannot move the terminal's cursor."""
    return _UNSAFE.sub(_escape, text)
