"""What the generators of `make regen` share: their command line, their external input, and
the one rule for a generated Python file (write it, or `--check` compare).

Owns `GenError` (an input problem: one line on stderr, exit 2), `Input` (an external reference
directory: its flag, its environment variable, what it must hold and at which version),
`input_dir` (the flag, else the variable, else a GenError that names both), `write_or_check`
and `main`, the command line of tools/gen_apis.py and tools/gen_fingerprints.py (the drift tests
run both with `--check`). No input has a default: the reference data lives outside the
repository, and nothing in the repository names a place outside it. Imports only the standard
library.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path


class GenError(Exception):
    """An input problem that prevents generation; reported as one line, exit status 2."""


@dataclass(frozen=True)
class Input:
    """An external input directory of a generator."""

    flag: str  # e.g. "--schemas"
    env: str  # e.g. "KAFKA_SCHEMAS_DIR" (`make regen` sets it from its own variable)
    content: str  # what DIR must hold, with the upstream version: the error says it


def input_dir(given: Path | None, spec: Input, environ: Mapping[str, str] = os.environ) -> Path:
    """`given` (the flag), else `$ENV`; a directory that exists, else a GenError naming the flag,
    the variable and what the directory must hold."""
    if given is None:
        value = environ.get(spec.env)
        if not value:
            raise GenError(f"no input directory: set {spec.env}=DIR or pass {spec.flag} DIR, DIR holding "
                           f"{spec.content} (docs/dependencies.md)")
        given = Path(value)
    if not given.is_dir():
        raise GenError(f"input directory not found: {given} ({spec.flag} or {spec.env}: DIR holding {spec.content})")
    return given


def write_or_check(text: str, path: Path, rel: str, *, check: bool, prog: str) -> int:
    """Without `check`, write `text` to `path` and say so: 0. With it, write nothing: 0 when the
    committed file (`rel` names it in messages) equals `text`, else 1 with a unified diff on
    stderr. A missing committed file compares as empty."""
    if check:
        try:
            committed = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            committed = ""
        if committed == text:
            return 0
        sys.stderr.write(f"{prog}: {rel} is out of date; run `make regen`\n")
        sys.stderr.writelines(difflib.unified_diff(committed.splitlines(keepends=True), text.splitlines(keepends=True),
                                                   fromfile=f"{rel} (committed)", tofile=f"{rel} (regenerated)"))
        return 1
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    print(f"wrote {rel}")
    return 0


def main(argv: list[str] | None, *, prog: str, description: str, spec: Input, output: Path, output_rel: str,
         generate: Callable[[Path, argparse.Namespace], str],
         add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    """The command line of a generator (`python -m tools.PROG [FLAG DIR] [--check] ...`): resolve
    its input, `generate(directory, args)` the file's text, write it to `output` or compare.
    A GenError is one line and exit 2."""
    parser = argparse.ArgumentParser(prog=f"python -m tools.{prog}", description=description)
    parser.add_argument(spec.flag, type=Path, default=None, metavar="DIR", dest="input_dir",
                        help=f"DIR holding {spec.content} (default: ${spec.env}; no other default)")
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 with a diff if the committed file differs")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        text = generate(input_dir(args.input_dir, spec), args)
    except GenError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return write_or_check(text, output, output_rel, check=args.check, prog=prog)
