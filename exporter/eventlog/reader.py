"""Reading event logs back: which files a directory holds, and their records.

Owns `list_logs` (the finished log files of a directory) and `read_events` (one file's records,
strict). The records are decoded by the record format (`parse_line`; `to_event` / `to_events`
turn them back into events), which reads schema 1 and 2. What reads logs uses this module and
exporter.eventlog.format: the replaying tools, the tests, the benchmarks; the pipeline reads them
with Spark and takes only the schema versions. Imports the record format, the file names
(exporter.eventlog.files) and the standard library; must not import the writer.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from exporter.eventlog.files import LOG_NAME, SUFFIX, EventLogError
from exporter.eventlog.format import parse_line


def read_events(path: str | os.PathLike) -> Iterator[dict]:
    """The records of one log file, in order. Raises EventLogError naming file:line on the
    first bad line, including a last line without its newline (a cut-off record)."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                raise EventLogError(f"{path}:{lineno}: last line has no newline (cut-off record)")
            try:
                yield parse_line(line)
            except ValueError as e:
                raise EventLogError(f"{path}:{lineno}: {e}") from None


def list_logs(directory: str | os.PathLike) -> list[str]:
    """Finished log files of `directory` (never `.active` ones), sorted by name: per host that
    is start-time order."""
    directory = os.fspath(directory)
    return sorted(os.path.join(directory, n) for n in os.listdir(directory)
                  if n.endswith(SUFFIX) and LOG_NAME.match(n))
