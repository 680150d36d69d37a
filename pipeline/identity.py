"""Who the connections that announced no software are (issues 15 and 28), over event logs, in Spark.

Owns `identities` (the rows of `pipeline.events.connections` or `connection_days`, each with its
connection's identity source and, for an unannounced one, the inferred library, version range,
confidence, min_compatible and evidence: judged once per connection over all its records read,
then joined to its days) and `infer_client` (the fingerprint of one client, run in the
executors). The same rules as the live registry (exporter/census/identity.py), on whole connections,
with the same constants (the identity basis, exporter/census/basis.py):

- `announced`: the connection's own KIP-511 fields (an accepted ApiVersions v3+);
- `sibling`: else the software a connection of the same client address and client_id announced
  (same `source`, i.e. the same sidecar), if it announced before this one ended and was seen
  within `window` seconds before this one opened (`--sibling-window`, 300 s by default): the latest
  such, with the registry's confidence in an announced sibling (`SIBLING_CONFIDENCE`);
- `fingerprint`: else the inference of its client (issue 28): the unannounced connections seen
  from their start with no announced sibling, of the same client address, client_id and
  principal (same `source`), in one session (a connection that opens more than `window` seconds
  after every earlier one ended starts a new one), folded into one
  `exporter.census.fingerprint.ClientBasis` and judged by `exporter.census.fingerprint.assess()`: each
  connection's first ApiVersions request version and every API version it used (schema 2
  ConnectionRollup records' `first_requests` and the requests the log counts), with the
  broker's maxima from the latest ApiVersions answer of the same broker. Every connection of the
  client shows that inference, as the live registry's do once the client's connections have
  all been seen; a connection without a client_id is a client of its own. Never for a
  connection joined mid-stream;
- `none`.

Imports pyspark, the identity basis (`exporter.census.basis`, with the generated API table's
pairs) and `exporter.census.fingerprint` (a pure module: the table and infer(); shipped to the
executors with the rest of the sources), never the registry.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from exporter.census.basis import CANONICAL_PAIR, DEFAULT_SIBLING_WINDOW, SIBLING_CONFIDENCE
from pipeline.events import connection_facts, connections, requests

INFERENCE = T.StructType([
    T.StructField("name", T.StringType()),
    T.StructField("version_range", T.StringType()),
    T.StructField("confidence", T.DoubleType()),
    T.StructField("evidence", T.ArrayType(T.StringType())),
    T.StructField("min_compatible", T.StringType()),
])


def _pairs(logged_first, seen) -> list:
    """Every (api_key, api_version) a connection used that the API table knows: its logged first
    requests and all it was seen sending, as the registry folds its request counts."""
    pairs = {(k, v) for k, v in logged_first or ()} | {(k, v) for _, k, v in seen or ()}
    return sorted(p for p in pairs if p in CANONICAL_PAIR)


def infer_client(client_address, client_id, members):
    """The fingerprint of one client (issue 28): `members`, its connections (conn_id, first_seen,
    logged_first, seen, avv, broker_max), folded into one `exporter.census.fingerprint.ClientBasis` as the
    registry folds them, judged by `assess`. Returns (name, version_range, confidence, evidence,
    min_compatible) or None. Runs in the executors; the arguments are Spark rows and lists."""
    from exporter.census.fingerprint import ClientBasis, Inference, assess, client_evidence

    basis = ClientBasis()
    for m in members:
        first = _pairs(m["logged_first"], m["seen"])
        if not first:
            continue
        basis.add_member(m["conn_id"], m["first_seen"])
        broker_max = m["broker_max"]
        basis.fold(m["avv"], first, None if broker_max is None else {k: hi for k, hi in broker_max})
    if not basis.member_count:
        return None
    try:
        found = assess(basis.observation(client_id))
    except Exception:  # noqa: BLE001 - as the registry: a fault of the inference is no identity, not a failed job
        return None
    if not isinstance(found, Inference):
        return None
    return (str(found.name), str(found.version_range), round(float(found.confidence), 3),
            list(client_evidence(found.evidence, basis, client_address, client_id)), found.min_compatible)


_infer_udf = F.udf(infer_client, INFERENCE)


def identities(facts: DataFrame, conns: DataFrame, window: float = DEFAULT_SIBLING_WINDOW) -> DataFrame:
    """`conns` (pipeline.events.connections or connection_days over `facts`) with:
    identity_source ("announced", "sibling", "fingerprint", "none"), inferred_software_name,
    inferred_version_range, inferred_confidence, min_compatible, evidence (array) and
    sibling_conn_id, of its connection. See the module docstring."""
    key = ["source", "conn_id"]
    whole = connections(facts)  # one row per connection: the judgement is per connection, not per day
    per_conn = connection_facts(facts).select(
        *key, F.col("logged_first.first_requests").alias("logged_first"),
        # the first ApiVersions' version: as a restatement carries it (a ClientSoftware read
        # with it came later), else the first ClientSoftware's
        F.coalesce("state_avv.avv", "avv.request_version").alias("avv"),
        F.col("sw.request_version").alias("identity_version"),
        F.col("opened.mid_stream").cast("int").alias("mid_stream"),
        F.col("answer.ts").alias("answer_ts"), F.col("answer.broker_max").alias("broker_max"))
    first = F.struct(F.col("first_request").alias("t"), "api_key", "api_version")
    seen = requests(facts, first=True).groupBy(key).agg(F.collect_list(first).alias("seen"))
    # The broker's maxima: its latest answer, per sidecar, listener and broker.
    answers = (per_conn.where(F.col("broker_max").isNotNull())
               .join(whole.select(*key, "listener", "broker"), key)
               .groupBy("source", "listener", "broker")
               .agg(F.max(F.struct("answer_ts", "broker_max")).alias("latest"))
               .select("source", "listener", "broker", F.col("latest.broker_max").alias("broker_max")))
    df = (whole.join(per_conn.drop("answer_ts", "broker_max"), key, "left").join(seen, key, "left")
          .join(answers, ["source", "listener", "broker"], "left"))
    unannounced = F.col("client_software_name").isNull()
    # Cached: the sibling search and the clients below read it again.
    df = df.cache()

    client = ["source", "client_address", "client_id"]
    me = df.select(*key, *client, "first_seen", "last_seen")
    # An announced sibling: the latest that announced before this one ended and was seen within the window.
    announced = (df.filter(~unannounced & F.col("client_id").isNotNull())
                 .select(*client, F.col("conn_id").alias("sib_id"), F.col("first_seen").alias("sib_first"),
                         F.col("last_seen").alias("sib_last"),
                         F.col("client_software_name").alias("sib_name"),
                         F.col("client_software_version").alias("sib_version"),
                         F.col("identity_version").alias("sib_iv")))
    latest = Window.partitionBy(*key).orderBy(F.desc("sib_first"), F.desc("sib_id"))
    sib = (me.join(announced, client)
           .filter((F.col("sib_id") != F.col("conn_id")) & (F.col("sib_first") <= F.col("last_seen"))
                   & (F.col("sib_last") >= F.col("first_seen") - window))
           .withColumn("rank", F.row_number().over(latest)).filter(F.col("rank") == 1)
           .select(*key, "sib_id", "sib_name", "sib_version", "sib_iv"))
    df = df.join(sib, key, "left")

    # Clients (issue 28): the unannounced connections seen from their start with no announced
    # sibling, by client address, client_id and principal, cut into sessions where one opens more
    # than `window` seconds after every earlier one ended (the registry's client ends so); one
    # without a client_id is a client of its own. Each session is judged once, on the union.
    own = unannounced & F.col("sib_id").isNull() & (F.coalesce("mid_stream", F.lit(0)) == 0)
    members = df.filter(own).withColumn(
        "client_key", F.when(F.col("client_id").isNull(), F.col("conn_id")))
    order = Window.partitionBy("source", "client_address", "client_id", "principal", "client_key") \
        .orderBy("first_seen", "conn_id")
    members = (members
               .withColumn("ended_before", F.max("last_seen").over(order.rowsBetween(Window.unboundedPreceding, -1)))
               .withColumn("starts", (F.col("ended_before").isNull()
                                      | (F.col("first_seen") - F.col("ended_before") > window)).cast("int"))
               .withColumn("session", F.sum("starts").over(order.rowsBetween(Window.unboundedPreceding, 0))))
    group = ["source", "client_address", "client_id", "principal", "client_key", "session"]
    member = F.struct("conn_id", "first_seen", "logged_first", "seen", "avv", "broker_max")
    # (client_id and principal may be null: each session's connections are carried along, not joined on them)
    judged = (members.groupBy(group)
              .agg(F.collect_list(member).alias("members"))
              .select("source", F.explode(F.col("members.conn_id")).alias("conn_id"),
                      _infer_udf("client_address", "client_id", "members").alias("own")))
    df = df.join(judged, key, "left")

    is_sib = unannounced & F.col("sib_id").isNotNull()
    is_own = unannounced & F.col("sib_id").isNull() & F.col("own").isNotNull()

    def pick(sib_value, own_value):
        return F.when(is_sib, sib_value).when(is_own, own_value)

    named = df.select(
        *key,
        F.when(~unannounced, F.lit("announced")).when(is_sib, F.lit("sibling")).when(is_own, F.lit("fingerprint"))
        .otherwise(F.lit("none")).alias("identity_source"),
        pick(F.col("sib_name"), F.col("own.name")).alias("inferred_software_name"),
        pick(F.coalesce("sib_version", F.lit("unknown")), F.col("own.version_range")).alias("inferred_version_range"),
        pick(F.lit(SIBLING_CONFIDENCE), F.col("own.confidence")).alias("inferred_confidence"),
        pick(F.lit(None).cast("string"), F.col("own.min_compatible")).alias("min_compatible"),
        pick(F.array(F.concat(F.lit("connection "), F.col("sib_id"),
                              F.lit(" from the same client address and client_id announced "), F.col("sib_name"),
                              F.lit(" "), F.coalesce("sib_version", F.lit("unknown")),
                              F.lit(" (ApiVersions v"), F.col("sib_iv").cast("string"), F.lit(")"))),
             F.col("own.evidence")).alias("evidence"),
        pick(F.col("sib_id"), F.lit(None).cast("string")).alias("sibling_conn_id"),
    )
    # every connection of `conns` is one of `whole`'s
    return conns.join(named, key).select(*conns.columns, *named.columns[len(key):])
