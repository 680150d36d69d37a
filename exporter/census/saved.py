"""What a restart keeps of the open connections (`--state-file`), and how it comes back.

Owns `SavedIdentity` (one open connection's 4-tuple and the identity the capture cannot see again
once it joins the connection mid-stream; written and read by exporter/service/state.py),
`saved_identities` (which open records are saved, from the values the registry copied of them,
`SAVED_FIELDS`), the saved form of an inferred identity (`saved_inferred`) and its way back
(`restored_inferred`: "restored_sibling" / "restored_fingerprint", never the software fields),
and `RestoreTable`: the saved identities waiting for their connection.

Rules: a saved identity goes to the next connection of its 4-tuple only if the capture joins it
mid-stream (one seen from its SYN is a new connection on a reused port, and the saved one is
dropped); it shows as identity_source "restored" until an accepted ApiVersions, and is forgotten
after the restore TTL if its connection never shows. At most `max_open` wait. Never a secret:
the registry holds none.

Imports only `capture.events` (the event contract), `exporter.census.record` and
`exporter.census.fingerprint` (its evidence bounds); never imports the registry
(exporter/census/registry.py). The registry calls `RestoreTable`, `restore_into` and
`restored_inferred` under its lock, with its string bound passed in, and `saved_identities` with
the lock free, on the values it copied.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter

from capture.events import ConnectionOpened
from exporter.census.fingerprint import CLIENT_EVIDENCE, MAX_EVIDENCE
from exporter.census.record import ConnectionRecord, InferredIdentity, sasl_mechanism

RESTORED_EVIDENCE = "inferred before a restart (restored from the state file)"
# Restored inferred identities (state file): their identity_source and inferred_software.source.
RESTORED_INFERRED = {"sibling": "restored_sibling", "fingerprint": "restored_fingerprint"}
_SAVED_SOURCE = {**{v: k for k, v in RESTORED_INFERRED.items()}, "sibling": "sibling", "fingerprint": "fingerprint"}


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedIdentity:
    """What a restart keeps of an open connection (`--state-file`, written and read by
    exporter/service/state.py): its 4-tuple and the identity the capture cannot see again once it
    joins the connection mid-stream. Never a secret: the registry holds none."""

    client_address: str
    client_port: int
    broker_address: str
    broker_port: int
    listener: str
    client_id: str | None
    client_software_name: str | None
    client_software_version: str | None
    identity_version: int | None  # of the ApiVersions request that gave the identity
    principal: str | None
    sasl_mechanism: str | None
    first_seen: float  # seconds since the epoch
    last_seen: float
    # An identity inferred for an unannounced connection (issue 15), as `saved_inferred` writes
    # it: {source: "sibling" | "fingerprint", name, version_range, confidence, evidence: [...],
    # min_compatible, sibling_connection_id}, or None. Restored as "restored_sibling" /
    # "restored_fingerprint", never into the software fields.
    inferred: dict | None = None

    def four_tuple(self) -> tuple:
        return (self.client_address, self.client_port, self.broker_address, self.broker_port)


def saved_inferred(inferred: InferredIdentity | None) -> dict | None:
    """What the state file keeps of a record's `inferred`: the REST form, with the source it was
    inferred by (a restored one's original source: a second restart is still "restored_...")."""
    if inferred is None:
        return None
    out = inferred.to_dict()
    out["source"] = _SAVED_SOURCE.get(out["source"], out["source"])
    # connection ids of a run: the restarted one knows none of them
    del out["client_connections"]
    out["evidence"] = [e for e in out["evidence"] if not e.startswith(CLIENT_EVIDENCE)]
    return out


def restored_inferred(saved: dict, bounded: Callable) -> InferredIdentity | None:
    """A saved sibling or fingerprint identity (a shape the state file checks,
    exporter/service/state.py) as "restored_sibling" / "restored_fingerprint", its strings
    through `bounded` (the registry's wire string bound); it names no sibling (only a live
    fingerprint does). None for a source no restart gives back."""
    source = RESTORED_INFERRED.get(saved.get("source", ""))
    if source is None:
        return None
    name, version_range = bounded(saved["name"]), bounded(saved["version_range"])
    evidence = tuple(bounded(e) for e in saved["evidence"] if e != RESTORED_EVIDENCE)[:MAX_EVIDENCE - 1]
    return InferredIdentity(
        source=source, name=name, version_range=version_range, confidence=float(saved["confidence"]),
        evidence=evidence + (RESTORED_EVIDENCE,), min_compatible=bounded(saved.get("min_compatible")),
        sibling_connection_id=bounded(saved.get("sibling_connection_id")))


def restore_into(rec: ConnectionRecord, saved: SavedIdentity, bounded: Callable) -> None:
    """A new record (joined mid-stream) takes its saved identity, its strings through `bounded`."""
    rec.restored = True
    rec.restored_identity_version = saved.identity_version
    rec.client_id = bounded(saved.client_id)
    rec.software_name = bounded(saved.client_software_name)
    rec.software_version = bounded(saved.client_software_version)
    rec.principal = bounded(saved.principal)
    rec.sasl_mechanism = sasl_mechanism(saved.sasl_mechanism)  # a state file of an older version
    rec.first_seen = min(rec.first_seen, saved.first_seen)


# SavedIdentity's fields in order, with restored_identity_version after identity_version and
# `restored` last: what the registry's saved_identities() copies of an open record under the lock.
SAVED_FIELDS = attrgetter("client_address", "client_port", "broker_address", "broker_port", "listener", "client_id",
                          "software_name", "software_version", "identity_version", "restored_identity_version",
                          "principal", "sasl_mechanism", "first_seen", "last_seen", "restored", "inferred")


def saved_identities(rows: Iterable[tuple], waiting: list[SavedIdentity], max_open: int) -> list[SavedIdentity]:
    """What the state file keeps, from the SAVED_FIELDS values of the open records (`rows`): every
    open connection with an identity a mid-stream join could not see again (an accepted
    ApiVersions, a restoration, a principal, or an inferred identity: `SavedIdentity.inferred`,
    for a connection without software fields), then the restored identities still `waiting` for
    their quiet connection (so that a second restart does not lose them), newest first; at most
    `max_open` in all."""
    out = [SavedIdentity(
        client_address=a, client_port=cp, broker_address=b, broker_port=bp, listener=listener, client_id=cid,
        client_software_name=name, client_software_version=version,
        identity_version=iv if iv is not None else restored_iv, principal=principal, sasl_mechanism=mechanism,
        first_seen=first, last_seen=last, inferred=saved_inferred(inferred) if name is None else None)
        for a, cp, b, bp, listener, cid, name, version, iv, restored_iv, principal, mechanism, first, last,
        restored, inferred in rows if iv is not None or restored or principal or inferred is not None]
    room = max_open - len(out)
    if room > 0 and waiting:
        out.extend(waiting[-room:])
    return out


class RestoreTable:
    """Identities from the state file, by 4-tuple, oldest last_seen first: each waits for a
    mid-stream ConnectionOpened of its 4-tuple and is forgotten `ttl` seconds after its
    last_seen (the connection is gone). At most `max_open` of them (the newest)."""

    def __init__(self) -> None:
        self.waiting: OrderedDict[tuple, SavedIdentity] = OrderedDict()
        self.ttl = 0.0

    def load(self, saved: list[SavedIdentity], ttl: float, now: float, max_open: int) -> int:
        """Replace the waiting identities with `saved`, dropping those silent past `ttl` seconds
        at `now`. Returns how many are waiting."""
        cutoff = now - ttl
        fresh = sorted((s for s in saved if s.last_seen > cutoff), key=lambda s: s.last_seen)
        self.ttl = ttl
        self.waiting = OrderedDict((s.four_tuple(), s) for s in fresh[-max_open:])
        return len(self.waiting)

    def expire(self, now: float) -> None:
        """Forget the identities whose connection has been silent longer than the TTL at `now`."""
        pending = self.waiting
        if pending:
            cutoff = now - self.ttl
            while pending and next(iter(pending.values())).last_seen <= cutoff:
                pending.popitem(last=False)

    def take(self, ev: ConnectionOpened) -> SavedIdentity | None:
        """The identity saved for the connection `ev` opens, forgotten either way: only a
        connection joined mid-stream can be the one saved; one seen from its SYN on the same
        4-tuple is a new connection on a reused port, and the saved one is gone."""
        saved = self.waiting.pop((ev.client_address, ev.client_port, ev.broker_address, ev.broker_port), None)
        return saved if ev.mid_stream else None
