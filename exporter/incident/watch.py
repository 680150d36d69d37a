"""`--watch`: the incident CLI's answer, asked again and redrawn until Ctrl-C.

Owns `watch` (the refresh loop: a terminal redrawn one screen at a time, a pipe given one
frame after another under a time line, the errors that end it). It knows nothing of the
request: the command hands it a function that makes one frame. Must not import capture, the
census, FastAPI or the CLI; standard library, exporter.textsafe, the client's exit codes and the
tables only. Bounds: nothing is kept from one refresh to the next.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable

from exporter.incident.client import EXIT_OK, EXIT_UNAUTHORIZED, EXIT_USAGE
from exporter.incident.tables import Frame, cut, emit, table_width


def watch(one: Callable[[], Frame], *, command: str, base: str, every: float, count: int | None,
          output: str) -> int:
    """Redraw `one()` every `every` seconds until Ctrl-C (exit 0) or `count` refreshes (the last
    one's exit code). On a terminal the screen is cleared and the table cut to its height; in
    a pipe each refresh follows a `--- TIME server ---` line (-o json: one JSON document per
    line, no separator). Errors that retrying cannot fix (usage, unauthorized) end the watch;
    others are shown and retried."""
    from exporter.textsafe import visible

    tty = sys.stdout.isatty()
    refreshes = 0
    try:
        while True:
            frame = one()
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            title = f"Every {every:g}s: kafka-census {command} {visible(base)}   {stamp}"
            if output == "json":
                pass
            elif tty:
                # One screen: title, the table cut to the terminal's height, the notes (which a
                # redraw clears like the rest; on stderr they would scroll the screen).
                size = shutil.get_terminal_size()
                width = table_width() if output != "wide" else None
                ending = frame.code in (EXIT_USAGE, EXIT_UNAUTHORIZED)  # its error stays on stderr
                notes = [] if ending else [cut(n, width) if width else n for n in frame.notes]
                room = max(1, size.lines - 3 - len(notes))
                lines = frame.lines
                if len(lines) > room:
                    more = f"... {len(lines) - room + 1} more lines: narrow with filters or --limit"
                    lines = lines[:room - 1] + [cut(more, width) if width else more]
                sys.stdout.write("\x1b[H\x1b[2J")  # home, clear: a redraw, not a scroll
                frame = Frame([cut(title, width) if width else title, ""] + lines + notes,
                              frame.notes if ending else [], frame.code)
            else:
                frame = Frame([f"--- {stamp} {visible(base)} ---"] + frame.lines, frame.notes, frame.code)
            emit(frame)
            refreshes += 1
            if frame.code in (EXIT_USAGE, EXIT_UNAUTHORIZED):
                return frame.code
            if count is not None and refreshes >= count:
                return frame.code
            time.sleep(every)
    except KeyboardInterrupt:
        return EXIT_OK
