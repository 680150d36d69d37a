"""bench.pipeline's Markdown: the table (events/s of each run, one process against Spark
`local[1]` and `local[2]`, each figure against its target) and the notes under it.
"""

from __future__ import annotations

from bench.pipeline.baseline import JOBS
from bench.pipeline.data import HOSTS
from bench.pipeline.measure import MASTERS, TARGETS


def _rate(n: int, seconds: float, start: float | None = None) -> str:
    extra = "" if start is None else f" + {start:.1f} s start"
    return f"{n / seconds:,.0f} ev/s ({seconds:.1f} s{extra})"


def _vs(value: float, target: str) -> str:
    goal = TARGETS[target]
    return f"**{value:.2f}x** (target {goal:g}x: {'met' if value >= goal else 'missed'})"


def report(sizes: list[dict], machine: str, args) -> tuple[list[str], list[str]]:
    table = ["| events | run | one Python process | Spark local[1] | Spark local[2] | figure |",
             "|---:|---|---:|---:|---:|---|"]
    notes = [f"Machine: {machine}."]
    for res in sizes:
        n, s, b = res["events"], res["summary"], res["baseline"]
        ing, jobs, e = res["ingest"], res["jobs"], res["end_to_end"]
        table.append(f"| {n:,} | parse → ingest | {_rate(n, res['parse']['seconds'])} | "
                     + " | ".join(_rate(n, ing[m]["ingest"]["seconds"], ing[m]["startup_seconds"]) for m in MASTERS)
                     + f" | per core {_vs(s['ingest_per_core'], 'ingest_per_core')}; local[2] / local[1] "
                     f"{_vs(s['ingest_scaling'], 'ingest_scaling')} |")
        for job in JOBS:
            table.append(f"| | {job} over the day's table | {_rate(n, b['seconds'][job])} | "
                         + " | ".join(_rate(n, jobs[m][job]["seconds"], jobs[m][job]["startup_seconds"])
                                      for m in MASTERS)
                         + f" | local[2] {_vs(s[job]['local2_over_baseline'], job)} |")
        table.append(f"| | end to end (ingest + both jobs) | {_rate(n, b['seconds']['both'])} | | "
                     f"{_rate(n, e['seconds'], e['startup_seconds'])} | "
                     f"{_vs(s['end_to_end']['over_baseline'], 'end_to_end')}; with the session start "
                     f"{s['end_to_end']['over_baseline_with_start']:.2f}x |")
        starts = [ing[m]["startup_seconds"] for m in MASTERS] + [jobs[m][j]["startup_seconds"] for m in MASTERS
                                                                   for j in JOBS] + [e["startup_seconds"]]
        peaks = {f"ingest {m}": ing[m].get("driver_peak_rss_mb") for m in MASTERS}
        peaks.update({f"{j} {m}": jobs[m][j].get("driver_peak_rss_mb") for m in MASTERS for j in JOBS})
        peaks["end to end"] = e.get("driver_peak_rss_mb")
        loads = {"parse": res["parse"]["loadavg_1min"], "baseline": b["loadavg_1min"],
                 **{f"ingest {m}": ing[m]["loadavg_1min"] for m in MASTERS},
                 **{f"{j} {m}": jobs[m][j]["loadavg_1min"] for m in MASTERS for j in JOBS},
                 "end to end": e["loadavg_1min"]}
        notes.append(
            f"{n:,} events: {res['bytes'] / 1e9:.2f} GB of NDJSON in {res['files']} files ({len(HOSTS)} brokers, "
            f"one day, {res['states']:,} ConnectionState lines), ingested into {res['table_bytes'] / 2**20:,.1f} MiB "
            f"of Parquet; baseline pass {b['pass_seconds']:.1f} s, {b['connections']:,} connections, "
            + ", ".join(f"{j} {b['rows'][j]:,} rows" for j in JOBS) + " (Spark's agree by checksum); session "
            f"start {min(starts):.1f}-{max(starts):.1f} s per run. Driver peak memory (the JVM's VmHWM, executors "
            "included): " + ", ".join(f"{k} {'?' if v is None else f'{v:,.0f} MiB'}" for k, v in peaks.items())
            + ". 1-min load average at the end of each run (above 2 on 2 cores: other work shared them): "
            + ", ".join(f"{k} {v:.1f}" for k, v in loads.items()) + ".")
    notes.append(f"Best of {args.repeat}, seed {args.seed}; Spark times exclude the JVM/session start (shown apart).")
    return table, notes


def crossover_notes(cross: dict) -> list[str]:
    out = []
    for name, c in cross.items():
        what = "end to end" if name == "end_to_end" else f"{name} over the table"
        at = c["overtakes_at_events"]
        where = ("never overtakes it (its cost per event is not below one process's)" if at is None
                 else f"overtakes it from about {at / 1e6:,.1f}M events")
        out.append(f"Spark local[2] {what}, session start included: {c['spark_fixed_seconds']:.1f} s fixed + "
                   f"{c['spark_seconds_per_million']:.1f} s per million events, one process "
                   f"{c['baseline_fixed_seconds']:.1f} s + {c['baseline_seconds_per_million']:.1f} s per million: "
                   f"Spark {where}.")
    return out
