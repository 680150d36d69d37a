"""Fleet pipeline throughput (issue 30): `ingest` (event logs -> the Parquet table, parsed once)
and the two jobs over the ingested table on Spark `local[1]` and `local[2]`, against one Python
process over the same day's files, in the same run.

Input: one UTC day (2026-11-16) of N generated events as event-log files of six brokers, a new
file at 64 MiB (the exporter's default rotation size), cached in bench/data/pipeline-n<N>-s<seed>/
(`-f<MiB>` appended for another `--file-mib`; git ignores bench/data): schema 3 files as the
exporter writes them, each starting with the `ConnectionState` of the connections open then, the
other lines what a capture writes (bench/pipeline/data.py says which, and how many of each).

Measured for each `--events` size, each on wall time, best of `--repeat`:

* parse (one Python process): `json.loads` and the envelope checks of
  `exporter.eventlog.format.parse_line` for every line, nothing kept: one core's Python parse.
* baseline (one Python process): the two jobs' tables over the NDJSON with the table jobs'
  semantics (docs/pipeline.md: a connection is present on each UTC day it was connected, its
  first_seen and identity from its ConnectionOpened or ConnectionState and later records, the
  latest winning), in one pass (the parse, the envelope checks, dicts keyed by (source,
  conn_id)), each table written as CSV. A job's baseline is the pass plus its table; "both" is
  the pass plus both tables (one process running a day's two jobs parses once too).
* Spark, a fresh child process per run, as the CLI runs (`pipeline.cli.spark_session` and the
  CLI's own parser and runners): `ingest` into a fresh table on `local[1]` and `local[2]`;
  `inventory` and `upgrade-readiness` with `--input TABLE --since DAY --until DAY+1` (a daily
  run over the ingested day), each in its own process, on both masters; end to end (ingest, then both jobs, in one
  session) on `local[2]`. Times exclude the JVM/session start, reported apart. The jobs'
  Parquet is read back (after the timed part): rows and a checksum (sha256 of the sorted
  canonical rows) must equal the baseline's, and the ingest must quarantine nothing, or the run
  fails.

Events/s counts every line of the input (the parse reads them all; a job over the table stands
for the day's lines). The issue's targets: ingest per core (`local[1]`) >= 0.9x the parse,
`local[2]` >= 1.7x `local[1]`, each job on `local[2]` >= 5x its baseline, end to end on
`local[2]` >= 1x the baseline's both. Given two sizes or more, where Spark's fixed cost (session
start, stages) stops mattering: the size at which Spark, start included, overtakes one process,
from a straight line through the smallest and the largest size's times.

    python -m bench.pipeline [--events N ...] [--repeat 1] [--seed 1] [--file-mib 64]

Without `--events` it measures 2M and 10M events, the issue's sizes.

Prints a Markdown table and writes bench/results/pipeline.json.

The package, in the order a run uses it: `__main__` (the command line, also the child's entry,
`--child JSON`; one measurement per size; the results file); `data` (the generated day, cached);
`baseline` (the one-process parse and baseline, and the canonical rows both sides are compared
by); `spark` (one Spark run in a child process, as the CLI runs it); `measure` (one size, every
run, the figures and their targets, the crossover); `report` (the table and the notes). Shared
with other benchmarks: bench/machine.py (the machine's description), bench/runs.py (the file).
"""
