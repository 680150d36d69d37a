"""The inputs of the API table's generator (tools/gen_apis.py), which tools/gen_topics.py and
tools/record_brokers.py read too: Apache Kafka's message schemas and kio, read at generation time
and never copied into the repository.

This module owns reading them into ``Facts`` (what one source says about one API key) and
``Schemas`` (a source's facts and the API keys it marks removed): the schema JSON with its
comments, ``validVersions`` and ``flexibleVersions``, the request and response schemas that must
agree, and the sources themselves:

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
* ``<schemas>/README.md``: the provenance of both directories (the commit, the kafka-python
  release), which the generated files' headers name;
* the installed ``kio`` package (pinned in pyproject.toml's test extra), for the Kafka 4.x
  facts of API keys in neither the jar nor ``4.x-subset``.

Also the ``--schemas`` input (``SCHEMAS``) and the ``--kafka-clients-jar`` flag the generators
share. A build tool like its readers: it imports the standard library and tools/regen.py, and kio
lazily (only the generator needs it); the harness's pins are read as a literal, not imported.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tools import regen
from tools.regen import GenError

REPO_ROOT = Path(__file__).resolve().parents[1]
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
    ``__version__`` and ``__flexible__``. kio is imported here, lazily: only the API table's
    generator needs it.
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


# --------------------------------------------------------------------------- provenance and the jar's flag


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


def add_jar_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kafka-clients-jar", type=Path, default=None, metavar="PATH",
                        help="the kafka-clients jar whose common/message/*.json are the newest Kafka's schemas "
                             "(default: the newest release pinned in harness/kafka_broker.py, as `make setup-kafka` "
                             "installs it under build/kafka/)")
