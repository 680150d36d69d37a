"""Leave-one-recording-out and leave-one-library-out evaluations of the client fingerprints: prints markdown.

    .venv/bin/python -m bench.fingerprint_eval [--in-sample] [--per-connection]

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

Leave one library out (issue 26): every recording of a library, its default client_id patterns
(and, for Java, the rows derived from the Kafka sources) are taken out of the table, so the table
knows nothing of it, as of a library the census never recorded; then any name given to one of its
connections is wrong. Counted per connection and per client (a recording's connections with one
client_id). This is the evaluation the open-world rule (exporter/fingerprint.py MIN_EXACT) is
chosen on: it must give 0 wrong names for every library.
Not a speed benchmark: no timing, nothing to compare against a peer.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from exporter.fingerprint import Fingerprints, Observation, observations_from_events, range_contains
from tools import gen_fingerprints as gen


def table_without(rows_dir, recordings, leave_out: str) -> Fingerprints:
    rows = gen.build_rows(rows_dir, [r for r in recordings if r.name != leave_out])
    return Fingerprints(rows, gen.releases_of(rows), gen.min_compatible_of(rows), gen.DEFAULT_CLIENT_IDS)


def table_without_library(rows_dir, recordings, library: str) -> Fingerprints:
    """A table that knows nothing of `library`: none of its recordings, rows or default client_ids."""
    rows = [r for r in gen.build_rows(rows_dir, [r for r in recordings if r.library != library])
            if r.library != library]
    client_ids = {lib: pats for lib, pats in gen.DEFAULT_CLIENT_IDS.items() if lib != library}
    return Fingerprints(rows, gen.releases_of(rows), gen.min_compatible_of(rows), client_ids)


@dataclass
class LibraryOut:
    connections: int = 0  # connections with a vector (anything besides ApiVersions)
    clients: set = field(default_factory=set)  # (recording, client_id)
    wrong_connections: int = 0
    wrong_clients: set = field(default_factory=set)
    names: Counter = field(default_factory=Counter)  # "name range (confidence)" -> connections

    def judge(self, table: Fingerprints, obs: Observation, client: tuple) -> None:
        """One connection of `client`, inferred by a table that knows nothing of its library."""
        self.connections += 1
        self.clients.add(client)
        got = table.infer(obs)
        if got is not None:
            self.wrong_connections += 1
            self.wrong_clients.add(client)
            self.names[f"{got.name} {got.version_range} ({got.confidence})"] += 1


def evaluate_library_out(libraries=None) -> dict[str, LibraryOut]:
    """Per library (every recorded one, or `libraries`): its recordings against a table without it."""
    directory = gen.fingerprints_dir()
    recordings = gen.load_recordings()
    out: dict[str, LibraryOut] = {}
    for library in sorted(libraries or {r.library for r in recordings}):
        table = table_without_library(directory, recordings, library)
        res = out[library] = LibraryOut()
        for rec in recordings:
            if rec.library != library:
                continue
            for _conn_id, obs in sorted(observations_from_events(gen.recording_events(rec.name)).items()):
                if not any(key != 18 for key, _ in obs.requests):
                    continue  # nothing but ApiVersions: no vector
                res.judge(table, obs, (rec.name, obs.client_id))
    return out


# What a silent Java client (before 2.4: no KIP-511 fields) sends on one connection, by role: the
# Java client is not recorded yet, so its leave-one-out row is built from its source-derived vectors.
JAVA_ROLES = {"producer": (3, 0, 22, 10), "consumer": (3, 10, 11, 14, 12, 9, 1, 2), "metadata and produce": (3, 0),
              "metadata": (3,), "admin": (3, 19, 20, 32)}


def java_vectors(directory) -> dict[str, dict[int, int]]:
    """release -> api_key -> the highest version it sends (the generator's Java input)."""
    out: dict[str, dict[int, int]] = {}
    for line in (directory / gen.JAVA_TSV).read_text(encoding="utf-8").splitlines()[1:]:
        release, key, _name, top = line.split("\t")
        out.setdefault(release, {})[int(key)] = int(top)
    return out


def evaluate_java_out() -> LibraryOut:
    """Every silent Java release, in each role, against Tansu's caps, an unknown broker and an uncapping
    one, with Java's default client_id and a set one, inferred by a table with no Java rows."""
    directory = gen.fingerprints_dir()
    recordings = gen.load_recordings()
    table = table_without_library(directory, recordings, gen.JAVA)
    tansu = next(r for r in recordings if r.name == "golden/kafkajs").broker_max
    res = LibraryOut()
    for release, vec in java_vectors(directory).items():
        negotiates = release not in gen.JAVA_NO_APIVERSIONS
        if negotiates and vec[18] >= 3:
            continue  # announces itself (KIP-511)
        for broker in (tansu, None, {k: 99 for k in range(100)}):
            for role, keys in JAVA_ROLES.items():
                reqs = {(k, min(vec[k], broker[k]) if broker and negotiates else vec[k]): 1
                        for k in keys if k in vec and (broker is None or k in broker)}
                for client_id in ("producer-1", "orders-app"):
                    obs = Observation(vec[18] if negotiates else None, reqs, tuple(reqs)[:8], client_id, broker)
                    res.judge(table, obs, (release, role, client_id))
    return res


def library_out_markdown(res: dict[str, LibraryOut]) -> str:
    out = ["### Leave one library out (the table knows nothing of it: any name is wrong)", "",
           "| library left out | connections with a vector | named (wrong) | clients | clients named (wrong) |",
           "|---|---|---|---|---|"]
    for lib, r in res.items():
        out.append(f"| {lib} | {r.connections} | {r.wrong_connections} | {len(r.clients)} | {len(r.wrong_clients)} |")
    out += ["", f"Wrong names: {sum(r.wrong_connections for r in res.values())} connections, "
                f"{sum(len(r.wrong_clients) for r in res.values())} clients."]
    for lib, r in res.items():
        out += [f"- {lib} named {name}: {n} connections" for name, n in r.names.most_common()]
    return "\n".join(out) + "\n"


def sweep_markdown(values=(0, 2, 3, 4, 5)) -> str:
    """The open-world bar (fingerprint.MIN_EXACT) chosen on the evaluations: per candidate value, the
    wrong names leaving each library out, and what leaving each recording out still names right."""
    from exporter import fingerprint

    out = ["### Choosing the open-world bar (exact versions needed without a default client_id)", "",
           "| MIN_EXACT | wrong names, library left out (connections / clients) "
           "| recordings named right, recording left out | unannounced connections named right |",
           "|---|---|---|---|"]
    kept = fingerprint.MIN_EXACT
    try:
        for value in values:
            fingerprint.MIN_EXACT = value
            lib = evaluate_library_out()
            lib["java"] = evaluate_java_out()
            summary = summarize(evaluate())
            right = sum(1 for _, v, _, _ in summary["recordings"] if v == "right")
            judged = sum(1 for _, v, _, _ in summary["recordings"] if v != "no vector")
            unannounced = summary["unannounced"]
            mark = " (chosen)" if value == kept else " (no bar, before issue 26)" if value == 0 else ""
            out.append(f"| {value}{mark} | {sum(r.wrong_connections for r in lib.values())} / "
                       f"{sum(len(r.wrong_clients) for r in lib.values())} | {right}/{judged} "
                       f"| {unannounced['right']}/{sum(unannounced.values())} |")
    finally:
        fingerprint.MIN_EXACT = kept
    return "\n".join(out) + "\n"


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
    parser.add_argument("--sweep", action="store_true", help="also both evaluations at other open-world bars")
    args = parser.parse_args(argv)
    loo = evaluate()
    print(markdown("Leave one recording out", summarize(loo)))
    library_out = evaluate_library_out()
    library_out[f"{gen.JAVA} (synthetic: before 2.4, from its sources)"] = evaluate_java_out()
    print(library_out_markdown(library_out))
    if args.sweep:
        print(sweep_markdown())
    if args.in_sample:
        print(markdown("Every recording in the table (in-sample)", summarize(evaluate(in_sample=True))))
    if args.per_connection:
        for rec, conns in loo:
            for conn_id, loud, got, verdict in conns:
                print(f"{rec.name:45} {conn_id:20} {'KIP-511' if loud else '-':8} {verdict:8} "
                      f"{got and (got.name, got.version_range, got.confidence)}")
    wrong = sum(1 for _, v, _, _ in summarize(loo)["recordings"] if v == "wrong")
    return 1 if wrong or any(r.wrong_connections for r in library_out.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
