"""The one rule of `make regen` for a generated Python file: write it, or (`--check`) compare.

Owns `write_or_check`, shared by tools/gen_apis.py and exporter/gen_fingerprints.py (the drift
tests run both with `--check`). Imports only the standard library.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path


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
