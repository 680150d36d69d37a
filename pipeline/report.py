"""`report`: the fleet tables and three charts in one self-contained HTML file.

Owns the report's content and markup: the header (when, inputs, window, counts), the
upgrade-readiness verdict and table (and by software: the unannounced clients named by sibling
or fingerprint, `pipeline.identity`), inline SVG charts (version adoption over time, share of
connections without a client identity, requests with removed API versions by client), the
inventory, adoption and api-usage tables, and who writes and reads each topic (issue 31,
`pipeline.lineage`). The tables come from `pipeline.jobs` and `pipeline.lineage` over
`pipeline.events`, exactly what the table jobs write, and are also written next to the HTML
(Parquet and CSV, `pipeline.jobs.write_table`), so a table cut at `MAX_TABLE_ROWS` in the
page points at its full CSV. Imports pyspark and `pipeline`'s events, identity, jobs, lineage,
errors and files; never `pipeline.cli`, which alone imports it.

Self-contained and safe to attach to a ticket: no script, no external stylesheet, font,
image or link (only `#` anchors); charts are SVG drawn here. Every string from the data
(client ids, principals, software names come from the wire) goes through `html.escape`.
Printable: charts and legends are vector, colours print (`print-color-adjust: exact`), table
headers repeat on each page, and no row is split across pages.
"""

from __future__ import annotations

import html
import math
import time
from datetime import UTC, date, datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.errors import UsageError
from pipeline.files import load_input, write_file
from pipeline.jobs import UNKNOWN

REPORT_NAME = "kafka-census-report.html"
MAX_TABLE_ROWS = 500  # rows per table in the page; the CSV next to it has them all
TOP_VERSIONS = 8  # series in the adoption chart; the rest are summed as "other"
TOP_CLIENTS = 25  # bars in the removed-versions chart; the rest are counted in a note
MAX_DAILY_BARS = 120  # above this many days the time charts count per ISO week
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")  # Okabe-Ito
UNKNOWN_COLOUR = "#8C8C8C"
OTHER_COLOUR = "#D0D0D0"
OTHER = "other"
NONE_TEXT = "\u2014"  # em dash for a missing value


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _fmt(value) -> str:
    if value is None:
        return NONE_TEXT
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return "; ".join(str(v) for v in value) or NONE_TEXT
    return str(value)


def _utc(ts: float | None) -> str:
    if ts is None:
        return NONE_TEXT
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# ---------------------------------------------------------------------------------------------
# Data: Spark -> small Python lists


def _strings_for_timestamps(df: DataFrame) -> DataFrame:
    """Timestamps formatted by Spark in the session time zone (UTC): collecting them as
    datetimes would apply the driver's local time zone."""
    return df.select([F.date_format(f.name, "yyyy-MM-dd HH:mm:ss").alias(f.name)
                      if f.dataType.typeName() in ("timestamp", "timestamp_ntz") else F.col(f.name)
                      for f in df.schema.fields])


def _rows(df: DataFrame, limit: int) -> list[dict]:
    return [r.asDict() for r in _strings_for_timestamps(df).limit(limit).collect()]


def _buckets(days: list[date]) -> tuple[str, dict[date, date], list[date]]:
    """(period, day -> its bar, every bar from the first to the last, empty ones included):
    a bar per day, or over MAX_DAILY_BARS days a bar per ISO week (its Monday)."""
    if not days:
        return "day", {}, []
    first, last = min(days), max(days)
    if (last - first).days < MAX_DAILY_BARS:
        return "day", {d: d for d in days}, [first + timedelta(days=i) for i in range((last - first).days + 1)]
    monday = first - timedelta(days=first.weekday())
    weeks = [monday + timedelta(weeks=i) for i in range((last - monday).days // 7 + 1)]
    return "week", {d: d - timedelta(days=d.weekday()) for d in days}, weeks


def adoption_series(adoption: DataFrame) -> dict:
    """Connections per day (or week) for the TOP_VERSIONS software versions with the most
    connections; the others summed as "other"."""
    label = F.concat_ws(" ", "client_software_name", "client_software_version")
    totals = (adoption.groupBy(label.alias("label")).agg(F.sum("connections").alias("n"))
              .orderBy(F.desc("n"), "label").collect())
    top = [r["label"] for r in totals[:TOP_VERSIONS]]
    series_label = F.when(label.isin(top), label).otherwise(F.lit(OTHER)) if top else F.lit(OTHER)
    rows = (adoption.groupBy("day", series_label.alias("label")).agg(F.sum("connections").alias("n"))
            .collect())
    period, bucket, x = _buckets(sorted({r["day"] for r in rows}))
    values: dict[tuple[date, str], int] = {}
    for r in rows:
        key = (bucket[r["day"]], r["label"])
        values[key] = values.get(key, 0) + r["n"]
    names = top + ([OTHER] if len(totals) > len(top) else [])
    return {"period": period, "x": x, "series": names, "values": values,
            "versions": len(totals)}


def unknown_share(conns: DataFrame) -> dict:
    """Per day (or week): connections (`pipeline.events.connection_days`: those connected that
    day), and those without an accepted client identity."""
    rows = (conns.groupBy("day")
            .agg(F.count(F.lit(1)).alias("n"),
                 F.sum(F.when(F.col("client_software_name").isNull(), 1).otherwise(0)).alias("unknown"))
            .collect())
    period, bucket, x = _buckets(sorted(r["day"] for r in rows))
    agg = {d: [0, 0] for d in x}
    for r in rows:
        a = agg[bucket[r["day"]]]
        a[0] += r["n"]
        a[1] += r["unknown"]
    return {"period": period, "x": x, "total": {d: a[0] for d, a in agg.items()},
            "unknown": {d: a[1] for d, a in agg.items()}}


def removed_by_client(readiness: DataFrame) -> dict:
    """Requests with a removed API version per client (client id and software), most first."""
    grouped = (readiness.groupBy("client_id", "client_software_name", "client_software_version")
               .agg(F.sum("requests").alias("requests"),
                    F.array_sort(F.collect_set(F.concat_ws(" v", "api", F.col("api_version").cast("string"))))
                    .alias("apis")))
    total = grouped.count()
    rows = grouped.orderBy(F.desc("requests"), "client_id", "client_software_name", "client_software_version") \
        .limit(TOP_CLIENTS).collect()
    return {"rows": [r.asDict() for r in rows], "total": total}


# ---------------------------------------------------------------------------------------------
# SVG charts


def _nice_step(maximum: float, ticks: int = 5) -> float:
    if maximum <= 0:
        return 1.0
    raw = maximum / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _tick_label(v: float, percent: bool) -> str:
    if percent:
        return f"{v:g}%"
    return f"{int(v):,}" if float(v).is_integer() else f"{v:g}"


def _svg_open(width: int, height: int, title: str) -> list[str]:
    return [f'<svg class="chart" viewBox="0 0 {width} {height}" width="100%" role="img" '
            f'aria-label="{_e(title)}" preserveAspectRatio="xMinYMin meet"><title>{_e(title)}</title>']


def _time_bars(x: list[date], stacks: list[list[tuple[str, float, str, str]]], title: str, y_label: str, *,
               percent: bool = False, y_max: float | None = None) -> str:
    """Vertical (stacked) bars, one per x; each stack is [(series, value, colour, tooltip)]."""
    width, height, left, right, top, bottom = 960, 300, 64, 16, 24, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = y_max if y_max is not None else max((sum(v for _, v, _, _ in s) for s in stacks), default=0)
    step = _nice_step(peak)
    y_top = step * max(1, math.ceil(peak / step)) if peak > 0 else step
    out = _svg_open(width, height, title)
    out.append(f'<text x="{left}" y="{top - 4}" class="unit">{_e(y_label)}</text>')
    for i in range(int(round(y_top / step)) + 1):  # grid and y labels
        v = i * step
        y = top + plot_h - plot_h * v / y_top
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_e(_tick_label(v, percent))}</text>')
    n = max(1, len(x))
    slot = plot_w / n
    bar = max(1.0, min(slot * 0.8, 56.0))
    every = max(1, math.ceil(n / 10))  # at most about ten x labels
    for i, (day, stack) in enumerate(zip(x, stacks)):
        x0 = left + i * slot + (slot - bar) / 2
        # The whole column, under its bars, says everything about it (also when a value is 0).
        shown = [tip for _, value, _, tip in stack if value > 0] or [tip for _, _, _, tip in stack]
        summary = "; ".join(shown)
        out.append(f'<rect x="{left + i * slot:.1f}" y="{top}" width="{slot:.1f}" height="{plot_h}" '
                   f'fill="transparent"><title>{_e(summary)}</title></rect>')
        y = top + plot_h
        for _series, value, colour, tip in stack:
            if value <= 0:
                continue
            h = plot_h * value / y_top
            y -= h
            out.append(f'<rect x="{x0:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="{colour}">'
                       f'<title>{_e(tip)}</title></rect>')
        if i % every == 0:
            out.append(f'<text x="{left + i * slot + slot / 2:.1f}" y="{top + plot_h + 16}" '
                       f'text-anchor="middle">{_e(day.isoformat())}</text>')
    out.append(f'<line x1="{left}" x2="{width - right}" y1="{top + plot_h}" y2="{top + plot_h}" class="axis"/>')
    out.append("</svg>")
    return "".join(out)


def _legend(items: list[tuple[str, str]]) -> str:
    parts = [f'<li><svg width="12" height="12" aria-hidden="true"><rect width="12" height="12" fill="{c}"/></svg> '
             f"{_e(name)}</li>" for name, c in items]
    return f'<ul class="legend">{"".join(parts)}</ul>'


def _colours(series: list[str]) -> dict[str, str]:
    colours, i = {}, 0
    for name in series:
        if name == OTHER:
            colours[name] = OTHER_COLOUR
        elif name.startswith("unknown"):
            colours[name] = UNKNOWN_COLOUR
        else:
            colours[name] = PALETTE[i % len(PALETTE)]
            i += 1
    return colours


def _series_name(label: str) -> str:
    return "software unknown" if label == f"{UNKNOWN} {UNKNOWN}" else label


def adoption_chart(data: dict) -> str:
    if not data["x"]:
        return '<p class="empty">No connections in the input.</p>'
    colours = _colours(data["series"])
    stacks = []
    for d in data["x"]:
        stack = []
        for name in data["series"]:
            n = data["values"].get((d, name), 0)
            if n:
                tip = f"{d.isoformat()} \u00b7 {_series_name(name)}: {n:,} connections"
                stack.append((name, n, colours[name], tip))
        stacks.append(stack or [(OTHER, 0, OTHER_COLOUR, f"{d.isoformat()}: no connections")])
    svg = _time_bars(data["x"], stacks, f"Connections per {data['period']} by client software version",
                     f"connections per {data['period']}")
    note = ""
    if OTHER in data["series"]:
        note = (f'<p class="note">The {TOP_VERSIONS} versions with the most connections of {data["versions"]}; '
                f'the rest are summed as \u201cother\u201d.</p>')
    return svg + _legend([(_series_name(n), colours[n]) for n in data["series"]]) + note


def unknown_chart(data: dict) -> str:
    if not data["x"]:
        return '<p class="empty">No connections in the input.</p>'
    stacks = []
    for d in data["x"]:
        total, unknown = data["total"][d], data["unknown"][d]
        share = 100.0 * unknown / total if total else 0.0
        tip = (f"{d.isoformat()}: {unknown:,} of {total:,} connections without a client identity ({share:.1f}%)"
               if total else f"{d.isoformat()}: no connections")
        stacks.append([("unknown", share, UNKNOWN_COLOUR, tip)])
    svg = _time_bars(data["x"], stacks, f"Share of connections per {data['period']} without a client identity",
                     "connections without a client identity", percent=True, y_max=100.0)
    all_total = sum(data["total"].values())
    all_unknown = sum(data["unknown"].values())
    return svg + (f'<p class="note">Overall {all_unknown:,} of {all_total:,} connections '
                  f"({100.0 * all_unknown / all_total if all_total else 0:.1f}%) sent no ApiVersions request that "
                  "named the client software (older clients, or a capture that joined mid-connection).</p>")


def removed_chart(data: dict) -> str:
    rows = data["rows"]
    if not rows:
        return '<p class="empty">No request used an API version the target removes.</p>'
    width, label_w, right, bar_h, gap, top = 960, 330, 90, 18, 6, 6
    height = top + len(rows) * (bar_h + gap) + 6
    peak = max(r["requests"] for r in rows) or 1
    plot_w = width - label_w - right
    out = _svg_open(width, height, "Requests with removed API versions by client")
    for i, r in enumerate(rows):
        y = top + i * (bar_h + gap)
        name = r["client_id"] if r["client_id"] is not None else "(no client id)"
        software = (f"{r['client_software_name']} {r['client_software_version']}"
                    if (r["client_software_name"], r["client_software_version"]) != (UNKNOWN, UNKNOWN)
                    else "software unknown")
        label = f"{name} \u00b7 {software}"
        short = label if len(label) <= 48 else label[:47] + "\u2026"
        w = max(1.0, plot_w * r["requests"] / peak)
        tip = f"{label}: {r['requests']:,} requests with {', '.join(r['apis'])}"
        out.append(f'<text x="{label_w - 8}" y="{y + bar_h - 5}" text-anchor="end">{_e(short)}'
                   f"<title>{_e(label)}</title></text>")
        out.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{PALETTE[5]}">'
                   f"<title>{_e(tip)}</title></rect>")
        out.append(f'<text x="{label_w + w + 6:.1f}" y="{y + bar_h - 5}">{r["requests"]:,}</text>')
    out.append("</svg>")
    note = ""
    if data["total"] > len(rows):
        note = (f'<p class="note">The {len(rows)} clients with the most such requests of {data["total"]:,}; '
                "all are in the upgrade-readiness table.</p>")
    return "".join(out) + note


# ---------------------------------------------------------------------------------------------
# Tables and page


def _field(key: str):
    return lambda r: _fmt(r.get(key))


def _api(r: dict) -> str:
    return f"{r.get('api')} v{r.get('api_version')}"


def _software(r: dict) -> str:
    return f"{_fmt(r.get('client_software_name'))} {_fmt(r.get('client_software_version'))}"


def _broker(r: dict) -> str:
    return f"{_fmt(r.get('broker'))} ({_fmt(r.get('listener'))})"


def _topic(r: dict) -> str:
    return r["topic"] if r.get("topic") is not None else f"{_fmt(r.get('topic_id'))} (id, no name known)"


def _txn(r: dict) -> str:
    return _fmt(r.get("transactional_id"))


def _lowest(r: dict) -> str:
    v = r.get("minimum_version")
    return "none: API removed" if v is None else f"v{v}"


# Per table: (header, cell text from the row, cell class). Columns are merged where that keeps
# the page readable on A4 landscape; the CSV beside the page has every field on its own.
NUM, FREE, LIST, PLAIN = "num", "free", "list", ""
COLUMNS = {
    "upgrade_readiness": [
        ("Software", _software, FREE), ("Client id", _field("client_id"), FREE),
        ("Principal", _field("principal"), FREE), ("Address", _field("client_address"), PLAIN),
        ("Broker (listener)", _broker, PLAIN), ("API used", _api, PLAIN),
        ("Lowest accepted", _lowest, PLAIN), ("Requests", _field("requests"), NUM),
        ("Connections", _field("connections"), NUM),
        ("Last seen (UTC)", _field("last_seen"), PLAIN)],
    "upgrade_readiness_by_software": [
        ("Software (announced or inferred)", lambda r: f"{_fmt(r.get('software_name'))} "
                                                      f"{_fmt(r.get('software_version'))}", FREE),
        ("Identity", _field("identity_source"), PLAIN), ("Client id", _field("client_id"), FREE),
        ("Principal", _field("principal"), FREE), ("APIs used", _field("removed_apis"), LIST),
        ("Lowest accepted", _field("minimum_versions"), LIST),
        ("First compatible release", _field("min_compatible"), PLAIN),
        ("Confidence", _field("inferred_confidence"), NUM), ("Evidence", _field("evidence"), LIST),
        ("Connections", _field("connections"), NUM), ("Requests", _field("requests"), NUM)],
    "inventory": [
        ("Software", _software, FREE), ("Client id", _field("client_id"), FREE),
        ("Principal", _field("principal"), FREE), ("Address", _field("client_address"), PLAIN),
        ("Broker (listener)", _broker, PLAIN), ("Connections", _field("connections"), NUM),
        ("Requests", _field("requests"), NUM),
        ("First seen (UTC)", _field("first_seen"), PLAIN),
        ("Last seen (UTC)", _field("last_seen"), PLAIN),
        ("APIs used", _field("apis_used"), LIST)],
    "adoption": [
        ("Day (UTC)", _field("day"), PLAIN), ("Software", _software, FREE),
        ("Connections", _field("connections"), NUM),
        ("Distinct clients", _field("distinct_clients"), NUM)],
    "api_usage": [
        ("API", _api, PLAIN),
        ("Key", _field("api_key"), NUM), ("Software", _software, FREE),
        ("Requests", _field("requests"), NUM)],
    "topic_lineage": [
        ("Topic", _topic, FREE), ("Role", _field("role"), PLAIN),
        ("Software (announced or inferred)", lambda r: f"{_fmt(r.get('software_name'))} "
                                                      f"{_fmt(r.get('software_version'))}", FREE),
        ("Client id", _field("client_id"), FREE), ("Principal", _field("principal"), FREE),
        ("Address", _field("client_address"), PLAIN), ("Group", _field("group_id"), FREE),
        ("Transactional id", _txn, FREE), ("Uses", _field("uses"), LIST),
        ("Connections", _field("connections"), NUM), ("Bytes", _field("bytes"), NUM),
        ("Last seen (UTC)", _field("last_seen"), PLAIN)],
}


def table_html(name: str, rows: list[dict], total: int) -> str:
    if not rows:
        return '<p class="empty">No rows.</p>'
    cols = COLUMNS[name]
    head = "".join(f'<th scope="col" class="{kind}">{_e(h)}</th>' if kind else f'<th scope="col">{_e(h)}</th>'
                   for h, _, kind in cols)
    body = []
    for r in rows:
        cells = "".join(f'<td class="{kind}">{_e(cell(r))}</td>' if kind else f"<td>{_e(cell(r))}</td>"
                        for _, cell, kind in cols)
        body.append(f"<tr>{cells}</tr>")
    note = ""
    if total > len(rows):
        note = (f'<p class="note cut">Showing the first {len(rows):,} of {total:,} rows ({total - len(rows):,} left '
                f"out); the full table is <code>{_e(name)}.csv/</code> (and Parquet in <code>{_e(name)}/</code>) "
                "next to this file.</p>")
    return (f'{note}<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
            f"</table></div>")


CSS = """
:root { --ink: #1b1f24; --muted: #57606a; --line: #d0d7de; --zebra: #f6f8fa; --ok: #1a7f37; --bad: #cf222e; }
* { box-sizing: border-box; }
body { font: 13px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--ink); margin: 0 auto; max-width: 1240px; padding: 24px; }
h1 { font-size: 24px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 32px 0 8px; border-bottom: 1px solid var(--line);
  padding-bottom: 4px; } h3 { font-size: 14px; margin: 20px 0 6px; }
.sub, .note, figcaption { color: var(--muted); }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 12px 0; }
dl.facts dt { font-weight: 600; } dl.facts dd { margin: 0; }
nav ol { margin: 4px 0; padding-left: 20px; } nav li { display: inline; margin-right: 14px; }
a { color: #0969da; }
.verdict { border: 2px solid; border-radius: 6px; padding: 10px 14px; margin: 10px 0 14px; font-size: 15px; }
.verdict.ready { border-color: var(--ok); } .verdict.blocked { border-color: var(--bad); }
.verdict.none { border-color: var(--muted); }
.verdict strong { font-size: 17px; }
.verdict.ready strong { color: var(--ok); } .verdict.blocked strong { color: var(--bad); }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 12px; }
th, td { border: 1px solid var(--line); padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: var(--zebra); } tbody tr:nth-child(even) { background: var(--zebra); }
td { overflow-wrap: break-word; } th.num { text-align: right; } td.num { text-align: right; white-space: nowrap; }
td.free { overflow-wrap: anywhere; min-width: 90px; }
td.list { font-size: 11px; min-width: 150px; overflow-wrap: anywhere; }
figure { margin: 12px 0 20px; } figcaption { margin-bottom: 4px; }
svg.chart { display: block; max-width: min(100%, 960px); height: auto; font-size: 11px; }
svg.chart text { fill: var(--ink); } svg.chart .unit { fill: var(--muted); }
svg.chart .grid { stroke: #e5e8eb; } svg.chart .axis { stroke: var(--muted); }
ul.legend { list-style: none; padding: 0; margin: 4px 0; display: flex; flex-wrap: wrap; gap: 4px 16px; }
ul.legend svg { vertical-align: -1px; }
.empty { color: var(--muted); font-style: italic; }
code { font-size: 12px; } footer { margin-top: 32px; color: var(--muted); font-size: 12px; }
* { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
@media print {
  @page { size: A4 landscape; margin: 12mm; }
  body { max-width: none; padding: 0; font-size: 11px; } nav { display: none; } a { color: inherit; }
  .scroll { overflow: visible; } h2 { break-after: avoid; } figure, tr, .verdict { break-inside: avoid; }
  thead { display: table-header-group; }
}
"""


def _lineage_note(counts: dict) -> str:
    unresolved = counts.get("unresolved_ids", 0)
    return (f'<p class="note">{_fmt(counts.get("topics", 0))} topics named by their clients\u2019 requests in '
            "the window; per topic its producers (Produce, transactions), consumers (Fetch, offsets, "
            "subscriptions), admins (create, delete) and others (only Metadata, replication), one row per client "
            "(software, client id, principal, address, group, transactional id)."
            + (f" Topic ids no Metadata answer in the input named, shown as ids: {_fmt(unresolved)}."
               if unresolved else "") + "</p>")


def render(*, generated: float, inputs: list[str], target: str, since: float | None, until: float | None,
           first_ts: float | None, last_ts: float | None, counts: dict, tables: dict, totals: dict,
           charts: dict, must_upgrade: int) -> str:
    """The page. `tables[name]` are the rows shown, `totals[name]` the table's full row count."""
    window = f"{_utc(since) if since is not None else 'start of the input'} to " \
             f"{_utc(until) if until is not None else 'end of the input'}"
    seen = f"{_utc(first_ts)} to {_utc(last_ts)}" if first_ts is not None else "no events"
    facts = [
        ("Generated", _utc(generated)),
        ("Inputs", ", ".join(inputs)),
        ("Time window", window),
        ("Events seen", seen),
        ("Events", _fmt(counts["events"])),
        ("Connections", _fmt(counts["connections"])),
        ("Clients", f"{_fmt(counts['clients'])} (inventory rows: software, version, client id, principal, "
                    "address, listener, broker)"),
        ("Quarantined lines", _fmt(counts["quarantined_lines"])
         + (" (with their reasons in quarantine/ next to this file)" if counts["quarantined_lines"] else "")),
    ]
    dl = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts)
    if not counts["connections"]:
        verdict = ('<div class="verdict none" id="verdict"><strong>No verdict</strong>: the input holds no connection '
                   "(check the inputs and the time window).</div>")
    elif must_upgrade:
        verdict = (f'<div class="verdict blocked" id="verdict"><strong>Not ready for Kafka {_e(target)}: '
                   f'{must_upgrade:,} client{"s" if must_upgrade != 1 else ""} must upgrade.</strong><br>'
                   f"They sent requests with API versions Kafka {_e(target)} no longer accepts (KIP-896); each row "
                   "below names the client, the API and the lowest version the broker will accept.</div>")
    else:
        verdict = (f'<div class="verdict ready" id="verdict"><strong>Ready for Kafka {_e(target)}</strong>: no client '
                   f"used an API version Kafka {_e(target)} removes, in the traffic seen ({_e(seen)}).</div>")
    sections = [
        ("readiness", f"Upgrade readiness for Kafka {target}", verdict + table_html(
            "upgrade_readiness", tables["upgrade_readiness"], totals["upgrade_readiness"]) + (
            '<h3 id="by-software">By software</h3><p class="note">The clients above by software: announced '
            "(KIP-511), else inferred (identity sibling: announced on another connection of the same address "
            "and client id; fingerprint: from the API versions it sent), with the first release of an inferred "
            "library compatible with Kafka " + _e(target) + " and the evidence.</p>"
            + table_html("upgrade_readiness_by_software", tables["upgrade_readiness_by_software"],
                         totals["upgrade_readiness_by_software"])
            if "upgrade_readiness_by_software" in tables else "")),
        ("charts", "Charts", "".join(
            f'<figure id="{fid}"><figcaption><h3>{_e(cap)}</h3></figcaption>{body}</figure>'
            for fid, cap, body in (
                ("chart-adoption", "Version adoption over time", charts["adoption"]),
                ("chart-unknown", "Share of unknown identities", charts["unknown"]),
                ("chart-removed", f"Removed API versions (Kafka {target}) by client", charts["removed"])))),
        ("inventory", "Inventory", table_html("inventory", tables["inventory"], totals["inventory"])),
        ("adoption", "Adoption", '<p class="note">Connections and distinct clients (client id, principal, '
                                 "address) per UTC day they were connected.</p>"
         + table_html("adoption", tables["adoption"], totals["adoption"])),
        ("api-usage", "API usage", table_html("api_usage", tables["api_usage"], totals["api_usage"])),
    ]
    if "topic_lineage" in tables:
        sections.append(("topics", "Who writes and reads each topic", _lineage_note(counts)
                         + table_html("topic_lineage", tables["topic_lineage"], totals["topic_lineage"])))
    nav = "".join(f'<li><a href="#{sid}">{_e(title)}</a></li>' for sid, title, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{_e(title)}</h2>{content}</section>' for sid, title, content in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Kafka client census: upgrade readiness for Kafka {_e(target)}</title>"
        f"<style>{CSS}</style></head><body>"
        f'<header><h1>Kafka client census</h1><p class="sub">Who connects to the cluster, with which client '
        f"software, and what breaks on an upgrade to Kafka {_e(target)}. Passive capture by kafka-census.</p>"
        f'<dl class="facts">{dl}</dl><nav><ol>{nav}</ol></nav></header>'
        f"<main>{body}</main>"
        "<footer>Made by <code>kafka-census pipeline report</code>. A client is one inventory row; a "
        "connection counts on every UTC day it was connected; \u201cunknown\u201d software means the client "
        "sent no ApiVersions request naming itself. The tables are also next to this file as CSV "
        "(<code>NAME.csv/</code>) and Parquet (<code>NAME/</code>).</footer>"
        "</body></html>\n")


# ---------------------------------------------------------------------------------------------
# The job


def run_report(spark, args, progress) -> dict:
    from pipeline import events as ev
    from pipeline import jobs
    from pipeline.identity import identities
    from pipeline.lineage import NAME, lineage_of

    if args.target not in jobs.TARGETS:
        raise UsageError(f"--target {args.target!r} is not known; known: {', '.join(jobs.TARGETS)}")
    started = time.perf_counter()
    generated = time.time()
    out = args.output.rstrip("/")
    loaded = load_input(spark, args, out, progress, "the report is empty")
    facts, n_events, n_bad, first_ts, last_ts = (loaded.facts, loaded.events, loaded.quarantined, loaded.first_ts,
                                                 loaded.last_ts)
    # The tables over the whole window (a row per client, not per day), but adoption and the
    # unknown share: per UTC day each connection was connected.
    conns = ev.connections(facts, args.since, args.until).cache()
    days = ev.connection_days(facts, loaded.since, loaded.until).cache()
    reqs = ev.requests(facts).cache()
    n_conns = conns.count()
    idents = identities(facts, conns)

    frames = {"upgrade_readiness": jobs.upgrade_readiness(spark, conns, reqs, args.target),
              "upgrade_readiness_by_software": jobs.readiness_by_software(spark, idents, reqs, args.target),
              "inventory": jobs.inventory(conns, reqs), "adoption": jobs.adoption(days),
              "api_usage": jobs.api_usage(conns, reqs),
              NAME: lineage_of(spark, loaded, args.since, args.until, idents)}
    totals = {}
    for name, df in frames.items():
        totals[name] = jobs.write_table(df, out, name)
    progress("tables: " + ", ".join(f"{n} {c} rows" for n, c in totals.items())
             + f" -> {out}/NAME/ and NAME.csv/ ({time.perf_counter() - started:.1f} s)")
    shown = {name: _rows(df, MAX_TABLE_ROWS) for name, df in frames.items()}
    readiness = frames["upgrade_readiness"]
    must_upgrade = readiness.select(*jobs.CLIENT_KEY).distinct().count()
    topics = spark.read.parquet(f"{out}/{NAME}").agg(  # as written: not computed again
        F.countDistinct("topic").alias("topics"),
        F.countDistinct(F.when(F.col("topic").isNull(), F.col("topic_id"))).alias("unresolved_ids")).first()
    charts = {"adoption": adoption_chart(adoption_series(frames["adoption"])),
              "unknown": unknown_chart(unknown_share(days)),
              "removed": removed_chart(removed_by_client(readiness))}
    progress(f"charts drawn ({time.perf_counter() - started:.1f} s)")
    page = render(generated=generated, inputs=list(args.input), target=args.target, since=args.since,
                  until=args.until, first_ts=first_ts, last_ts=last_ts,
                  counts={"events": n_events, "connections": n_conns, "clients": totals["inventory"],
                          "quarantined_lines": n_bad, "topics": topics["topics"],
                          "unresolved_ids": topics["unresolved_ids"]},
                  tables=shown, totals=totals, charts=charts, must_upgrade=must_upgrade)
    path = f"{out}/{REPORT_NAME}"
    write_file(spark, path, page)
    verdict = f"{must_upgrade} clients must upgrade" if must_upgrade else "ready"
    progress(f"report: {path} ({len(page.encode()) / 1024:.0f} KiB; Kafka {args.target}: {verdict}) "
             f"({time.perf_counter() - started:.1f} s)")
    spark.catalog.clearCache()  # as pipeline.cli.run_tables: nothing cached here serves a later job
    return {"job": "report", "output": path, "events": n_events, "connections": n_conns,
            "clients": totals["inventory"], "must_upgrade": must_upgrade, "quarantined_lines": n_bad,
            "rows": totals}
