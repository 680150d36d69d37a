"""The two ways a pipeline job fails without a traceback, and the bound on bad input kept.

Owns `UsageError` (the command line asks for something impossible: `pipeline.cli` reports it
as argparse does, exit 2), `InputError` (the input cannot give an answer: exit 1) and
`MAX_QUARANTINED_LINES` (the default of --max-quarantined-lines: `pipeline.events` keeps the
text of at most that many bad lines, here so the CLI's parser needs no pyspark). Every job
module raises the errors; `pipeline.cli` catches them. Imports nothing, so any module of
`pipeline` may import it without a cycle.
"""

from __future__ import annotations

#: Bad lines whose text is kept (OUT/quarantine/, and the cached facts, where a kept line is a
#: row of its own of up to 2,000 characters); the others are counted per file and reason.
MAX_QUARANTINED_LINES = 10_000


class UsageError(Exception):
    """Bad usage the parser could not see (e.g. an unknown `--target`, a bad `--listener`)."""


class InputError(Exception):
    """The input cannot give an answer (e.g. every line has another schema version)."""
