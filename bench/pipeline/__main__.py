"""`python -m bench.pipeline`: the command line (and the child's, `--child JSON`), one
measurement per size, the report and bench/results/pipeline.json. The benchmark itself is
described in bench/pipeline/__init__.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import bench.pipeline
from bench.machine import describe
from bench.pipeline.data import FILE_MIB, REPO_ROOT
from bench.pipeline.measure import TARGETS, crossover, measure
from bench.pipeline.report import crossover_notes, report
from bench.pipeline.spark import child
from bench.runs import write_result

DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "pipeline.json"
SIZES = (2_000_000, 10_000_000)  # the input sizes: the default


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pipeline",
                                 description=bench.pipeline.__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, action="append",
                    help="generated events of the day (repeatable: one measurement per size; default "
                         + " and ".join(f"{n:,}" for n in SIZES) + ", the issue's)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each measurement; the best counts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--file-mib", type=int, default=FILE_MIB,
                    help=f"event-log file size (default {FILE_MIB}, the exporter's rotation size)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    ap.add_argument("--child", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    sizes = sorted(set(args.events or SIZES))
    if sizes[0] < 1 or args.repeat < 1 or args.file_mib < 1:
        ap.error("--events, --repeat and --file-mib must be positive")

    machine = describe()
    started = time.perf_counter()
    results = []
    scratch = Path(tempfile.mkdtemp(prefix="kafka-census-bench-pipeline-"))
    try:
        for n in sizes:
            results.append(measure(n, args.seed, args.file_mib, args.repeat, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table, notes = report(results, machine, args)
    cross = crossover(results) if len(results) > 1 else None
    if cross:
        notes += crossover_notes(cross)
    markdown = "\n".join(table + [""] + notes)
    print(markdown)
    write_result(args.out, {"machine": machine, "seed": args.seed, "repeat": args.repeat, "file_mib": args.file_mib,
                            "targets": TARGETS, "sizes": results, "crossover": cross,
                            "wall_seconds": time.perf_counter() - started, "markdown": markdown})
    return 0


if __name__ == "__main__":
    sys.exit(main())
