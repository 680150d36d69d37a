"""Leave-one-release-out and leave-one-library-out evaluations of the client fingerprints, per
connection and per client: prints markdown.

    .venv/bin/python -m bench.fingerprint_eval [--sweep] [--in-sample] [--per-connection] [--only unknown]

Every real recording (tests/fixtures/golden/*.json and tests/fixtures/fingerprints/*.pcap with
MANIFEST.json: the earlier clients, the Java client across releases and the Go clients) is decoded
by the capture core. Only the connections the census would infer are judged: those whose last
accepted ApiVersions exchange announced no KIP-511 software name (the name is read only to leave
the others out, never to infer). Each is judged twice against a table that does not know it:

- *per connection*: alone, as a capture that saw only it (the broker's maxima on its listener
  known, as any client's ApiVersions answer gives them to the census);
- *per client*: with the other unannounced connections of its client (the same client address,
  client_id and principal, within the registry's default `--sibling-window`; a connection without
  a client_id is a client of its own), folded into one `exporter.census.fingerprint.ClientBasis` whose
  observation is assessed, as exporter/census/identity.py's `_fingerprint` and pipeline/identity.py's
  `infer_client` do. Every connection of the client gets the client's verdict.

A connection is *right* when it is named the recording's library with a range containing its
true version, *wrong* when it is named anything else, *unknown* when `assess()` names no one.

- **Leave one release out**: the table is rebuilt (tools/gen_fingerprints.build_rows, the
  generator's own derivation) without every recording of the release (a library and version:
  sarama 1.45.2's four recordings go together). Java's rows come from the Kafka sources, every
  release, and its recordings only check them: leaving one out changes no Java row.
- **Leave one library out** (issue 26, the open-world rule): every recording, row and default
  client_id of the library is taken out, as if the census had never seen it: any name is wrong.
  Java is judged on its recordings and, as before they existed, on 750 synthetic silent
  connections built from its source vectors.

Also: the confusion between libraries (per connection and per client), the open-world bar
(`exporter.census.fingerprint.MIN_EXACT`) at other values (`--sweep`), and, with `--only unknown`, the
tables of docs/fingerprints.md's "What `unknown` still means" (per library and release line,
whether one connection alone can be named; which libraries the wire cannot tell apart), generated
from the same evaluations. The exit status is 1 if any table names anything wrong.
Not a speed benchmark: no timing, nothing to compare against a peer.

The package: `evaluation` (the tables left out, the connections and clients of a recording,
their verdicts and tallies; `evaluate`, `tally` and `library_out` are re-exported here for
tests/census/test_identity_fingerprints.py), `tables` (the Markdown, "What `unknown` still means" included) and
`__main__` (the command line).
"""

from bench.fingerprint_eval.evaluation import evaluate, library_out, tally

__all__ = ["evaluate", "library_out", "tally"]
