"""Record what real Apache Kafka brokers accept: the facts the upgrade targets are built from (issue 27).

    .venv/bin/python -m tools.record_brokers [--only 4.0.1 ...]      (needs Java 17 and Maven)

Not part of `make test`: its output, tests/fixtures/kafka-brokers/<version>.json, is committed, and
tools/gen_targets.py builds capture/kafka/upgrade_targets.py from it (`make regen`). For each
release in RELEASES, Maven installs it (harness.kafka_broker.install), one KRaft node starts on
loopback, and the recorder writes:
- `api_ranges`: its ApiVersions v0 answer, [api_key, min, max] per API, read off the wire;
- `refused`: the versions it advertises but will not serve. A broker's answer is not the whole
  truth: Kafka 4.x lists Produce from v0 though it closes the connection on v0-2 (KIP-896). The
  candidates are the advertised versions that the release's own request schema
  (common/message/<Name>Request.json in its kafka-clients jar) does not list as valid; each is
  probed with a minimal request (every field zero, empty or null, encoded from the 3.9 schema,
  $KAFKA_SCHEMAS_DIR/3.9-trunk, which still describes it), and is refused only if the broker
  closes the connection without an answer. As a check of the probe itself, the lowest version the
  schema lists, probed the same way, must be answered.
Imports only the standard library and harness/.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import zipfile
from pathlib import Path

from harness import kafka_broker
from tools.api_schemas import SCHEMAS, strip_comments
from tools.regen import GenError, input_dir

REPO_ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = REPO_ROOT / "tests" / "fixtures" / "kafka-brokers"
# The releases an upgrade can be checked against: the newest patch of every 4.x line, 4.0.0 beside
# 4.0.1 (JoinGroup v0-1 were removed in 4.0.0 and restored in 4.0.1), and 3.9's newest as the
# release before KIP-896.
RELEASES = ("3.9.2", "4.0.0", "4.0.1", "4.0.2", "4.1.2", "4.2.2", "4.3.1", "4.4.0")
FORMAT = 1


def _load(text: str) -> dict:
    return json.loads(strip_comments(text))


def _versions(spec: str | None) -> range:
    """A schema's "0-5", "3+", "none" or None as a range (up to 99 for an open end)."""
    if not spec or spec == "none":
        return range(0)
    lo, _, hi = spec.partition("-")
    if spec.endswith("+"):
        return range(int(spec[:-1]), 100)
    return range(int(lo), int(hi or lo) + 1)


def jar_request_schemas(version: str) -> dict[int, dict]:
    """api_key -> the request schema of that key, from the release's kafka-clients jar."""
    jar = next((kafka_broker.JARS_DIR / version).glob("kafka-clients-*.jar"), None)
    if jar is None:
        raise GenError(f"no kafka-clients jar in {kafka_broker.JARS_DIR / version}")
    out = {}
    with zipfile.ZipFile(jar) as z:
        for name in z.namelist():
            if name.startswith("common/message/") and name.endswith("Request.json"):
                schema = _load(z.read(name).decode())
                if schema.get("type") == "request":
                    out[schema["apiKey"]] = schema
    return out


def old_request_schemas(schemas_dir: Path) -> dict[int, dict]:
    out = {}
    for path in sorted((schemas_dir / "3.9-trunk").glob("*Request.json")):
        schema = _load(path.read_text(encoding="utf-8"))
        if schema.get("type") == "request":
            out[schema["apiKey"]] = schema
    return out


# ----------------------------------------------------------------------------- a minimal request


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(field: dict, version: int, flexible: bool) -> bytes:
    """One field, zero, empty or null: what every version of every field can hold."""
    if version not in _versions(field.get("versions")) or version in _versions(field.get("taggedVersions")):
        return b""
    kind = field["type"]
    nullable = version in _versions(field.get("nullableVersions"))
    if kind.startswith("[]"):
        if nullable:
            return b"\x00" if flexible else struct.pack(">i", -1)
        return b"\x01" if flexible else struct.pack(">i", 0)
    sizes = {"int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "float64": 8, "bool": 1}
    if field["name"] == "Acks":  # acks 0 is a produce the broker never answers: 1
        return struct.pack(">h", 1)
    if kind in sizes:
        return b"\x00" * sizes[kind]
    if kind == "uuid":
        return b"\x00" * 16
    if kind in ("string", "bytes", "records"):
        if nullable or kind == "records":
            return b"\x00" if flexible else (struct.pack(">h", -1) if kind == "string" else struct.pack(">i", -1))
        return b"\x01" if flexible else (struct.pack(">h", 0) if kind == "string" else struct.pack(">i", 0))
    raise GenError(f"a field of type {kind!r} has no minimal encoding here")


def minimal_request(schema: dict, version: int, correlation_id: int) -> bytes:
    """A request of `version` whose fields are all zero, empty or null, with its header."""
    flexible = version in _versions(schema.get("flexibleVersions"))
    body = b"".join(_field(f, version, flexible) for f in schema["fields"]) + (b"\x00" if flexible else b"")
    client = b"census-recorder"
    header = struct.pack(">hhih", schema["apiKey"], version, correlation_id, len(client)) + client
    if flexible:
        header += b"\x00"  # request header v2: no tagged fields
    return struct.pack(">i", len(header) + len(body)) + header + body


def answered(host: str, port: int, frame: bytes) -> bool:
    """Whether the broker answers `frame` (True) or closes the connection without a word (False)."""
    with socket.create_connection((host, port), timeout=15) as sock:
        sock.sendall(frame)
        try:
            return len(sock.recv(4)) == 4
        except ConnectionResetError:
            return False
        except TimeoutError:
            raise GenError(f"api {struct.unpack('>h', frame[4:6])[0]} v{struct.unpack('>h', frame[6:8])[0]}: "
                           "neither answered nor closed within 15 s") from None


# ----------------------------------------------------------------------------- recording


def record(version: str, old: dict[int, dict]) -> dict:
    schemas = jar_request_schemas(version)
    with kafka_broker.start_kafka(version, metrics=False) as kafka:
        host, port = kafka.host, kafka.ports("PLAINTEXT")[0]
        ranges = sorted(kafka_broker.api_versions(host, port))
        refused = []
        for key, lo, hi in ranges:
            valid = _versions(schemas[key]["validVersions"]) if key in schemas else range(lo, hi + 1)
            candidates = [v for v in range(lo, hi + 1) if v not in valid]
            if not candidates:
                continue
            if key not in old:
                raise GenError(f"{version}: api {key} advertises {candidates} but no 3.9 schema describes them")
            if not answered(host, port, minimal_request(schemas[key], min(valid), 1)):
                raise GenError(f"{version}: api {key} v{min(valid)} (valid) was not answered: the probe is broken")
            for v in candidates:
                if v not in _versions(old[key]["validVersions"]):
                    raise GenError(f"{version}: api {key} v{v} advertised, in no schema")
                if not answered(host, port, minimal_request(old[key], v, 1)):
                    refused.append([key, v])
        print(f"  {version}: {len(ranges)} APIs; refused though advertised: {refused or 'none'}", flush=True)
        return {"format": FORMAT, "kafka_version": version, "api_ranges": [list(r) for r in ranges], "refused": refused}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.record_brokers", description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", metavar="VERSION", help="record these releases only")
    parser.add_argument("--schemas", type=Path, help="Kafka's message schemas (default: $KAFKA_SCHEMAS_DIR)")
    args = parser.parse_args(argv)
    try:
        old = old_request_schemas(input_dir(args.schemas, SCHEMAS))
        releases = args.only or RELEASES
        missing = [v for v in releases if not any((kafka_broker.JARS_DIR / v).glob("kafka_2.13-*.jar"))]
        if missing:  # the pinned lines are already there (make setup), with their tools: left alone
            kafka_broker.install(missing, agent=False, tools=False)
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        for version in releases:
            print(f"Apache Kafka {version}: starting, reading its answer, probing", flush=True)
            facts = record(version, old)
            (OUT_DIR / f"{version}.json").write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")
    except GenError as e:
        print(f"record_brokers: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
