"""Generator for ``capture/kafka/topic_layouts.py``: where topics, groups and transactional ids
sit in the request and response bodies the core reads with ``KafkaConnection(topics=True)``.

This module owns the *derivation* of those layouts from Apache Kafka's message schemas: for
every version the API table (capture/kafka/api_table.py) knows of each API below, the fields
of its body in wire order, reduced to what a walker needs to reach the fields it keeps
(fixed-size runs merged into one skip, strings, bytes and arrays skipped by their length,
the tagged-field sections of flexible versions) and cut after the last field it keeps. Which
fields are kept, and as what, is the table `REQUESTS` / `RESPONSES` / `SUBSCRIPTION` below,
by field path; the generator fails when a path names no field of the schema, or a field of
another type, so that a schema change cannot silently move a field.

A build tool like tools/gen_apis.py (``make regen``; tests/core/test_topics.py runs it with
``--check`` when the inputs are named). Inputs, read at generation time (by tools/api_schemas.py,
as the API table's) and never copied into the repository:

* ``common/message/*.json`` inside the kafka-clients jar of the newest Kafka the harness pins
  (tools/api_schemas.py's ``default_clients_jar``; ``--kafka-clients-jar PATH`` names another):
  the schema of every version it accepts;
* ``<schemas>/3.9-trunk/*.json`` (``$KAFKA_SCHEMAS_DIR``, as tools/gen_apis.py): the schemas
  before KIP-896, for the older versions Kafka 4 removed.

Each version comes from the first of the two whose ``validVersions`` has it; a version of the
API table in neither is an error.

Usage (from the repository root)::

    python -m tools.gen_topics [--schemas DIR] [--kafka-clients-jar PATH] [--check]
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tools import api_schemas, regen
from tools.regen import GenError

REPO_ROOT = Path(__file__).resolve().parents[1]
OUTPUT_REL = "capture/kafka/topic_layouts.py"
OUTPUT_PATH = REPO_ROOT / OUTPUT_REL
API_TABLE_PATH = REPO_ROOT / "capture" / "kafka" / "api_table.py"

# The operations of a layout, walked by capture/kafka/topic_walk.py (MODULE_DOC below says what
# each reads). A layout is a flat tuple: operation, argument, operation, argument, ...
OPS = ("FIXED", "STRING", "BYTES", "ARRAY", "ENTRIES", "FIXED_ARRAY", "TAGS", "TOPIC", "TOPIC_ID", "RECORDS",
       "TOPIC_NAMES", "GROUP", "MEMBER", "INSTANCE", "PROTOCOL_TYPE", "TXN", "REPLICA", "METADATA")
OP = {name: code for code, name in enumerate(OPS)}
# What each kept field must be in the schema.
CAPTURE_TYPES = {
    "TOPIC": "string", "TOPIC_ID": "uuid", "RECORDS": "records", "TOPIC_NAMES": "[]string", "GROUP": "string",
    "MEMBER": "string", "INSTANCE": "string", "PROTOCOL_TYPE": "string", "TXN": "string", "REPLICA": "int32",
    "METADATA": "bytes",
}
FIXED_SIZES = {"int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "float64": 8, "bool": 1,
               "uuid": 16}


@dataclass(frozen=True)
class Message:
    """What the core keeps of one request or response: its schema name, the TopicUsage use of
    the topics it names (None: it names none, or they go elsewhere), the versions read
    (None: every version of the API table), and the kept fields by path."""

    schema: str
    use: str | None
    captures: dict[str, str]
    versions: tuple[int, int | None] | None = None


# By API key. Field paths are the schemas' names, joined by dots through arrays and structs.
REQUESTS = {
    0: Message("ProduceRequest", "produce", {
        "TransactionalId": "TXN", "TopicData.Name": "TOPIC", "TopicData.TopicId": "TOPIC_ID",
        "TopicData.PartitionData.Records": "RECORDS"}),
    1: Message("FetchRequest", "fetch", {  # "replicate" when ReplicaId >= 0 (topics.py)
        "ReplicaId": "REPLICA", "ReplicaState.ReplicaId": "REPLICA", "Topics.Topic": "TOPIC",
        "Topics.TopicId": "TOPIC_ID"}),
    2: Message("ListOffsetsRequest", "list_offsets", {"Topics.Name": "TOPIC"}),
    3: Message("MetadataRequest", "metadata", {"Topics.Name": "TOPIC", "Topics.TopicId": "TOPIC_ID"}),
    8: Message("OffsetCommitRequest", "offset_commit", {
        "GroupId": "GROUP", "MemberId": "MEMBER", "GroupInstanceId": "INSTANCE", "Topics.Name": "TOPIC",
        "Topics.TopicId": "TOPIC_ID"}),
    9: Message("OffsetFetchRequest", "offset_fetch", {
        "GroupId": "GROUP", "Topics.Name": "TOPIC", "Groups.GroupId": "GROUP", "Groups.MemberId": "MEMBER",
        "Groups.Topics.Name": "TOPIC", "Groups.Topics.TopicId": "TOPIC_ID"}),
    11: Message("JoinGroupRequest", "subscribe", {
        "GroupId": "GROUP", "MemberId": "MEMBER", "GroupInstanceId": "INSTANCE", "ProtocolType": "PROTOCOL_TYPE",
        "Protocols.Metadata": "METADATA"}),
    12: Message("HeartbeatRequest", None, {"GroupId": "GROUP", "MemberId": "MEMBER", "GroupInstanceId": "INSTANCE"}),
    13: Message("LeaveGroupRequest", None, {
        "GroupId": "GROUP", "MemberId": "MEMBER", "Members.MemberId": "MEMBER",
        "Members.GroupInstanceId": "INSTANCE"}),
    14: Message("SyncGroupRequest", None, {"GroupId": "GROUP", "MemberId": "MEMBER", "GroupInstanceId": "INSTANCE"}),
    19: Message("CreateTopicsRequest", "create", {"Topics.Name": "TOPIC"}),
    20: Message("DeleteTopicsRequest", "delete", {
        "TopicNames": "TOPIC_NAMES", "Topics.Name": "TOPIC", "Topics.TopicId": "TOPIC_ID"}),
    22: Message("InitProducerIdRequest", None, {"TransactionalId": "TXN"}),
    # v4+ batch transactions between brokers (KIP-890): not a client's request.
    24: Message("AddPartitionsToTxnRequest", "txn", {
        "V3AndBelowTransactionalId": "TXN", "V3AndBelowTopics.Name": "TOPIC"}, versions=(0, 3)),
    25: Message("AddOffsetsToTxnRequest", None, {"TransactionalId": "TXN"}),
    26: Message("EndTxnRequest", None, {"TransactionalId": "TXN"}),
    28: Message("TxnOffsetCommitRequest", "offset_commit", {
        "TransactionalId": "TXN", "GroupId": "GROUP", "MemberId": "MEMBER", "GroupInstanceId": "INSTANCE",
        "Topics.Name": "TOPIC", "Topics.TopicId": "TOPIC_ID"}),
    68: Message("ConsumerGroupHeartbeatRequest", "subscribe", {
        "GroupId": "GROUP", "MemberId": "MEMBER", "InstanceId": "INSTANCE", "SubscribedTopicNames": "TOPIC_NAMES"}),
}
RESPONSES = {
    # The use is the request's (fetch or replicate).
    1: Message("FetchResponse", None, {
        "Responses.Topic": "TOPIC", "Responses.TopicId": "TOPIC_ID", "Responses.Partitions.Records": "RECORDS"}),
    # Names paired with ids: v10+ only (KIP-516).
    3: Message("MetadataResponse", None, {"Topics.Name": "TOPIC", "Topics.TopicId": "TOPIC_ID"}, versions=(10, None)),
}
# JoinGroup's protocol metadata when ProtocolType is "consumer": a Version int16, then the
# subscription of that version (never flexible).
SUBSCRIPTION = Message("ConsumerProtocolSubscription", None, {"Topics": "TOPIC_NAMES"})


# --------------------------------------------------------------------------- schemas


def parse_versions(spec: str | None, where: str) -> tuple[int, int] | None:
    """"3+" -> (3, None-as-huge); "0-12" -> (0, 12); "5" -> (5, 5); "none" -> None."""
    if spec is None:
        raise GenError(f"{where}: no versions")
    s = str(spec).strip()
    if s == "none":
        return None
    m = re.fullmatch(r"(\d+)(\+|-(\d+))?", s)
    if not m:
        raise GenError(f"{where}: unsupported versions {spec!r}")
    lo = int(m.group(1))
    if m.group(2) == "+":
        return lo, 1 << 30
    return lo, int(m.group(3)) if m.group(3) else lo


def has_version(spec: str | None, version: int, where: str) -> bool:
    r = parse_versions(spec, where)
    return r is not None and r[0] <= version <= r[1]


@dataclass
class Schema:
    source: str
    data: dict

    @property
    def name(self) -> str:
        return self.data["name"]

    def valid(self, version: int) -> bool:
        return has_version(self.data.get("validVersions"), version, f"{self.source}/{self.name}")

    def flexible(self, version: int) -> bool:
        return has_version(self.data.get("flexibleVersions", "none"), version, f"{self.source}/{self.name}")


def load_sources(schemas_dir: Path, jar_path: Path | None) -> tuple[list[dict[str, Schema]], api_schemas.Jar]:
    """The schemas by name: the jar's first, then 3.9-trunk's."""
    jar = api_schemas.read_jar(jar_path if jar_path is not None else api_schemas.default_clients_jar())
    old_dir = schemas_dir / api_schemas.OLD_DIR
    if not old_dir.is_dir():
        raise GenError(f"schemas directory {schemas_dir} has no {api_schemas.OLD_DIR}/ subdirectory "
                       f"({api_schemas.SCHEMAS.env}: DIR holding {api_schemas.SCHEMAS.content})")
    sources = []
    for source, files in ((api_schemas.JAR_SOURCE, jar.files), (api_schemas.OLD_DIR, api_schemas.read_dir(old_dir))):
        by_name: dict[str, Schema] = {}
        for file_name, text in files:
            try:
                data = json.loads(api_schemas.strip_comments(text))
            except ValueError as e:
                raise GenError(f"{source}/{file_name}: cannot parse: {e}") from None
            if isinstance(data, dict) and isinstance(data.get("name"), str):
                by_name[data["name"]] = Schema(source, data)
        sources.append(by_name)
    return sources, jar


def schema_for(sources: list[dict[str, Schema]], name: str, version: int) -> Schema:
    for by_name in sources:
        schema = by_name.get(name)
        if schema is not None and schema.valid(version):
            return schema
    raise GenError(f"{name} v{version}: in no schema source ({api_schemas.JAR_SOURCE}, {api_schemas.OLD_DIR})")


def api_table_versions() -> dict[int, tuple[int, int]]:
    """(min_version, max_version) per API key, read from the committed api_table.py's rows."""
    text = API_TABLE_PATH.read_text(encoding="utf-8")
    rows = re.findall(r"^\s+(\d+):\s+ApiSpec\(\d+,\s+\"\w+\",\s+(\d+),\s+(\d+),", text, re.M)
    if not rows:
        raise GenError(f"{API_TABLE_PATH.relative_to(REPO_ROOT)}: no ApiSpec rows")
    return {int(k): (int(lo), int(hi)) for k, lo, hi in rows}


# --------------------------------------------------------------------------- layouts


class Builder:
    """The layout of one message at one version."""

    def __init__(self, schema: Schema, version: int, captures: dict[str, str]) -> None:
        self.schema = schema
        self.version = version
        self.flexible = schema.flexible(version)
        self.captures = captures
        self.used: set[str] = set()
        self.structs = {s["name"]: s for s in schema.data.get("commonStructs", [])}
        self.where = f"{schema.source}/{schema.name} v{version}"

    def present(self, f: dict) -> bool:
        return has_version(f.get("versions"), self.version, f"{self.where} {f.get('name')}")

    def tagged(self, f: dict) -> bool:
        return "taggedVersions" in f and has_version(f["taggedVersions"], self.version, f"{self.where} {f['name']}")

    def struct_fields(self, f: dict) -> list[dict]:
        if "fields" in f:
            return f["fields"]
        t = f["type"].removeprefix("[]")
        if t in self.structs:
            return self.structs[t]["fields"]
        raise GenError(f"{self.where}: {f['name']}: struct {t} not found")

    def layout(self) -> tuple:
        ops = self.struct(self.schema.data["fields"], "")
        missing = [p for p in self.captures if p not in self.used]
        return trim(ops), missing

    def struct(self, fields: list[dict], prefix: str) -> list:
        """A struct's fields in wire order, then (flexible) its tagged-field section."""
        ops: list = []
        tags: list = []
        for f in fields:
            if not self.present(f):
                continue
            if f.get("flexibleVersions") is not None:
                raise GenError(f"{self.where}: {f['name']} overrides flexibleVersions: not supported")
            path = prefix + f["name"]
            if self.flexible and self.tagged(f):
                inner = self.field(f, path)
                if contains_capture(inner):
                    tags += [int(f["tag"]), tuple(trim(inner))]
                continue
            ops += self.field(f, path)
        if self.flexible:
            ops += [OP["TAGS"], tuple(tags)]
        return merge_fixed(ops)

    def field(self, f: dict, path: str) -> list:
        t = f["type"]
        capture = self.captures.get(path)
        if capture is not None:
            if CAPTURE_TYPES[capture] != t:
                raise GenError(f"{self.where}: {path} is a {t}, not the {CAPTURE_TYPES[capture]} {capture} reads")
            self.used.add(path)
            return [OP[capture], 0]
        if t in FIXED_SIZES:
            return [OP["FIXED"], FIXED_SIZES[t]]
        if t == "string":
            return [OP["STRING"], 0]
        if t in ("bytes", "records"):
            return [OP["BYTES"], 0]
        if t.startswith("[]"):
            item = t[2:]
            if item in FIXED_SIZES:
                return [OP["FIXED_ARRAY"], FIXED_SIZES[item]]
            if item == "string":
                return [OP["ARRAY"], (OP["STRING"], 0)]
            if item in ("bytes", "records"):
                return [OP["ARRAY"], (OP["BYTES"], 0)]
            inner = self.struct(self.struct_fields(f), path + ".")
            names = {inner[i] for i in range(0, len(inner), 2)}
            if names & {OP["TOPIC"], OP["TOPIC_ID"]}:
                return [OP["ENTRIES"], tuple(inner)]
            if len(inner) == 2 and inner[0] == OP["FIXED"]:
                return [OP["FIXED_ARRAY"], inner[1]]
            return [OP["ARRAY"], tuple(inner)]
        if f.get("nullableVersions") and has_version(f["nullableVersions"], self.version, self.where):
            raise GenError(f"{self.where}: {path}: a nullable struct outside a tagged field: not supported")
        return self.struct(self.struct_fields(f), path + ".")  # a struct: inline


def merge_fixed(ops: list) -> list:
    out: list = []
    for i in range(0, len(ops), 2):
        op, arg = ops[i], ops[i + 1]
        if op == OP["FIXED"] and out and out[-2] == OP["FIXED"]:
            out[-1] += arg
        else:
            out += [op, arg]
    return out


def contains_capture(ops) -> bool:
    for i in range(0, len(ops), 2):
        op, arg = ops[i], ops[i + 1]
        if OPS[op] in CAPTURE_TYPES:
            return True
        if OPS[op] == "TAGS":
            if any(contains_capture(arg[j + 1]) for j in range(0, len(arg), 2)):
                return True
        elif isinstance(arg, tuple) and contains_capture(arg):
            return True
    return False


def trim(ops: list) -> list:
    """Cut after the last operation that keeps something: nothing after it is read."""
    last = -2
    for i in range(0, len(ops), 2):
        if contains_capture(ops[i:i + 2]):
            last = i
    return ops[:last + 2]


def message_layouts(sources, table: dict[int, tuple[int, int]], key: int, message: Message) -> dict[int, tuple]:
    if key not in table:
        raise GenError(f"apiKey {key} ({message.schema}) is not in the API table")
    lo, hi = table[key]
    if message.versions is not None:
        lo = max(lo, message.versions[0])
        hi = min(hi, message.versions[1]) if message.versions[1] is not None else hi
    out = {}
    used: set[str] = set()
    for v in range(lo, hi + 1):
        schema = schema_for(sources, message.schema, v)
        builder = Builder(schema, v, message.captures)
        ops, _ = builder.layout()
        used |= builder.used
        out[v] = (schema.flexible(v), tuple(ops))
    unused = sorted(set(message.captures) - used)
    if unused:
        raise GenError(f"{message.schema}: no version has the field(s) {', '.join(unused)}: the schema changed")
    return out


# --------------------------------------------------------------------------- rendering


def render_ops(ops) -> str:
    parts = []
    for i in range(0, len(ops), 2):
        op, arg = ops[i], ops[i + 1]
        if OPS[op] == "TAGS":
            inner = ", ".join(f"{arg[j]}, {render_ops(arg[j + 1])}" for j in range(0, len(arg), 2))
            parts.append(f"TAGS, ({inner}{',' if len(arg) == 1 else ''})")
        elif isinstance(arg, tuple):
            parts.append(f"{OPS[op]}, {render_ops(arg)}")
        else:
            parts.append(f"{OPS[op]}, {arg}")
    return "(" + ", ".join(parts) + ")"


MODULE_DOC = '''"""Where topics, groups and transactional ids sit in the bodies the core reads with
`KafkaConnection(topics=True)` (generated from Apache Kafka's message schemas: see the header).

`REQUESTS[(api_key, version)]` and `RESPONSES[(api_key, version)]` are `(use, flexible,
layout)`: the TopicUsage use of the topics the message names (None: it names none, or the
request's use applies), whether the version is flexible (compact lengths, tagged fields, KIP-482),
and the layout capture/kafka/topic_walk.py walks. `SUBSCRIPTION[version]` is the layout of a
ConsumerProtocolSubscription (JoinGroup's protocol metadata of a consumer), after its Version.

A layout is a flat tuple, `op, arg, op, arg, ...`, in wire order, cut after the last field kept:

    FIXED n          skip n bytes
    STRING           skip a (nullable) string: int16 length, flexible: uvarint length + 1
    BYTES            skip (nullable) bytes or records: int32 length, flexible: uvarint length + 1
    ARRAY ops        an array (int32 count, flexible: uvarint count + 1; null: none) of items laid out as ops
    ENTRIES ops      as ARRAY, each item naming one topic (its TOPIC and/or TOPIC_ID, the RECORDS under it)
    FIXED_ARRAY n    an array of n-byte items
    TAGS (tag, ops, ...)  a tagged-field section: the tags listed are walked inside their field,
                     every other tag is skipped by its size
    TOPIC            (nullable) string: the entry's topic name
    TOPIC_ID         uuid: the entry's topic id
    RECORDS          (nullable) records: the size added to the entry's bytes (batches are never read)
    TOPIC_NAMES      an array of strings, each naming a topic
    GROUP, MEMBER, INSTANCE, PROTOCOL_TYPE, TXN   (nullable) strings kept
    REPLICA          int32: Fetch's ReplicaId
    METADATA         bytes: a JoinGroup protocol's metadata (a ConsumerProtocolSubscription when
                     the ProtocolType is "consumer")

This module is part of the sans-IO core: it imports nothing.
"""'''


def render(layouts: dict, jar: api_schemas.Jar, commit: str) -> str:
    lines = [
        "# Generated by `python -m tools.gen_topics` from Apache Kafka's message schemas: those of",
        f"# Apache Kafka {jar.kafka_version} ({api_schemas.JAR_SCHEMAS} in kafka-clients-{jar.kafka_version}.jar, "
        f"commit {jar.commit}),",
        f"# and {api_schemas.OLD_DIR} at apache/kafka {commit} for the versions Kafka 4 removed. DO NOT EDIT.",
        "# ruff: noqa: E501 (one layout per line)",
        MODULE_DOC,
        "",
        "# fmt: off",
    ]
    lines += [f"{name} = {code}" for code, name in enumerate(OPS)]
    for title, table in (("REQUESTS", REQUESTS), ("RESPONSES", RESPONSES)):
        lines += ["", f"{title}: dict = {{"]
        for key, message in table.items():
            lines.append(f"    # {message.schema}" + (f": use {message.use!r}" if message.use else ""))
            for v, (flexible, ops) in layouts[title][key].items():
                lines.append(f"    ({key}, {v}): ({message.use!r}, {flexible}, {render_ops(ops)}),")
        lines.append("}")
    lines += ["", "SUBSCRIPTION: dict = {"]
    for v, (_, ops) in layouts["SUBSCRIPTION"].items():
        lines.append(f"    {v}: {render_ops(ops)},")
    lines += ["}", "# fmt: on", ""]
    return "\n".join(lines)


def generate(schemas_dir: Path, clients_jar: Path | None = None) -> str:
    sources, jar = load_sources(schemas_dir, clients_jar)
    commit, _ = api_schemas.read_provenance(schemas_dir)
    table = api_table_versions()
    layouts: dict = {"REQUESTS": {}, "RESPONSES": {}}
    for title, messages in (("REQUESTS", REQUESTS), ("RESPONSES", RESPONSES)):
        for key, message in messages.items():
            layouts[title][key] = message_layouts(sources, table, key, message)
    sub = sources[0].get(SUBSCRIPTION.schema) or sources[1].get(SUBSCRIPTION.schema)
    if sub is None:
        raise GenError(f"{SUBSCRIPTION.schema}: in no schema source")
    lo, hi = parse_versions(sub.data.get("validVersions"), SUBSCRIPTION.schema) or (0, -1)
    layouts["SUBSCRIPTION"] = {}
    for v in range(lo, hi + 1):
        ops, missing = Builder(sub, v, SUBSCRIPTION.captures).layout()
        if missing or sub.flexible(v):
            raise GenError(f"{SUBSCRIPTION.schema} v{v}: no {missing} or flexible: the schema changed")
        layouts["SUBSCRIPTION"][v] = (False, tuple(ops))
    return render(layouts, jar, commit)


def main(argv: list[str] | None = None) -> int:
    return regen.main(argv, prog="gen_topics", description=f"Generate {OUTPUT_REL} from the Kafka message schemas "
                      "(a kafka-clients jar and DIR).", spec=api_schemas.SCHEMAS, output=OUTPUT_PATH,
                      output_rel=OUTPUT_REL, add_arguments=api_schemas.add_jar_argument,
                      generate=lambda directory, args: generate(directory, args.kafka_clients_jar))


if __name__ == "__main__":
    sys.exit(main())
