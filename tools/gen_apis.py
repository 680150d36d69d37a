"""Generator for ``capture/kafka/api_table.py``, the table of Kafka API keys and versions.

This module owns the *derivation* of the API table: which API keys exist, which request
versions any known Kafka accepts, from which version a request/response uses the flexible
(tagged-field) headers, and which versions Kafka 4.0 stopped accepting (KIP-896) by its schemas.
The upgrade targets come from real brokers instead (tools/gen_targets.py).

It is a build tool, run by hand (``make regen``) or by the drift test, and lives outside the
runtime package: nothing imports it at runtime, and the generated ``api_table.py`` does not
depend on it.

Inputs, read at generation time and never copied into the repository:

* ``common/message/*.json`` inside the ``kafka-clients`` jar of the newest Kafka line the harness
  pins (``harness/kafka_broker.py`` ``KAFKA_VERSIONS``; ``make setup-kafka`` copies it to
  ``build/kafka/<version>/kafka-clients-<version>.jar``; ``--kafka-clients-jar PATH`` names
  another), read with ``zipfile``: every message schema of that Apache Kafka release, the first
  source of the Kafka 4.x facts (its ``validVersions`` are what that release accepts; an API it
  marks ``"validVersions": "none"`` was removed and is taken from no other 4.x source). Its
  release and commit come from the jar's ``kafka/kafka-version.properties``;
* ``<schemas>/3.9-trunk/*.json``: Apache Kafka message schemas from before KIP-896
  (every API key of that time, with all its old versions): every file of
  ``clients/src/main/resources/common/message/`` in apache/kafka at commit
  1eb7644349cb07139d6a3c1ad1986979647cac99 (2024-10-25);
* ``<schemas>/4.x-subset/*.json``: newer copies of part of the schemas (Kafka 4.1+ era), the
  ones kafka-python 3.0.12 ships under ``kafka/protocol/schemas/resources/``: the 4.x facts of
  API keys the jar does not have;
* the installed ``kio`` package (pinned in pyproject.toml's test extra), for the Kafka 4.x
  facts of API keys in neither the jar nor ``4.x-subset``; it is imported lazily, only by this
  generator.

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
``make setup-kafka`` installs inside the repository's ``build/`` (above); a missing jar is an
error that says to run ``make setup-kafka``. The command line and the
write-or-check rule are tools/regen.py's, shared with tools/gen_fingerprints.py. Without
``--check`` the table is (re)written. With ``--check`` it is regenerated in memory and compared
with the committed file: exit 0 if identical, exit 1 with a unified diff on stderr if not. Any
error that prevents generation (missing inputs, inconsistent schemas, kio missing, the jar
missing) prints one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tools import regen
from tools.regen import GenError

REPO_ROOT = Path(__file__).resolve().parents[1]
OUTPUT_REL = "capture/kafka/api_table.py"
OUTPUT_PATH = REPO_ROOT / OUTPUT_REL
OLD_DIR = "3.9-trunk"
NEW_DIR = "4.x-subset"
# The Kafka pins: harness/kafka_broker.py's KAFKA_VERSIONS, read as a literal rather than imported
# (the harness is a test tool, outside this build tool's imports and mypy's files), and the
# directory its install() (`make setup-kafka`) copies each release's jars into (its JARS_DIR).
PIN_FILE = REPO_ROOT / "harness" / "kafka_broker.py"
PIN_NAME = "KAFKA_VERSIONS"
JARS_DIR = REPO_ROOT / "build" / "kafka"
JAR_SOURCE = "kafka-clients"  # the source name of the jar's schemas (source_4x, notes)
JAR_SCHEMAS = "common/message/"  # where kafka-clients keeps the message schemas
JAR_VERSION_FILE = "kafka/kafka-version.properties"  # version=4.4.0, commitId=...
SCHEMAS = regen.Input(
    "--schemas", "KAFKA_SCHEMAS_DIR",
    f"Apache Kafka's message schemas: {OLD_DIR}/ (every file of clients/src/main/resources/common/message/ "
    f"at apache/kafka commit 1eb7644349cb07139d6a3c1ad1986979647cac99) and {NEW_DIR}/ (the schemas "
    "kafka-python 3.0.12 ships), with a README.md naming both")

# Order in which listener names are emitted; names not listed here follow, sorted.
LISTENER_ORDER = ("zkBroker", "broker", "controller")


# --------------------------------------------------------------------------- schema parsing


def strip_comments(text: str) -> str:
    """Remove ``//`` line comments and ``/* */`` block comments outside JSON strings.

    A "//" inside a string (e.g. a URL in an "about" text) is kept. Newlines are kept, so
    json error positions still point at the right line.
    """
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if c == '"':
                in_string = False
            i += 1
        elif c == '"':
            in_string = True
            out.append(c)
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise ValueError("unterminated /* comment")
            out.append("\n" * text.count("\n", i, end))
            i = end + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_valid_versions(value: str, where: str) -> tuple[int, int]:
    """``"0-11"`` -> (0, 11); ``"3"`` -> (3, 3). Open-ended ranges have no maximum: error."""
    v = value.strip()
    m = re.fullmatch(r"(\d+)(?:-(\d+))?", v)
    if not m:
        raise GenError(f"{where}: unsupported validVersions {value!r} (expected 'N' or 'N-M')")
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) is not None else lo
    if hi < lo:
        raise GenError(f"{where}: empty validVersions range {value!r}")
    return lo, hi


def parse_flexible_versions(value: str, where: str) -> int | None:
    """``"9+"`` -> 9; ``"none"`` -> None. Anything else is not a flexibleVersions we know."""
    v = value.strip()
    if v == "none":
        return None
    m = re.fullmatch(r"(\d+)\+", v)
    if not m:
        raise GenError(f"{where}: unsupported flexibleVersions {value!r} (expected 'N+' or 'none')")
    return int(m.group(1))


@dataclass(frozen=True)
class Facts:
    """What one source says about one API key."""

    source: str  # "kafka-clients", "3.9-trunk", "4.x-subset" or "kio"
    key: int
    name: str  # without the "Request" suffix
    versions: tuple[int, ...]  # contiguous, ascending
    flexible: frozenset[int]  # the versions (of `versions`) that are flexible
    listeners: tuple[str, ...] | None  # None: the source carries no listener information
    unstable_latest: bool = False  # schema says latestVersionUnstable: true


@dataclass(frozen=True)
class Schemas:
    """What one schema source says: the facts of each API key it has, and the API keys it marks
    removed (``"validVersions": "none"``, as Kafka 4.x's own schemas of the ZooKeeper-era APIs)."""

    facts: dict[int, Facts]
    removed: frozenset[int]


def read_dir(directory: Path) -> list[tuple[str, str]]:
    """(file name, text) of every ``*.json`` of a schema directory."""
    files = []
    for path in sorted(directory.glob("*.json")):
        try:
            files.append((path.name, path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as e:
            raise GenError(f"cannot read {path}: {e}") from None
    return files


def pinned_kafka_versions() -> dict[str, str]:
    """harness/kafka_broker.py's KAFKA_VERSIONS (line -> release), e.g. {"3.9": "3.9.2", "4": "4.4.0"}."""
    where = PIN_FILE.relative_to(REPO_ROOT)
    try:
        tree = ast.parse(PIN_FILE.read_text(encoding="utf-8"))
    except (OSError, SyntaxError) as e:
        raise GenError(f"cannot read {where}: {e}") from None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if [getattr(t, "id", None) for t in targets] != [PIN_NAME]:
            continue
        try:
            pins = ast.literal_eval(value)
        except ValueError:
            break
        if isinstance(pins, dict) and pins and all(isinstance(v, str) for v in pins.values()):
            return pins
        break
    raise GenError(f"{where}: no {PIN_NAME} = {{line: release, ...}} literal")


def newest_pinned_kafka() -> str:
    """The newest Kafka release the harness pins."""
    return max(pinned_kafka_versions().values(), key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)))


def default_clients_jar() -> Path:
    """Where ``make setup-kafka`` puts the kafka-clients jar of the newest pinned release."""
    version = newest_pinned_kafka()
    return JARS_DIR / version / f"kafka-clients-{version}.jar"


@dataclass(frozen=True)
class Jar:
    """The message schemas of one Apache Kafka release, from its kafka-clients jar."""

    path: Path
    kafka_version: str  # from kafka/kafka-version.properties
    commit: str
    files: list[tuple[str, str]]  # (file name, text) of common/message/*.json


def read_jar(path: Path) -> Jar:
    """Read ``common/message/*.json`` and the release of a kafka-clients jar."""
    if not path.is_file():
        raise GenError(f"kafka-clients jar not found: {path} (Apache Kafka {newest_pinned_kafka()}'s message "
                       f"schemas): run `make setup-kafka`, or pass --kafka-clients-jar PATH")
    try:
        with zipfile.ZipFile(path) as jar:
            names = sorted(n for n in jar.namelist()
                           if n.startswith(JAR_SCHEMAS) and n.endswith(".json") and "/" not in n[len(JAR_SCHEMAS):])
            files = [(n[len(JAR_SCHEMAS):], jar.read(n).decode("utf-8")) for n in names]
            props = jar.read(JAR_VERSION_FILE).decode("utf-8") if JAR_VERSION_FILE in jar.namelist() else ""
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise GenError(f"cannot read the kafka-clients jar {path}: {e}") from None
    if not files:
        raise GenError(f"{path}: no {JAR_SCHEMAS}*.json in it: not a kafka-clients jar")
    version = re.search(r"(?m)^version=(\S+)$", props)
    commit = re.search(r"(?m)^commitId=(\S+)$", props)
    if not version or not commit:
        raise GenError(f"{path}: no version and commitId in {JAR_VERSION_FILE}")
    return Jar(path=path, kafka_version=version.group(1), commit=commit.group(1), files=files)


def load_json_dir(directory: Path, source: str) -> dict[int, Facts]:
    """Read every ``*Request.json`` of one schema directory, with its ``*Response.json``."""
    return load_schemas(read_dir(directory), source).facts


def load_schemas(files: Iterable[tuple[str, str]], source: str) -> Schemas:
    """Read every ``*Request.json`` of one source's (file name, text) pairs, with its
    ``*Response.json``."""
    schemas: dict[str, tuple[str, dict]] = {}
    for file_name, text in files:
        try:
            data = json.loads(strip_comments(text))
        except ValueError as e:
            raise GenError(f"{source}/{file_name}: cannot parse: {e}") from None
        if not isinstance(data, dict):
            raise GenError(f"{source}/{file_name}: top level is not an object")
        if data.get("type") in ("request", "response"):
            name = data.get("name")
            if name != file_name.removesuffix(".json"):
                raise GenError(f"{source}/{file_name}: schema name {name!r} != file name")
            schemas[name] = (file_name, data)

    result: dict[int, Facts] = {}
    removed: set[int] = set()
    for name, (file_name, req) in sorted(schemas.items()):
        if req["type"] != "request":
            continue
        where = f"{source}/{file_name}"
        if not name.endswith("Request"):
            raise GenError(f"{where}: request schema name does not end in 'Request'")
        base = name[: -len("Request")]
        key = req.get("apiKey")
        if not isinstance(key, int):
            raise GenError(f"{where}: missing or non-integer apiKey")
        resp_entry = schemas.get(base + "Response")
        if resp_entry is None:
            raise GenError(f"{where}: no {base}Response schema beside it")
        resp_file, resp = resp_entry
        rwhere = f"{source}/{resp_file}"
        if resp.get("type") != "response" or resp.get("apiKey") != key:
            raise GenError(f"{rwhere}: not a response schema for apiKey {key}")

        if str(req.get("validVersions")).strip() == "none":
            # "This request was removed in Apache Kafka 4.0." (Kafka 4.x's ControlledShutdownRequest.json)
            if str(resp.get("validVersions")).strip() != "none":
                raise GenError(f"{source}: {base} request validVersions is 'none' but the response's "
                               f"is {resp.get('validVersions')!r}")
            if key in result or key in removed:
                raise GenError(f"{source}: apiKey {key} of removed {base} is used twice")
            removed.add(key)
            continue
        lo, hi = parse_valid_versions(req["validVersions"], where)
        if parse_valid_versions(resp["validVersions"], rwhere) != (lo, hi):
            raise GenError(
                f"{source}: {base} validVersions disagree: request {req['validVersions']!r}, "
                f"response {resp['validVersions']!r}"
            )
        flex_req = parse_flexible_versions(req.get("flexibleVersions", ""), where)
        flex_resp = parse_flexible_versions(resp.get("flexibleVersions", ""), rwhere)
        if flex_req != flex_resp:
            raise GenError(
                f"{source}: {base} flexibleVersions disagree: request "
                f"{req.get('flexibleVersions')!r}, response {resp.get('flexibleVersions')!r}"
            )
        versions = tuple(range(lo, hi + 1))
        flexible = frozenset(v for v in versions if flex_req is not None and v >= flex_req)
        listeners = req.get("listeners")
        if not (isinstance(listeners, list) and all(isinstance(x, str) for x in listeners)):
            raise GenError(f"{where}: missing or malformed listeners")
        if key in result:
            raise GenError(f"{source}: apiKey {key} used by both {result[key].name} and {base}")
        if key in removed:
            raise GenError(f"{source}: apiKey {key} of {base} is also marked removed")
        result[key] = Facts(
            source=source,
            key=key,
            name=base,
            versions=versions,
            flexible=flexible,
            listeners=tuple(listeners),
            unstable_latest=req.get("latestVersionUnstable") is True,
        )
    if not result:
        raise GenError(f"{source}: no request schemas found")
    return Schemas(facts=result, removed=frozenset(removed))


# --------------------------------------------------------------------------- kio


def kio_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("kio")
    except PackageNotFoundError:
        raise GenError("the 'kio' package is not installed (pip install -e '.[test]')") from None


def load_kio(exclude: set[int]) -> dict[int, Facts]:
    """Kafka 4.x facts for every API key kio knows, except ``exclude``, from kio's classes.

    kio maps each API key to a schema name (``kio.schema.index.api_key_map``) and each
    name/version to its request and response classes (``schema_name_map``, pointing at
    ``kio/schema/<name>/v<N>/request.py``); every class carries ``__api_key__``,
    ``__version__`` and ``__flexible__``. kio is imported here, lazily: only this generator
    needs it.
    """
    try:
        from kio.index import load_entity_schema
        from kio.schema.index import api_key_map, schema_name_map
        from kio.static.constants import EntityType
    except ImportError as e:
        raise GenError(f"cannot import kio ({e}); install it with pip install -e '.[test]'") from None

    result: dict[int, Facts] = {}
    for key, snake in sorted(api_key_map.items()):
        if key in exclude:
            continue
        by_version = schema_name_map[snake]
        versions = tuple(sorted(v for v, types in by_version.items() if EntityType.request in types))
        where = f"kio schema {snake!r} (apiKey {key})"
        if not versions:
            raise GenError(f"{where}: no request versions")
        if versions != tuple(range(versions[0], versions[-1] + 1)):
            raise GenError(f"{where}: request versions are not contiguous: {versions}")
        flexible: set[int] = set()
        names: set[str] = set()
        for v in versions:
            req = load_entity_schema(snake, v, EntityType.request)
            resp = load_entity_schema(snake, v, EntityType.response)
            for cls in (req, resp):
                # kio's Entity protocol does not declare __api_key__; its request and response classes have it
                api_key = int(cls.__api_key__)  # type: ignore[attr-defined]
                if api_key != key or int(cls.__version__) != v:
                    raise GenError(
                        f"{where}: {cls.__module__}.{cls.__name__} says apiKey "
                        f"{api_key} version {int(cls.__version__)}, expected {key} v{v}"
                    )
            if bool(req.__flexible__) != bool(resp.__flexible__):
                raise GenError(
                    f"{where}: v{v} request flexible={req.__flexible__} but response "
                    f"flexible={resp.__flexible__}"
                )
            if req.__flexible__:
                flexible.add(v)
            if not req.__name__.endswith("Request"):
                raise GenError(f"{where}: request class {req.__name__!r} does not end in 'Request'")
            names.add(req.__name__[: -len("Request")])
        if len(names) != 1:
            raise GenError(f"{where}: request class name changes across versions: {sorted(names)}")
        result[key] = Facts(
            source="kio",
            key=key,
            name=names.pop(),
            versions=versions,
            flexible=frozenset(flexible),
            listeners=None,
        )
    return result


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


def read_provenance(schemas_dir: Path) -> tuple[str, str]:
    """(apache/kafka commit of 3.9-trunk, kafka-python version of 4.x-subset) from README.md."""
    readme = schemas_dir / "README.md"
    try:
        text = readme.read_text(encoding="utf-8")
    except OSError as e:
        raise GenError(f"cannot read {readme}: {e}") from None
    commit = re.search(r"\bcommit\s+([0-9a-f]{40})\b", text)
    kp = re.search(r"\bkafka-python\s+(\d+(?:\.\d+)+)\b", text)
    if not commit or not kp:
        raise GenError(f"{readme}: cannot find the apache/kafka commit and kafka-python version")
    return commit.group(1), kp.group(1)


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


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kafka-clients-jar", type=Path, default=None, metavar="PATH",
                        help="the kafka-clients jar whose common/message/*.json are the newest Kafka's schemas "
                             "(default: the newest release pinned in harness/kafka_broker.py, as `make setup-kafka` "
                             "installs it under build/kafka/)")


def main(argv: list[str] | None = None) -> int:
    return regen.main(argv, prog="gen_apis", description=f"Generate {OUTPUT_REL} from the Kafka message schemas "
                      "(a kafka-clients jar and DIR) and kio.", spec=SCHEMAS, output=OUTPUT_PATH,
                      output_rel=OUTPUT_REL, add_arguments=_add_arguments,
                      generate=lambda directory, args: generate(directory, args.kafka_clients_jar))


if __name__ == "__main__":
    sys.exit(main())
