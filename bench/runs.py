"""A benchmark's runs on a shared machine, and what it keeps of them.

Owns the "quiet round" rule of the benchmarks that measure beside other people's work
(bench/proxy/ and bench/kafka_producer.py): a round during which other work took more than
`--max-other` cores is kept in the JSON but run again, at most `--rounds` extra times, and the
tables use the quiet rounds, or all of them if none was quiet (`quiet_rounds`, `rounds_used`,
`quiet_note`);
the medians over those rounds (`med`); and the results file every benchmark writes under
bench/results/ (`write_result`). Imports nothing from the project.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path


def quiet_rounds(rounds: int, max_other: float, run_round: Callable[[int, int], list[dict]],
                 other_cores: Callable[[dict], float]) -> list[dict]:
    """Every row of rounds 1, 2, ... until `rounds` of them were quiet, at most 2 x `rounds`.
    `run_round(r, quiet so far)` runs round r and returns its rows; a round is noisy when
    `other_cores(row)` of any of its rows is above `max_other`. Each row gets "quiet_round"."""
    rows: list[dict] = []
    quiet = 0
    for r in range(1, 2 * rounds + 1):
        if quiet >= rounds:
            break
        round_rows = run_round(r, quiet)
        noisy = max(other_cores(x) for x in round_rows) > max_other
        for x in round_rows:
            x["quiet_round"] = not noisy
        rows += round_rows
        quiet += not noisy
        if noisy:
            print(f"  round {r}: other work above {max_other:g} of a core: "
                  f"{'run again' if r < 2 * rounds and quiet < rounds else 'no retries left'}",
                  file=sys.stderr)
    return rows


def rounds_used(rows: list[dict]) -> list[dict]:
    """The rows of the quiet rounds, or every row if no round was quiet."""
    return [r for r in rows if r["quiet_round"]] or rows


def quiet_note(rows: list[dict], max_other: float, tables: str) -> str:
    """What a report's caption says of the rounds run (every row's): how many were quiet, and
    that `tables` come from those (or from all)."""
    ran = len({r["round"] for r in rows})
    quiet = len({r["round"] for r in rows if r["quiet_round"]})
    return (f"{quiet} of {ran} rounds quiet (other work at most {max_other:g} of a core), {tables} from "
            f"{'those' if quiet else 'all of them (none was quiet)'}")


def med(rows: list[dict], key: str, sub: str | None = None) -> float | None:
    """The median of the rows' `key` (or of its `sub` item), None values left out; None if none is left."""
    values = [r.get(key) if sub is None else r[key][sub] for r in rows]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def write_result(path: Path, result: dict, **dumps) -> None:
    """`result` as indented JSON at `path` (its directory made), and "wrote PATH" on stderr.
    `dumps`: more json.dumps arguments (e.g. default=str)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, **dumps) + "\n")
    print(f"wrote {path}", file=sys.stderr)
