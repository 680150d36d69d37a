"""Upgrade readiness: which connections and clients use API versions a target broker removes.

Owns `report` (REST GET /api/v1/upgrade-readiness: the offending connections, census rows and
their grouping by software, `by_software`), whose copy function (`copy`, nested in it: what is
copied of a record under the registry's lock) takes only an offender's slots. The targets
(`UPGRADE_TARGETS`: the versions each Kafka release removed and the first version each API
accepts) are generated from what real brokers accepted (capture/kafka/upgrade_targets.py), which
the pipeline reads too.

Imports only the upgrade targets, `exporter.census.record` and `exporter.census.reads`; the
registry's chunked copy, its references and its census listing are passed in. Never imports the
registry (exporter/census/registry.py).
"""

from __future__ import annotations

from collections.abc import Callable

from capture.kafka.upgrade_targets import UPGRADE_TARGETS
from exporter.census import reads
from exporter.census.reads import Copier
from exporter.census.record import SLOT_INDEX, ConnectionRecord, detached, record_copy

_ID, _FIRST_SEEN = SLOT_INDEX["id"], SLOT_INDEX["first_seen"]


def target_of(target: str):
    """The upgrade target's removed and minimum versions; ValueError for one not generated."""
    known = UPGRADE_TARGETS.get(target)
    if known is None:
        raise ValueError(f"unknown upgrade target {target!r}; known: {', '.join(UPGRADE_TARGETS)}")
    return known


def report(target: str, copied: Copier, refs: list[ConnectionRecord], now: float,
           clients: Callable[[], list[dict]], names: dict[str, str] | None = None) -> dict:
    """Connections (`refs`, copied in chunks: each record is checked under the lock and only the
    offenders copied) and census rows (`clients()`, the census listing) that used API versions
    the `target` broker removes. `names`: the topic id map the connections' topics are named with."""
    known = target_of(target)
    removed, minimum = known.removed, known.minimum_version

    def offending(requests: list[dict]) -> list[dict]:
        out = []
        for r in requests:
            if r["api_version"] in removed.get(r["api_key"], ()):
                out.append({**r, "minimum_version": minimum[r["api_key"]]})
        return out

    def copy(rec: ConnectionRecord):  # under the lock: only the offenders are copied
        for k, v in rec.requests:
            if v in removed.get(k, ()):
                return record_copy(rec)
        return None

    uses = [u for u in copied(refs, copy, reads.ROWS_PER_HOLD) if u is not None]
    uses.sort(key=lambda u: (u[0][_FIRST_SEEN], u[0][_ID]))
    conns = [dict(d, removed_requests=offending(d["requests"]))
             for d in (detached(*use).to_dict(now, names) for use in uses)]
    listed = [dict(c, removed_requests=off) for c in clients() if (off := offending(c["requests"]))]
    return {"target": target, "ready": not conns and not listed, "clients_by_software": by_software(listed),
            "connections": conns, "clients": listed}


def by_software(clients: list[dict]) -> list[dict]:
    """Upgrade readiness per (software, version or range, client_id, principal), over listeners:
    the announced software, else the inferred one (sibling or fingerprint), each labelled, with
    the removed versions used and, for an inferred library, its first release the target accepts."""
    groups: dict[tuple, dict] = {}
    for c in clients:
        inferred = c["inferred_software"]
        if c["client_software_name"] is not None:
            name, version = c["client_software_name"], c["client_software_version"]
        elif inferred is not None:
            name, version = inferred["name"], inferred["version_range"]
        else:
            name = version = None
        key = (name, version, c["identity_source"], c["client_id"], c["principal"])
        group = groups.get(key)
        if group is None:
            group = groups[key] = {
                "software_name": name, "software_version": version, "identity_source": c["identity_source"],
                "client_id": c["client_id"], "principal": c["principal"], "listeners": [], "open_connections": 0,
                "total_connections": 0, "inferred_software": inferred, "removed": {}}
        if c["listener"] not in group["listeners"]:
            group["listeners"].append(c["listener"])
        group["open_connections"] += c["open_connections"]
        group["total_connections"] += c["total_connections"]
        for r in c["removed_requests"]:
            k = (r["api_key"], r["api_version"])
            known = group["removed"].get(k)
            group["removed"][k] = dict(r) if known is None else dict(known, count=known["count"] + r["count"])
    out = []
    for group in groups.values():
        removed = group.pop("removed")
        group["removed_requests"] = [removed[k] for k in sorted(removed)]
        inferred = group["inferred_software"]
        group["min_compatible"] = inferred["min_compatible"] if inferred is not None else None
        group["evidence"] = inferred["evidence"] if inferred is not None else []
        group["listeners"].sort()
        out.append(group)
    out.sort(key=lambda g: (g["software_name"] or "", g["software_version"] or "", g["client_id"] or "",
                            g["principal"] or "", g["identity_source"]))
    return out
