"""The log on stderr: `level: message`, escaped, and --log-level.

Owns the formatter every kafka-census log record goes through (a message may quote the wire
or a request path: `textsafe.visible` keeps one record one line) and `configure_logging`.
Imports exporter.textsafe only.
"""

from __future__ import annotations

import logging
import sys

from exporter.textsafe import visible


class _LevelPrefix(logging.Formatter):
    """`warning: message`, as the command's own `error:` and `warning:` lines. The message may
    quote the wire or a request path, so it goes through `visible()`: a newline in it would
    start a forged line. A traceback keeps its lines, each escaped and indented, so that none
    can pass for a record of its own."""

    def format(self, record: logging.LogRecord) -> str:
        lines = [f"{record.levelname.lower()}: {visible(record.getMessage())}"]
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        for extra in (record.exc_text, record.stack_info and self.formatStack(record.stack_info)):
            if extra:
                lines.extend("  " + visible(line) for line in extra.split("\n"))
        return "\n".join(lines)


def configure_logging(level: str) -> None:
    """The "kafka-census" logger (every module's) to stderr at `level` (--log-level), and
    uvicorn's through the same escaping formatter (Service.run leaves its loggers to us).
    uvicorn's own loggers stay at warning whatever the level: its debug and trace output would
    include request headers, and so the Authorization header."""
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name("kafka-census-stderr")
    handler.setFormatter(_LevelPrefix())
    for name, at in (("kafka-census", level.upper()), ("uvicorn", "WARNING")):
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if h.get_name() == "kafka-census-stderr"]:
            logger.removeHandler(old)  # configured again (main() called twice in one process)
        logger.addHandler(handler)
        logger.setLevel(at)
