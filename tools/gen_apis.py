"""Generator for ``capture/kafka/api_table.py``, the table of Kafka API keys and versions.

This module owns the *derivation* of the API table: which API keys exist, which request
versions any known Kafka accepts, from which version a request/response uses the flexible
(tagged-field) headers, and which versions Kafka 4.0 stopped accepting (KIP-896) by its schemas.
The upgrade targets come from real brokers instead (tools/gen_targets.py).

It is a build tool, run by hand (``make regen``) or by the drift test, and lives outside the
runtime package: nothing imports it at runtime, and the generated ``api_table.py`` does not
depend on it. It imports the standard library, tools/regen.py (the command line) and
tools/api_schemas.py, which reads the inputs (at generation time; they are never copied into the
repository, and that module says what each holds): the kafka-clients jar of the newest Kafka the
harness pins, ``<schemas>/3.9-trunk/*.json`` (before KIP-896), ``<schemas>/4.x-subset/*.json``
(the schemas kafka-python 3.0.12 ships) and the installed ``kio`` package.

The 4.x facts of an API key (its Kafka 4.x ``validVersions``, hence the highest versions, the new
keys and ``kafka4_min_version``/``kafka4_max_version``) come from the first of the jar,
``4.x-subset`` and kio that has the key; ``3.9-trunk`` adds the old versions (the lowest
versions, and so what KIP-896 removed). An API key present in ``3.9-trunk`` but in no 4.x
source was removed by Kafka 4.0.

Usage (from the repository root)::

    python -m tools.gen_apis [--schemas DIR] [--kafka-clients-jar PATH] [--check]

``DIR`` defaults to ``$KAFKA_SCHEMAS_DIR`` (``make regen SCHEMAS=DIR`` sets it); there is no
other default (docs/dependencies.md names the inputs and their versions), and without either
the generator says so, naming the variable and what DIR must hold. ``PATH`` defaults to the jar
``make setup-kafka`` installs inside the repository's ``build/`` (tools/api_schemas.py); a missing jar is an
error that says to run ``make setup-kafka``. The command line and the
write-or-check rule are tools/regen.py's, shared with tools/gen_fingerprints.py. Without
``--check`` the table is (re)written. With ``--check`` it is regenerated in memory and compared
with the committed file: exit 0 if identical, exit 1 with a unified diff on stderr if not. Any
error that prevents generation (missing inputs, inconsistent schemas, kio missing, the jar
missing) prints one line on stderr and exits 2.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from tools import regen
from tools.api_schemas import (
    JAR_SCHEMAS,
    JAR_SOURCE,
    NEW_DIR,
    OLD_DIR,
    SCHEMAS,
    Facts,
    Jar,
    add_jar_argument,
    default_clients_jar,
    kio_version,
    load_json_dir,
    load_kio,
    load_schemas,
    read_jar,
    read_provenance,
)
from tools.regen import GenError

REPO_ROOT = Path(__file__).resolve().parents[1]
OUTPUT_REL = "capture/kafka/api_table.py"
OUTPUT_PATH = REPO_ROOT / OUTPUT_REL

# Order in which listener names are emitted; names not listed here follow, sorted.
LISTENER_ORDER = ("zkBroker", "broker", "controller")


# --------------------------------------------------------------------------- merging


@dataclass
class Row:
    key: int
    name: str
    min_version: int
    max_version: int
    flexible_from: int | None
    kafka4_min_version: int | None
    kafka4_max_version: int | None
    listeners: tuple[str, ...]
    source_4x: str
    notes: list[str] = field(default_factory=list)

    def removed_in_kafka4(self) -> tuple[int, ...]:
        every = range(self.min_version, self.max_version + 1)
        if self.kafka4_min_version is None or self.kafka4_max_version is None:
            return tuple(every)
        return tuple(v for v in every if not self.kafka4_min_version <= v <= self.kafka4_max_version)


def order_listeners(names: set[str]) -> tuple[str, ...]:
    known = [n for n in LISTENER_ORDER if n in names]
    return tuple(known + sorted(names - set(LISTENER_ORDER)))


def merge(key: int, old: Facts | None, new: Facts | None) -> Row:
    """Combine what 3.9-trunk (``old``) and the 4.x source (``new``) say about one key."""
    sources = [f for f in (old, new) if f is not None]
    assert sources, key
    name = (new or old).name  # type: ignore[union-attr]

    # Flexibility must be one threshold for every known version: a version that both sources
    # have must agree, and no non-flexible version may follow a flexible one.
    flex_by_version: dict[int, bool] = {}
    for f in sources:
        for v in f.versions:
            is_flex = v in f.flexible
            if flex_by_version.setdefault(v, is_flex) != is_flex:
                raise GenError(
                    f"apiKey {key} ({name}): v{v} is {'' if is_flex else 'not '}flexible in "
                    f"{f.source} but {'not ' if is_flex else ''}flexible in {sources[0].source}"
                )
    all_versions = sorted(flex_by_version)
    if all_versions != list(range(all_versions[0], all_versions[-1] + 1)):
        raise GenError(f"apiKey {key} ({name}): versions across sources have a gap: {all_versions}")
    flexible_from = next((v for v in all_versions if flex_by_version[v]), None)
    if flexible_from is not None and not all(flex_by_version[v] for v in all_versions if v >= flexible_from):
        raise GenError(f"apiKey {key} ({name}): flexible versions are not of the form 'N+'")

    listeners: set[str] = set()
    for f in sources:
        listeners.update(f.listeners or ())

    notes: list[str] = []
    if old is None:
        notes.append(f"new in 4.x: not in {OLD_DIR}")
    elif new is not None and old.name != new.name:
        notes.append(f"named {old.name} in {OLD_DIR}")
    for f in sources:
        if f.unstable_latest:
            notes.append(f"{f.source}: v{f.versions[-1]} is latestVersionUnstable")
    if new is not None and new.listeners is None and old is None:
        notes.append("listeners unknown: kio carries none")

    return Row(
        key=key,
        name=name,
        min_version=all_versions[0],
        max_version=all_versions[-1],
        flexible_from=flexible_from,
        kafka4_min_version=new.versions[0] if new else None,
        kafka4_max_version=new.versions[-1] if new else None,
        listeners=order_listeners(listeners),
        source_4x=new.source if new else "removed",
        notes=notes,
    )


# --------------------------------------------------------------------------- rendering


MODULE_DOC = '''"""Kafka API keys and request versions, old and new (generated: see the header).

``API_TABLE`` maps every known Kafka API key to an ``ApiSpec``:

key
    The API key (request header ``request_api_key``).
name
    The schema name without the ``Request`` suffix, e.g. ``"Produce"``; the current (4.x)
    name when the API was renamed.
min_version, max_version
    The lowest and highest request version any known Kafka accepts: the union of the
    pre-KIP-896 schemas (3.9-trunk) and the Kafka 4.x ones (the newest release's, see the
    header). Unreleased ("unstable") latest versions are included; the end-of-line comments
    say where.
flexible_from
    The first flexible version: from it on, requests use request header v2 and responses
    response header v1 (tagged fields, compact strings). ``None``: never flexible. The same
    for request and response, and for old and new schemas (the generator checks both).
kafka4_min_version, kafka4_max_version
    The versions Kafka 4.x accepts (the ``validVersions`` of the newest release the header
    names, where it has the API). ``None``: the API was removed entirely by Kafka 4.0.
listeners
    Which listener types accept the API, from the schemas' ``listeners``, old and new
    combined (``"zkBroker"`` = a ZooKeeper-mode broker, which Kafka 4.0 no longer has).
    Empty when the only source (kio) carries no listener information.
source_4x
    Where the 4.x facts come from, the first that has the API: ``"kafka-clients"`` (the
    message schemas in the kafka-clients jar of the Kafka release the header names),
    ``"4.x-subset"`` (Kafka 4.x schemas vendored by kafka-python), ``"kio"`` (the kio
    package's generated 4.x classes), or ``"removed"`` (the API is in none of them).

``removed_in_kafka4(spec)`` gives the versions in [min_version, max_version] that Kafka 4.x
does not accept (KIP-896); ``REMOVED_IN_KAFKA4`` lists them for every key that has any.

The upgrade targets (what each broker release removed) are not here: they come from what real
brokers accepted (capture/kafka/upgrade_targets.py, tools/gen_targets.py).

This module is part of the sans-IO core: it imports nothing but ``typing``.
"""'''

HELPER = '''def removed_in_kafka4(spec: ApiSpec) -> tuple[int, ...]:
    """The versions in [min_version, max_version] that Kafka 4.x does not accept.

    All of them when the API was removed entirely (``kafka4_min_version is None``).
    """
    every = range(spec.min_version, spec.max_version + 1)
    lo, hi = spec.kafka4_min_version, spec.kafka4_max_version
    if lo is None or hi is None:
        return tuple(every)
    return tuple(v for v in every if not lo <= v <= hi)'''


def _opt(v: int | None) -> str:
    return "None" if v is None else str(v)


def render(rows: list[Row], jar: Jar, commit: str, kafka_python: str, kio: str) -> str:
    cells = []
    for r in rows:
        listeners = "(" + ", ".join(f'"{x}"' for x in r.listeners) + ("," if len(r.listeners) == 1 else "") + ")"
        cells.append(
            [
                f"{r.key},",
                f'"{r.name}",',
                f"{r.min_version},",
                f"{r.max_version},",
                f"{_opt(r.flexible_from)},",
                f"{_opt(r.kafka4_min_version)},",
                f"{_opt(r.kafka4_max_version)},",
                f"{listeners},",
                f'"{r.source_4x}"),',
            ]
        )
    titles = ["key", "name", "min", "max", "flex", "k4min", "k4max", "listeners", "source_4x"]
    widths = [max(len(t), *(len(c[i]) for c in cells)) for i, t in enumerate(titles)]
    key_width = max(len(f"{r.key}:") for r in rows)

    def line(parts: list[str]) -> str:
        return " ".join(p.ljust(w) for p, w in zip(parts, widths)).rstrip()

    lines = [
        "# Generated by `python -m tools.gen_apis` from Apache Kafka's message schemas: those of",
        f"# Apache Kafka {jar.kafka_version} ({JAR_SCHEMAS} in kafka-clients-{jar.kafka_version}.jar, "
        f"commit {jar.commit}),",
        f"# {OLD_DIR} at apache/kafka {commit}, {NEW_DIR} from kafka-python {kafka_python},",
        f"# and kio {kio}. DO NOT EDIT.",
        MODULE_DOC,
        "",
        "from typing import NamedTuple",
        "",
        "",
        "class ApiSpec(NamedTuple):",
        "    key: int",
        '    name: str  # schema name without the "Request" suffix, e.g. "Produce"',
        "    min_version: int  # lowest version any known Kafka accepts (from 3.9-trunk, or 4.x if new)",
        "    max_version: int  # highest version known in any source",
        "    flexible_from: int | None  # first flexible version (request header v2 / response header v1);"
        " None = never",
        "    kafka4_min_version: int | None  # lowest version Kafka 4.x accepts; None = API removed in Kafka 4.0",
        "    kafka4_max_version: int | None",
        '    listeners: tuple[str, ...]  # from the schemas\' "listeners", e.g. ("broker", "controller")',
        '    source_4x: str  # where the 4.x facts come from: "kafka-clients", "4.x-subset", "kio", or "removed"',
        "",
        "",
        "# fmt: off",
        "API_TABLE: dict[int, ApiSpec] = {",
    ]
    prefix_len = len("    ") + key_width + len(" ApiSpec(")
    lines.append("    #".ljust(prefix_len) + line(titles))  # column titles, aligned with the values
    for r, c in zip(rows, cells):
        text = "    " + f"{r.key}:".ljust(key_width) + " ApiSpec(" + line(c)
        if r.notes:
            text = text.rstrip() + "  # " + "; ".join(r.notes)
        lines.append(text)
    lines += ["}", "# fmt: on", "", ""]

    lines.append(HELPER)
    lines += ["", ""]
    removed = [(r.key, r.removed_in_kafka4()) for r in rows]
    removed = [(k, vs) for k, vs in removed if vs]
    lines.append("# Versions that Kafka 4.x no longer accepts, per API key (only keys that have any).")
    lines.append("REMOVED_IN_KAFKA4: dict[int, tuple[int, ...]] = {")
    names = {r.key: r.name for r in rows}
    for k, vs in removed:
        tup = "(" + ", ".join(map(str, vs)) + ("," if len(vs) == 1 else "") + ")"
        lines.append(f"    {k}: {tup},  # {names[k]}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def generate(schemas_dir: Path, clients_jar: Path | None = None) -> str:
    """The table's text from the schemas directory and the kafka-clients jar (default: the one
    ``make setup-kafka`` installs for the newest pinned release)."""
    for sub in (OLD_DIR, NEW_DIR):
        if not (schemas_dir / sub).is_dir():
            raise GenError(f"schemas directory {schemas_dir} has no {sub}/ subdirectory "
                           f"({SCHEMAS.env}: DIR holding {SCHEMAS.content})")
    commit, kafka_python = read_provenance(schemas_dir)
    jar = read_jar(clients_jar if clients_jar is not None else default_clients_jar())
    old = load_json_dir(schemas_dir / OLD_DIR, OLD_DIR)
    # The 4.x facts of each key: from the first source that has it (module docstring).
    newest = load_schemas(jar.files, JAR_SOURCE)
    new = dict(newest.facts)
    for key, facts in load_json_dir(schemas_dir / NEW_DIR, NEW_DIR).items():
        if key not in new and key not in newest.removed:
            new[key] = facts
    kio = kio_version()
    new.update(load_kio(exclude=set(new) | newest.removed))
    rows = [merge(k, old.get(k), new.get(k)) for k in sorted(set(old) | set(new))]
    return render(rows, jar, commit, kafka_python, kio)


def main(argv: list[str] | None = None) -> int:
    return regen.main(argv, prog="gen_apis", description=f"Generate {OUTPUT_REL} from the Kafka message schemas "
                      "(a kafka-clients jar and DIR) and kio.", spec=SCHEMAS, output=OUTPUT_PATH,
                      output_rel=OUTPUT_REL, add_arguments=add_jar_argument,
                      generate=lambda directory, args: generate(directory, args.kafka_clients_jar))


if __name__ == "__main__":
    sys.exit(main())
