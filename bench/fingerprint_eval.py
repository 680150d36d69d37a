"""Leave-one-recording-out evaluation of the client fingerprints (issue 15): prints markdown.

    .venv/bin/python -m bench.fingerprint_eval [--per-connection]

For every real recording (tests/fixtures/golden/*.json and tests/fixtures/fingerprints/*.pcap),
the fingerprint table is rebuilt without it (tools/gen_fingerprints.build_rows, the same
derivation as the committed table) and every connection of the recording, decoded by the
capture core with its KIP-511 name never read, is inferred against that table. A connection is
*right* when it names the recording's library with a range containing its true version, *wrong*
when it names another library or a range that misses the truth, *unknown* when infer() gives
None. A recording is right when some connection is right and none is wrong; a recording whose client
sent nothing but ApiVersions (it failed against the broker) has no vector and is not judged.

Also: the confusion table between libraries (connections), and the share of connections the
wire leaves unannounced (no KIP-511 name: ApiVersions < v3 or none) that stay unknown.
Not a speed benchmark: no timing, nothing to compare against a peer.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict

from exporter.fingerprint import Fingerprints, observations_from_events, range_contains
from tools import gen_fingerprints as gen


def table_without(rows_dir, recordings, leave_out: str) -> Fingerprints:
    rows = gen.build_rows(rows_dir, [r for r in recordings if r.name != leave_out])
    return Fingerprints(rows, gen.releases_of(rows), gen.min_compatible_of(rows), gen.DEFAULT_CLIENT_IDS)


def announced(events) -> set[str]:
    """Connections whose wire carried a KIP-511 name (read only to split the figures, never to infer)."""
    return {e.conn_id for e in events if type(e).__name__ == "ClientSoftware" and e.name}


def evaluate(in_sample: bool = False):
    directory = gen.fingerprints_dir()
    recordings = gen.load_recordings()
    full = table_without(directory, recordings, leave_out="") if in_sample else None
    results = []
    for rec in recordings:
        table = full or table_without(directory, recordings, rec.name)
        events = gen.recording_events(rec.name)
        loud = announced(events)
        conns = []
        for conn_id, obs in sorted(observations_from_events(events).items()):
            got = table.infer(obs)
            if got is None:
                verdict = "unknown"
            elif got.name == rec.library and range_contains(got.version_range, rec.version):
                verdict = "right"
            else:
                verdict = "wrong"
            conns.append((conn_id, conn_id in loud, got, verdict))
        results.append((rec, conns))
    return results


def summarize(results) -> dict:
    per_rec = []
    confusion: dict[str, Counter] = defaultdict(Counter)
    unannounced = Counter()
    for rec, conns in results:
        verdicts = Counter(v for *_, v in conns)
        if not gen.informative(rec):
            rec_verdict = "no vector"  # the client sent nothing but ApiVersions (it failed against the broker)
        elif verdicts["wrong"]:
            rec_verdict = "wrong"
        elif verdicts["right"]:
            rec_verdict = "right"
        else:
            rec_verdict = "unknown"
        ranges = sorted({got.version_range for _, _, got, v in conns if v == "right"})
        per_rec.append((rec, rec_verdict, verdicts, ranges))
        for _, loud, got, verdict in conns:
            confusion[rec.library][got.name if got else "unknown"] += 1
            if not loud:
                unannounced["unknown" if got is None else verdict] += 1
    return {"recordings": per_rec, "confusion": confusion, "unannounced": unannounced}


def markdown(title: str, s: dict) -> str:
    out = [f"### {title}", ""]
    out += ["| recording | library | true version | verdict | connections right / wrong / unknown | ranges named |",
            "|---|---|---|---|---|---|"]
    for rec, verdict, v, ranges in s["recordings"]:
        out.append(f"| {rec.name} | {rec.library} | {rec.version} | {verdict} "
                   f"| {v['right']} / {v['wrong']} / {v['unknown']} "
                   f"| {', '.join(f'`{r}`' for r in ranges) or '-'} |")
    tally = Counter(verdict for _, verdict, _, _ in s["recordings"])
    n = len(s["recordings"]) - tally["no vector"]
    out += ["", f"Recordings with a vector: {tally['right']}/{n} right, {tally['wrong']} wrong, "
                f"{tally['unknown']} unknown"
            f" ({tally['no vector']} more sent nothing but ApiVersions: no vector to judge).", ""]
    libs = sorted(s["confusion"])
    cols = sorted({c for row in s["confusion"].values() for c in row} - {"unknown"}) + ["unknown"]
    out += ["Confusion (connections; rows: true library, columns: named):", "",
            "| true \\ named | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for lib in libs:
        out.append(f"| {lib} | " + " | ".join(str(s["confusion"][lib][c] or "") for c in cols) + " |")
    u = s["unannounced"]
    total = sum(u.values())
    if total:
        out += ["", f"Unannounced connections (no KIP-511 name on the wire): {total}; still unknown "
                f"{u['unknown']} ({u['unknown'] / total:.0%}), named right {u['right']} ({u['right'] / total:.0%}), "
                f"named wrong {u['wrong']}."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fingerprint_eval", description=__doc__.split("\n")[0])
    parser.add_argument("--in-sample", action="store_true", help="also the figures with every recording in the table")
    parser.add_argument("--per-connection", action="store_true", help="list every connection's inference")
    args = parser.parse_args(argv)
    loo = evaluate()
    print(markdown("Leave one recording out", summarize(loo)))
    if args.in_sample:
        print(markdown("Every recording in the table (in-sample)", summarize(evaluate(in_sample=True))))
    if args.per_connection:
        for rec, conns in loo:
            for conn_id, loud, got, verdict in conns:
                print(f"{rec.name:45} {conn_id:20} {'KIP-511' if loud else '-':8} {verdict:8} "
                      f"{got and (got.name, got.version_range, got.confidence)}")
    wrong = sum(1 for _, v, _, _ in summarize(loo)["recordings"] if v == "wrong")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
