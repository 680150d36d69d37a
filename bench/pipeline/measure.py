"""One size of bench.pipeline, every run: the data set, the parse, the baseline, Spark's
ingest on each master, each job over the ingested table, end to end; every Spark table checked
against the baseline's. Then the figures the issue sets targets for (`summarise`) and, over two
sizes or more, where Spark overtakes one process (`crossover`).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from bench.pipeline.baseline import JOBS, run_baseline, run_parse
from bench.pipeline.data import generate
from bench.pipeline.spark import run_spark

MASTERS = ("local[1]", "local[2]")
E2E_MASTER = "local[2]"
# The targets (section 3): what each ratio must reach.
TARGETS = {"ingest_per_core": 0.9, "ingest_scaling": 1.7, "inventory": 5.0, "upgrade-readiness": 5.0,
           "end_to_end": 1.0}


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _best(runs: list[dict], seconds) -> dict:
    return {**min(runs, key=seconds), "runs": [seconds(r) for r in runs]}


def _check(what: str, got: dict, baseline: dict, job: str) -> None:
    """A Spark job's table must be the baseline's, row for row."""
    want = (baseline["rows"][job], baseline["checksum"][job])
    if (got["rows"], got["checksum"]) != want:
        raise SystemExit(f"error: {what} {job} disagrees with the baseline: {got['rows']} rows {got['checksum'][:12]} "
                         f"vs {want[0]} rows {want[1][:12]}")


def _check_ingest(what: str, summary: dict) -> None:
    if summary.get("quarantined_lines"):
        raise SystemExit(f"error: {what} quarantined {summary['quarantined_lines']} lines of the generated input")


def measure(n_events: int, seed: int, file_mib: int, repeat: int, scratch: Path) -> dict:
    data_dir, manifest, fresh = generate(n_events, seed, file_mib)
    files = [data_dir / f for f in manifest["files"]]
    lines = manifest["events"]
    _say(f"data: {lines:,} events ({manifest['states']:,} ConnectionState), {manifest['bytes'] / 1e9:.2f} GB in "
         f"{len(files)} files ({data_dir}; {'generated' if fresh else 'cached, generated'} in "
         f"{manifest['generate_seconds']} s)")
    res: dict = {"events": lines, "requested": n_events, "bytes": manifest["bytes"], "files": len(files),
                 "states": manifest["states"], "day": manifest["day"]}

    res["parse"] = _best([run_parse(files) for _ in range(repeat)], lambda r: r["seconds"])
    p = res["parse"]
    if (p["lines"], p["bad"]) != (lines, 0):
        raise SystemExit(f"error: the parse read {p['lines']} lines, {p['bad']} bad; the manifest says {lines}, 0 bad")
    _say(f"parse (1 process): {p['seconds']:.1f} s")
    res["baseline"] = _best([run_baseline(files, scratch / "baseline") for _ in range(repeat)],
                            lambda r: r["seconds"]["both"])
    b = res["baseline"]
    if b["bad"]:
        raise SystemExit(f"error: the baseline refused {b['bad']} lines of the generated input")
    _say(f"baseline (1 process): pass {b['pass_seconds']:.1f} s, both tables {b['seconds']['both']:.1f} s, "
         + ", ".join(f"{j} {b['rows'][j]} rows" for j in JOBS))

    res["ingest"] = {}
    table = None
    for master in MASTERS:
        runs = []
        for i in range(repeat):
            path = scratch / f"table-{master[6]}-{i}"
            r = run_spark({"kind": "ingest", "master": master, "input": str(data_dir), "table": str(path)})
            _check_ingest(f"Spark {master} ingest", r["ingest"]["summary"])
            _say(f"spark {master} ingest: {r['ingest']['seconds']:.1f} s (+{r['startup_seconds']:.1f} s start), "
                 f"{r['ingest']['summary'].get('rows')} rows")
            runs.append(r)
            if table is None and master == MASTERS[-1]:
                table = path  # the jobs read this one
            else:
                shutil.rmtree(path, ignore_errors=True)
        res["ingest"][master] = _best(runs, lambda r: r["ingest"]["seconds"])
    res["table_bytes"] = _du(table)

    res["jobs"] = {master: {} for master in MASTERS}
    for master in reversed(MASTERS):
        for job in JOBS:
            runs = []
            for _ in range(repeat):
                out = scratch / f"job-{master[6]}"
                r = run_spark({"kind": "job", "job": job, "master": master, "table": str(table), "output": str(out)})
                shutil.rmtree(out, ignore_errors=True)
                _check(f"Spark {master}", r[job], b, job)
                _say(f"spark {master} {job} over the table: {r[job]['seconds']:.1f} s "
                     f"(+{r['startup_seconds']:.1f} s start)")
                runs.append({**r[job], **{k: r[k] for k in ("startup_seconds", "loadavg_1min", "driver_peak_rss_mb")}})
            res["jobs"][master][job] = _best(runs, lambda x: x["seconds"])
    shutil.rmtree(table, ignore_errors=True)

    runs = []
    for i in range(repeat):
        path, out = scratch / f"e2e-table-{i}", scratch / f"e2e-{i}"
        r = run_spark({"kind": "e2e", "master": E2E_MASTER, "input": str(data_dir), "table": str(path),
                       "output": str(out)})
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        _check_ingest(f"Spark {E2E_MASTER} end to end", r["ingest"]["summary"])
        for job in JOBS:
            _check(f"Spark {E2E_MASTER} end to end", r[job], b, job)
        r["seconds"] = r["ingest"]["seconds"] + sum(r[j]["seconds"] for j in JOBS)
        _say(f"spark {E2E_MASTER} end to end: {r['seconds']:.1f} s (ingest {r['ingest']['seconds']:.1f} s, "
             + ", ".join(f"{j} {r[j]['seconds']:.1f} s" for j in JOBS) + f"; +{r['startup_seconds']:.1f} s start)")
        runs.append(r)
    res["end_to_end"] = _best(runs, lambda r: r["seconds"])
    res["summary"] = summarise(res)
    return res


def summarise(res: dict) -> dict:
    """Events/s of every run and the issue's ratios, with whether each target is met."""
    n = res["events"]
    b = res["baseline"]
    ingest = {m: n / res["ingest"][m]["ingest"]["seconds"] for m in MASTERS}
    s = {"parse_events_per_second": n / res["parse"]["seconds"], "ingest_events_per_second": ingest}
    s["ingest_per_core"] = ingest["local[1]"] / s["parse_events_per_second"]
    s["ingest_scaling"] = ingest["local[2]"] / ingest["local[1]"]
    for job in JOBS:
        spark = {m: n / res["jobs"][m][job]["seconds"] for m in MASTERS}
        base = n / b["seconds"][job]
        s[job] = {"baseline_events_per_second": base, "events_per_second": spark,
                  "local1_over_baseline": spark["local[1]"] / base, "local2_over_baseline": spark["local[2]"] / base}
    e = res["end_to_end"]
    s["end_to_end"] = {"baseline_events_per_second": n / b["seconds"]["both"],
                       "events_per_second": n / e["seconds"],
                       "over_baseline": b["seconds"]["both"] / e["seconds"],
                       "over_baseline_with_start": b["seconds"]["both"] / (e["seconds"] + e["startup_seconds"])}
    figures = {"ingest_per_core": s["ingest_per_core"], "ingest_scaling": s["ingest_scaling"],
               **{job: s[job]["local2_over_baseline"] for job in JOBS},
               "end_to_end": s["end_to_end"]["over_baseline"]}
    s["met"] = {k: figures[k] >= TARGETS[k] for k in TARGETS}
    return s


def crossover(sizes: list[dict]) -> dict:
    """Where Spark (local[2], session start included) overtakes one process: each side's time as
    fixed + per-event cost, a straight line through the smallest and the largest size."""
    lo, hi = min(sizes, key=lambda r: r["events"]), max(sizes, key=lambda r: r["events"])

    def line(seconds) -> tuple[float, float]:
        slope = (seconds(hi) - seconds(lo)) / (hi["events"] - lo["events"])
        return seconds(lo) - slope * lo["events"], slope

    spark_runs = {"end_to_end": lambda r: r["end_to_end"]["seconds"] + r["end_to_end"]["startup_seconds"],
                  **{job: (lambda r, job=job: r["jobs"][E2E_MASTER][job]["seconds"]
                           + r["jobs"][E2E_MASTER][job]["startup_seconds"]) for job in JOBS}}
    base_runs = {"end_to_end": lambda r: r["baseline"]["seconds"]["both"],
                 **{job: (lambda r, job=job: r["baseline"]["seconds"][job]) for job in JOBS}}
    out = {}
    for name, spark in spark_runs.items():
        fixed, slope = line(spark)
        base_fixed, base_slope = line(base_runs[name])
        at = (fixed - base_fixed) / (base_slope - slope) if base_slope > slope else None
        out[name] = {"spark_fixed_seconds": fixed, "spark_seconds_per_million": slope * 1e6,
                     "baseline_fixed_seconds": base_fixed, "baseline_seconds_per_million": base_slope * 1e6,
                     "overtakes_at_events": None if at is None else max(0.0, at)}
    return out
