"""The two ways a pipeline job fails without a traceback.

Owns `UsageError` (the command line asks for something impossible: `pipeline.cli` reports it
as argparse does, exit 2) and `InputError` (the input cannot give an answer: exit 1). Every
job module raises them; `pipeline.cli` catches them. Imports nothing, so any module of
`pipeline` may import it without a cycle.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad usage the parser could not see (e.g. an unknown `--target`, a bad `--listener`)."""


class InputError(Exception):
    """The input cannot give an answer (e.g. every line has another schema version)."""
