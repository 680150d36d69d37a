"""The building blocks of kafka-census's Grafana dashboards (dashboards/generate.py) and the
PromQL its alert rules share (dashboards/alerts.py).

Owns the Grafana variables and matchers every expression uses (`LISTENER`, `RATE`, `RANGE`,
`SOFTWARE`, `JOB_SELECTOR`), `below_version_regex` (the PromQL regex of every version string
below a minimum), the PromQL helpers (`sel`, `rate`, `recent_increase`, `problem_ratio`) and
the Grafana model: `target`, the panels (`timeseries`, `stat`, `table`) and `dashboard`, which
lays rows of panels out on the 24-column grid and adds the `datasource` and `listener`
variables. Imports only the standard library.
"""

from __future__ import annotations

import re

# --------------------------------------------------------------------------- configuration
#: Selects kafka-census scrape jobs (`up`, the absent check). The chart's ServiceMonitor and a
#: plain scrape config both give job names containing "kafka-census".
JOB_SELECTOR = 'job=~".*kafka-census.*"'

# Grafana variables and the label matcher every listener-labelled series gets.
LISTENER = 'listener=~"$listener"'
RATE = "$__rate_interval"
RANGE = "$__range"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SOFTWARE = "client_software_name, client_software_version"
TAGS = ["kafka", "kafka-census"]


# --------------------------------------------------------------------------- version regex
def _minimum_components(minimum: str) -> tuple[int, ...]:
    """`minimum` as integers without trailing zeros ("2.3.0" -> (2, 3)); ValueError if it is
    not dotted decimal or nothing is below it ("0", "0.0")."""
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", minimum):
        raise ValueError(f"minimum version {minimum!r} is not dotted decimal (e.g. 2.3.1)")
    parts = [int(p) for p in minimum.split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    if not parts:
        raise ValueError(f"no version is below {minimum!r}")
    return tuple(parts)


def _digit_range(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"[{lo}-{hi}]"


def _numbers_below(n: int) -> str:
    """A regex for every decimal 0 .. n-1 written without leading zeros (n >= 1)."""
    digits = str(n)
    width = len(digits)
    alternatives = []
    for shorter in range(1, width):  # every number with fewer digits than n
        alternatives.append("[0-9]" if shorter == 1 else "[1-9]" + "[0-9]" * (shorter - 1))
    for i in range(width):  # same width: equal up to digit i, smaller at digit i, anything after
        lowest = 1 if i == 0 and width > 1 else 0
        highest = int(digits[i]) - 1
        if highest >= lowest:
            alternatives.append(digits[:i] + _digit_range(lowest, highest) + "[0-9]" * (width - i - 1))
    return alternatives[0] if len(alternatives) == 1 else "(" + "|".join(alternatives) + ")"


def below_version_regex(minimum: str) -> str:
    """A regex matching, in full, every version string below `minimum`, for
    ``client_software_version=~"..."`` (PromQL anchors regexes at both ends).

    A version is compared by its leading numeric part: an optional ``v``/``V``, then dotted
    decimal components (leading zeros allowed); whatever follows is ignored, so
    ``2.16.1-rdkafka-2.16.0`` counts as 2.16.1 and ``3.7.0-SNAPSHOT`` as 3.7.0. Missing
    components are zeros (``2.3`` is 2.3.0). A version with no leading number (``unknown``)
    is never below. Component values may have any number of digits: below 10.2 matches 9.9 and
    1.0 but not 10.2, 11.0 or 100.0.

    One alternative per place the version can first fall short of the minimum: a smaller
    component followed by a non-digit or the end, or the numeric part ending early while the
    minimum still has a non-zero component. Written for Go's RE2 (no backreferences,
    lookaround or counted repetition) and valid in Python's `re` alike; a literal dot is
    ``[.]``, never ``\\.``, so the regex needs no escaping inside a PromQL, YAML, JSON or Helm
    string.
    """
    m = _minimum_components(minimum)
    not_a_digit_after = "([^0-9].*)?"
    numeric_part_ends = "([^.0-9].*|[.]([^0-9].*)?)?"
    alternatives = []
    for i, component in enumerate(m):
        equal_prefix = "[.]".join(f"0*{c}" for c in m[:i])
        if i > 0:  # the version stops after m[:i]: the rest of m is not all zeros, so it is below
            alternatives.append(equal_prefix + numeric_part_ends)
        if component > 0:
            separator = "[.]" if i > 0 else ""
            alternatives.append(equal_prefix + separator + "0*" + _numbers_below(component) + not_a_digit_after)
    return "[vV]?(" + "|".join(alternatives) + ")"


# --------------------------------------------------------------------------- PromQL helpers
def sel(metric: str, *matchers: str) -> str:
    return f"{metric}{{{', '.join(matchers)}}}" if matchers else metric


def rate(selector: str) -> str:
    return f"rate({selector}[{RATE}])"


def recent_increase(selector: str, window: str) -> str:
    """Increase of a counter over `window`, counting series born inside it too.

    kafka-census creates a labelled counter at its first event (a one-off batch job's
    Produce v2 appears with value 3 and stays there); `increase()` cannot see a rise from
    "no series" to 3, so series that did not exist `window` ago contribute their value. The
    `> 0` matters: a zero increase would otherwise hide the newborn series' value in the `or`."""
    return f"(increase({selector}[{window}]) > 0 or ({selector} unless {selector} offset {window}))"


def problem_ratio(window: str) -> str:
    """Decode errors plus desyncs per decoded request, per kafka-census instance. The two
    families can share `kind` values, so each is tagged before the union."""
    return (
        "sum by (job, instance) (\n"
        f'  label_replace(rate(kafka_census_decode_errors_total[{window}]), "problem", "decode_error", "", "")\n'
        f'  or label_replace(rate(kafka_census_desyncs_total[{window}]), "problem", "desync", "", "")\n'
        ")\n"
        f"/ sum by (job, instance) (rate(kafka_census_requests_total[{window}]))"
    )


# --------------------------------------------------------------------------- Grafana model
def target(expr: str, legend: str = "", *, instant: bool = False, table: bool = False) -> dict:
    t = {"datasource": DATASOURCE, "editorMode": "code", "expr": expr, "legendFormat": legend,
         "range": not instant, "instant": instant}
    if table:
        t["format"] = "table"
    return t


def _thresholds(red_at: float | None) -> dict:
    steps = [{"color": "green", "value": None}]
    if red_at is not None:
        steps.append({"color": "red", "value": red_at})
    return {"mode": "absolute", "steps": steps}


def timeseries(title: str, description: str, targets: list[dict], *, unit: str = "short", w: int = 12,
               h: int = 8, stack: bool = False, max_value: float | None = None) -> dict:
    defaults = {
        "color": {"mode": "palette-classic"},
        "custom": {"drawStyle": "line", "fillOpacity": 20 if stack else 0, "lineWidth": 1,
                   "showPoints": "never", "spanNulls": False,
                   "stacking": {"group": "A", "mode": "normal" if stack else "none"}},
        "min": 0, "thresholds": _thresholds(None), "unit": unit,
    }
    if max_value is not None:
        defaults["max"] = max_value
    return {"type": "timeseries", "title": title, "description": description, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"legend": {"calcs": ["lastNotNull", "max"], "displayMode": "table",
                                   "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}},
            "w": w, "h": h}


def stat(title: str, description: str, expr: str, *, unit: str = "short", red_at: float | None = None,
         w: int = 6, h: int = 4) -> dict:
    return {"type": "stat", "title": title, "description": description,
            "targets": [target(expr, title, instant=True)],
            "fieldConfig": {"defaults": {"color": {"mode": "thresholds"}, "thresholds": _thresholds(red_at),
                                         "unit": unit}, "overrides": []},
            "options": {"colorMode": "value", "graphMode": "none", "justifyMode": "auto",
                        "orientation": "auto", "textMode": "auto",
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
            "w": w, "h": h}


def table(title: str, description: str, columns: list[tuple[str, str]], *, keys: list[str],
          w: int = 24, h: int = 8, sort_by: str | None = None) -> dict:
    """An instant table: one target per value column ((header, expr)), rows joined on `keys`."""
    targets = [target(expr, header, instant=True, table=True) for header, expr in columns]
    rename = {"Value" if len(columns) == 1 else f"Value #{chr(ord('A') + i)}": header
              for i, (header, _) in enumerate(columns)}
    index = {key: i for i, key in enumerate([*keys, *rename.values()])}
    transformations = [{"id": "merge", "options": {}}] if len(columns) > 1 else []
    transformations.append({"id": "organize", "options": {"excludeByName": {"Time": True},
                                                          "indexByName": index, "renameByName": rename}})
    return {"type": "table", "title": title, "description": description, "targets": targets,
            "transformations": transformations,
            "fieldConfig": {"defaults": {"custom": {"align": "auto", "filterable": True},
                                         "thresholds": _thresholds(None)}, "overrides": []},
            "options": {"cellHeight": "sm", "showHeader": True,
                        "sortBy": [{"desc": True, "displayName": sort_by or columns[0][0]}]},
            "w": w, "h": h}


def _layout(rows: list[tuple[str, list[dict]]]) -> list[dict]:
    """Rows of panels flowed left to right on Grafana's 24-column grid; ids in order from 1."""
    panels, y, next_id = [], 0, 1
    for row_title, row_panels in rows:
        panels.append({"type": "row", "title": row_title, "id": next_id, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        next_id, y = next_id + 1, y + 1
        x, line_height = 0, 0
        for spec in row_panels:
            panel = dict(spec)
            w, h = panel.pop("w"), panel.pop("h")
            if x + w > 24:
                x, y, line_height = 0, y + line_height, 0
            panel.update(id=next_id, gridPos={"h": h, "w": w, "x": x, "y": y}, datasource=DATASOURCE)
            for ref, t in enumerate(panel["targets"]):
                t["refId"] = chr(ord("A") + ref)
            panels.append(panel)
            next_id, x, line_height = next_id + 1, x + w, max(line_height, h)
        y += line_height
    return panels


def _variables() -> list[dict]:
    query = "label_values(kafka_census_connections, listener)"
    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
         "regex": ""},
        {"name": "listener", "label": "Listener", "type": "query", "datasource": DATASOURCE,
         "definition": query, "query": query, "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
         "hide": 0, "includeAll": True, "allValue": ".*",
         "multi": True, "options": [], "refresh": 2, "regex": "", "sort": 1},
    ]


def dashboard(uid: str, title: str, description: str, rows: list[tuple[str, list[dict]]]) -> dict:
    return {
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "description": description + " Generated by dashboards/generate.py (kafka-census): edit the generator, "
                                     "not this JSON.",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [{"asDropdown": False, "icon": "external link", "includeVars": True, "keepTime": True,
                   "tags": ["kafka-census"], "targetBlank": False, "title": "kafka-census", "tooltip": "",
                   "type": "dashboards", "url": ""}],
        "panels": _layout(rows),
        "refresh": "1m",
        "schemaVersion": 39,
        "tags": TAGS,
        "templating": {"list": _variables()},
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }

