"""bench.fingerprint_eval's Markdown: the summary, leave one release out (with its confusion
tables), leave one library out, the open-world bar at other values (`sweep_markdown`), and the
tables of docs/fingerprints.md's "What `unknown` still means" (`unknown_markdown`: per library and
release line, the libraries the wire cannot tell apart). Computes nothing but counts of the
evaluation's verdicts, and the pairs of table rows that send the same versions.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from bench.fingerprint_eval.evaluation import (
    VERDICTS,
    Conn,
    RecordingResult,
    Tally,
    cached_table,
    evaluate,
    library_out,
    tally,
)
from exporter.census import fingerprint
from exporter.census.basis import FINGERPRINT_THRESHOLD
from exporter.census.fingerprint import JAVA, Fingerprints, Inference, Unknown
from tools import gen_fingerprints as gen


def _rwu(c: Counter) -> str:
    return " / ".join(str(c[v]) for v in VERDICTS)


def summary_markdown(release: Tally, libs: dict[str, Tally]) -> str:
    recorded = Tally()
    for name, t in libs.items():
        if "synthetic" not in name:
            for attr in ("alone", "together", "clients"):
                getattr(recorded, attr).update(getattr(t, attr))
    synthetic = next(t for name, t in libs.items() if "synthetic" in name)
    out = ["### Summary: unannounced connections, right / wrong / unknown", "",
           "| evaluation | connections (clients) | per connection | per client: connections | per client: clients |",
           "|---|---:|---:|---:|---:|"]
    for title, t in (("leave one release out", release), ("leave one library out (any name is wrong)", recorded),
                     ("leave Java out, synthetic (any name is wrong)", synthetic)):
        out.append(f"| {title} | {t.connections} ({sum(t.clients.values())}) | {_rwu(t.alone)} "
                   f"| {_rwu(t.together)} | {_rwu(t.clients)} |")
    return "\n".join(out) + "\n"


def confusion_markdown(t: Tally) -> str:
    out = []
    for title, conf in (("per connection", t.confusion_alone), ("per client", t.confusion_together)):
        cols = sorted({c for row in conf.values() for c in row} - {"unknown"}) + ["unknown"]
        out += [f"Confusion {title} (connections; rows: true library, columns: named):", "",
                "| true \\ named | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for lib in sorted(conf):
            out.append(f"| {lib} | " + " | ".join(str(conf[lib][c] or "") for c in cols) + " |")
        out.append("")
    return "\n".join(out)


def _releases(results) -> str:
    by_lib: dict[str, set[str]] = defaultdict(set)
    for r in results:
        by_lib[r.rec.library].add(r.rec.version)
    return "; ".join(f"{lib} {', '.join(sorted(v, key=gen.version_key))}" for lib, v in sorted(by_lib.items()))


def release_markdown(results: list[RecordingResult], title: str = "Leave one release out") -> str:
    out = [f"### {title}", "",
           "| recording | library | true version | unannounced connections (clients) | alone: right / wrong / unknown "
           "| as clients: right / wrong / unknown | ranges named (as clients) |",
           "|---|---|---|---:|---:|---:|---|"]
    silent = []
    for r in results:
        if not r.conns:
            silent.append(r)
            continue
        ranges = sorted({j.together.version_range for j in r.conns if j.v_together == "right"
                         and isinstance(j.together, Inference)})
        out.append(f"| {r.rec.name} | {r.rec.library} | {r.rec.version} | {len(r.conns)} ({r.clients}) "
                   f"| {_rwu(Counter(j.v_alone for j in r.conns))} | {_rwu(Counter(j.v_together for j in r.conns))} "
                   f"| {', '.join(f'`{x}`' for x in ranges) or '-'} |")
    t = tally(results)
    out += ["", f"Unannounced connections: {t.connections} in {sum(t.clients.values())} clients. Per connection: "
                + ", ".join(f"{t.alone[v]} {v}" for v in VERDICTS) + ". Per client: "
                + ", ".join(f"{t.together[v]} {v}" for v in VERDICTS) + f" (clients: {_rwu(t.clients)}).",
            "", f"Not judged: {len(silent)} recordings whose every connection announced its software "
                f"({sum(r.announced for r in silent)} connections): " + _releases(silent) + ".", ""]
    return "\n".join(out) + "\n" + confusion_markdown(t)


def library_out_markdown(res: dict[str, Tally]) -> str:
    out = ["### Leave one library out (the table knows nothing of it: any name is wrong)", "",
           "| library left out | unannounced connections (clients) | named alone (wrong) "
           "| named as clients: connections (wrong) | clients (wrong) |",
           "|---|---:|---:|---:|---:|"]
    for lib, t in res.items():
        out.append(f"| {lib} | {t.connections} ({sum(t.clients.values())}) | {t.alone['wrong']} "
                   f"| {t.together['wrong']} | {t.clients['wrong']} |")
    out += ["", f"Wrong names: {sum(t.alone['wrong'] for t in res.values())} connections alone, "
                f"{sum(t.together['wrong'] for t in res.values())} as clients "
                f"({sum(t.clients['wrong'] for t in res.values())} clients)."]
    for lib, t in res.items():
        out += [f"- {lib} named {name}: {n} connections" for name, n in t.wrong_names.most_common()]
    return "\n".join(out) + "\n"


def sweep_markdown(values=(0, 2, 3, 4, 5)) -> str:
    """The open-world bar (fingerprint.MIN_EXACT) chosen on the evaluations: per candidate value, the
    wrong names of both evaluations and what leaving each release out still names right."""
    out = ["### Choosing the open-world bar (exact versions needed without a default client_id)", "",
           "| MIN_EXACT | wrong, library left out: alone / as clients (connections) "
           "| wrong, release left out: alone / as clients | right, release left out: alone / as clients |",
           "|---|---:|---:|---:|"]
    kept = fingerprint.MIN_EXACT
    try:
        for value in values:
            fingerprint.MIN_EXACT = value
            libs = library_out()
            rel = tally(evaluate("release"))
            mark = " (chosen)" if value == kept else " (no bar, before issue 26)" if value == 0 else ""
            out.append(f"| {value}{mark} | {sum(t.alone['wrong'] for t in libs.values())} / "
                       f"{sum(t.together['wrong'] for t in libs.values())} "
                       f"| {rel.alone['wrong']} / {rel.together['wrong']} "
                       f"| {rel.alone['right']} / {rel.together['right']} of {rel.connections} |")
    finally:
        fingerprint.MIN_EXACT = kept
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------- what `unknown` still means


def release_line(library: str, version: str) -> str:
    """Java: the release without its patch (0.10.2, 2.3); others: major.minor."""
    parts = version.split(".")
    return ".".join(parts[:-1]) if library == JAVA else ".".join(parts[:2])


def why(found: Inference | Unknown, conn: Conn) -> str:
    """Why a connection alone stays unknown, in a few words."""
    if not any(k != 18 for k, _ in conn.obs.requests):
        return "nothing but ApiVersions"
    reason = found.reason if isinstance(found, Unknown) else ""
    for pattern, words in ((r"exact version", f"fewer than {fingerprint.MIN_EXACT} exact versions"),
                           (r"several libraries", "several libraries fit"),
                           (r"configured protocol version", "sarama without its default client_id"),
                           (r"default, the versions are not", "its client_id's library never sent these versions"),
                           (r"no recorded release", "no recorded release sends it"),
                           (r"confidence", f"confidence < {FINGERPRINT_THRESHOLD}")):
        if re.search(pattern, reason):
            return words
    return reason or "named wrong"


def lines_markdown(results: list[RecordingResult]) -> str:
    """Per library and release line: whether one connection alone is named (leave one release out)."""
    lines: dict[tuple[str, str], list[RecordingResult]] = defaultdict(list)
    for r in results:
        lines[(r.rec.library, release_line(r.rec.library, r.rec.version))].append(r)
    out = ["| library | line (recorded releases) | unannounced connections | named alone | named as a client "
           "| one connection alone | why the others stay unknown alone |",
           "|---|---|---:|---:|---:|---|---|"]
    loud: list[tuple[str, str, str]] = []  # consecutive lines of one library that announce themselves

    def flush() -> None:
        if loud:
            lib, first, last = loud[0][0], loud[0][1], loud[-1][1]
            releases = ", ".join(v for *_, v in loud)
            out.append(f"| {lib} | {first if first == last else f'{first} to {last}'} ({releases}) | 0 | - | - "
                       "| announces itself (KIP-511) | - |")
            loud.clear()

    for (lib, line), rs in sorted(lines.items(), key=lambda kv: (kv[0][0], gen.version_key(kv[0][1]))):
        judged = [j for r in rs for j in r.conns]
        releases = ", ".join(sorted({r.rec.version for r in rs}, key=gen.version_key))
        if loud and loud[0][0] != lib:
            flush()
        if not judged:
            loud.append((lib, line, releases))
            continue
        flush()
        alone = sum(j.v_alone == "right" for j in judged)
        together = sum(j.v_together == "right" for j in judged)
        can = "every one" if alone == len(judged) else "some" if alone else "none"
        reasons = Counter(why(j.alone, j.conn) for j in judged if j.v_alone != "right")
        out.append(f"| {lib} | {line} ({releases}) | {len(judged)} | {alone} | {together} | {can} | "
                   + ("; ".join(f"{w} ({n})" for w, n in reasons.most_common()) or "-") + " |")
    flush()
    return "\n".join(out) + "\n"


def _agree(a, b) -> tuple[list[int], list[int]] | None:
    """Two rows against a broker that caps neither: (APIs both pin at one same version, APIs that set
    them apart), or None when no first ApiVersions request is theirs alike."""
    if not set(a.apiversions) & set(b.apiversions):
        return None
    ca = {k: (lo, None if hi < 0 else hi) for k, lo, hi in a.constraints}
    cb = {k: (lo, None if hi < 0 else hi) for k, lo, hi in b.constraints}
    same, apart = [], []
    for k in sorted(set(ca) & set(cb)):
        (l1, h1), (l2, h2) = ca[k], cb[k]
        if (h1 is not None and l2 > h1) or (h2 is not None and l1 > h2):
            apart.append(k)
        elif l1 == h1 == l2 == h2:
            same.append(k)
    # A complete row (Java) cannot send an API it lacks: one the other row pins sets them apart.
    apart += sorted(k for k in cb if k not in ca and a.complete) + sorted(k for k in ca if k not in cb and b.complete)
    return same, sorted(set(apart))


def _silent(row) -> bool:
    """A row an unannounced connection can match: not Java 2.4+ (it announces in every v3+)."""
    return not (row.library == JAVA and all(av is not None and av >= 3 for av in row.apiversions))


def _api(key: int) -> str:
    from capture.kafka.api_table import API_TABLE

    spec = API_TABLE.get(key)
    return spec.name if spec is not None else f"api {key}"


def pairs_markdown(table: Fingerprints, least: int = 3) -> str:
    """Pairs of libraries with releases that send the same versions of `least` or more APIs (from the
    table's rows, against a broker that caps neither), and the APIs that set them apart: per pair of
    libraries, the releases that share the most with nothing apart (the same vector), and the
    releases that share the most of all, when they are others."""
    best: dict[tuple[str, str, bool], tuple] = {}  # (library, library, the same vector) -> the closest
    rows = [r for r in table.rows if _silent(r)]
    for a in rows:
        for b in rows:
            if a.library >= b.library:
                continue
            found = _agree(a, b)
            if found is None:
                continue
            same, apart = found
            score = (len(same), -len(apart))
            for key in {(a.library, b.library, not apart), (a.library, b.library, False)}:
                if score > best.get(key, ((-1, 0),))[0]:
                    best[key] = (score, a, b, same, apart)
    out = ["| libraries | closest releases | versions both send | what sets them apart |", "|---|---|---|---|"]
    shown = set()
    # The same vectors first, then by the versions shared.
    order = sorted(best.items(), key=lambda kv: (bool(kv[1][4]), -kv[1][0][0], kv[0]))
    for (x, y, _), (_score, a, b, same, apart) in order:
        if len(same) < least or (a, b) in shown:
            continue
        shown.add((a, b))
        rel = " / ".join(f"{r.versions[0]}{'-' + r.versions[-1] if len(r.versions) > 1 else ''}" for r in (a, b))
        cons = {k: lo for k, lo, _hi in a.constraints}
        out.append(f"| {x} / {y} | {rel} | {len(same)}: " + ", ".join(f"{_api(k)} v{cons[k]}" for k in same)
                   + f" | {', '.join(_api(k) for k in apart) or 'nothing: the same vector'} |")
    return "\n".join(out) + "\n"


def several_markdown(sample: list[RecordingResult], most: int = 8) -> str:
    """The candidates of the recorded connections that stay unknown because several libraries fit
    (every recording in the table): per set of libraries, connections alone and as clients."""
    sets: dict[tuple[str, ...], Counter] = defaultdict(Counter)
    for r in sample:
        for j in r.conns:
            for how, found in (("alone", j.alone), ("as clients", j.together)):
                if isinstance(found, Unknown) and "several libraries" in found.reason:
                    sets[tuple(sorted({c.split(" ", 1)[0] for c in found.candidates}))][how] += 1
    out = ["| candidates (every recording in the table) | connections alone | connections as clients |",
           "|---|---:|---:|"]
    for libs, n in sorted(sets.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:most]:
        out.append(f"| {', '.join(libs)} | {n['alone']} | {n['as clients']} |")
    return "\n".join(out) + "\n"


def unknown_markdown() -> str:
    """The body of docs/fingerprints.md's "What `unknown` still means" (its tables), generated."""
    release = evaluate("release")
    sample = evaluate("in-sample")
    return ("### One connection alone, per library and release line\n\n" + lines_markdown(release)
            + "\n### Libraries the wire cannot tell apart\n\n" + pairs_markdown(cached_table("in-sample", None))
            + "\n" + several_markdown(sample))
