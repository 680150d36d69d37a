"""`python -m bench.fingerprint_eval`: the command line; prints the tables of
bench/fingerprint_eval/tables.py and exits 1 if any names anything wrong. The evaluation is
described in bench/fingerprint_eval/__init__.py.
"""

from __future__ import annotations

import argparse
import sys

import bench.fingerprint_eval
from bench.fingerprint_eval.evaluation import evaluate, library_out, tally
from bench.fingerprint_eval.tables import (
    library_out_markdown,
    release_markdown,
    summary_markdown,
    sweep_markdown,
    unknown_markdown,
)
from exporter.census.fingerprint import Inference


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fingerprint_eval",
                                     description=bench.fingerprint_eval.__doc__.split("\n")[0])
    parser.add_argument("--in-sample", action="store_true", help="also the figures with every recording in the table")
    parser.add_argument("--per-connection", action="store_true", help="list every connection's inference")
    parser.add_argument("--sweep", action="store_true", help="also both evaluations at other open-world bars")
    parser.add_argument("--only", choices=["unknown"],
                        help="unknown: only the tables of docs/fingerprints.md's \"What `unknown` still means\"")
    args = parser.parse_args(argv)
    if args.only == "unknown":
        print(unknown_markdown())
        return 0
    release = evaluate("release")
    libs = library_out()
    print(summary_markdown(tally(release), libs))
    print(release_markdown(release))
    print(library_out_markdown(libs))
    if args.sweep:
        print(sweep_markdown())
    if args.in_sample:
        print(release_markdown(evaluate("in-sample"), "Every recording in the table (in-sample)"))
    if args.per_connection:
        for r in release:
            for j in r.conns:
                alone = j.alone if isinstance(j.alone, Inference) else None
                together = j.together if isinstance(j.together, Inference) else None
                print(f"{r.rec.name:50} {j.conn.conn_id:24} client {j.client:<3} {j.v_alone:8} "
                      f"{alone and (alone.name, alone.version_range)}  {j.v_together:8} "
                      f"{together and (together.name, together.version_range)}")
    wrong = tally(release).wrong + sum(t.wrong for t in libs.values())
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
