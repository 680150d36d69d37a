"""`kafka-census pipeline topic-lineage` (issue 31): who writes and who reads each topic, over
the whole fleet and a time window.

Owns the job (`run_lineage`; `lineage_of`, the table of a loaded input, which `pipeline.report`
also shows) and its table (`lineage`: one row per topic, role and client), with
what it is made of: `topic_usage` (the topic entries of the window's ConnectionRollup and
TopicUsage records, summed per connection), `topic_names` (the fleet's topic id -> name map, and
each name's id), `connection_groups` (each connection's latest group_id and transactional_id)
and `roles` (a connection's uses of a topic as the roles of `ROLE_OF_USE`). Pure DataFrame code
(no Python per row; identities are `pipeline.identity`'s, whose fingerprint of an unannounced
client is the only Python, once per client). Imports pyspark and `pipeline`'s events, identity,
jobs (`write_table`, `_ordered`) and files, lazily; never `pipeline.cli` or `pipeline.report`,
which import it.

Definitions (docs/pipeline.md repeats them):
- usage: the entries [use, topic, topic_id, frames, bytes] of the records with ts in [since,
  until) (a rollup's ts is its latest request's: the window cuts at the rollup interval), summed
  per connection (source, conn_id), use and topic; first_seen / last_seen: the earliest and
  latest ts of the records that counted it.
- names: a topic named only by its id (Fetch and Produce v13+) takes the name the fleet's
  TopicIds records pair with that id, from every day of the tables read (not only the window's:
  a writer logs a pair once, when it is new to it), or an entry that carried both; the latest
  pair wins. The row of a named topic has `topic_id` the latest id paired with its name (null: no
  pair known); an id no pair names stays an id (`topic` null, `topic_id` set).
- roles, per connection and topic: "producer" (uses produce, txn), "consumer" (fetch,
  list_offsets, offset_commit, offset_fetch, subscribe), "admin" (create, delete), "other"
  (replicate, a use this version does not know, or only metadata: a Metadata request naming a
  topic makes the connection an "other" of it only when it did nothing else with it). A
  connection that both produced and fetched a topic has a row in each role; each row's frames,
  bytes and `uses` are those of its role's uses.
- identity, per connection, as `upgrade_readiness_by_software` judges it (`pipeline.identity`):
  software_name/version announced (KIP-511), else inferred (sibling, fingerprint), else null,
  with identity_source; client_id, principal, client_address as the inventory's.
- group_id and transactional_id: the connection's latest (GroupMember, TransactionalId or a
  ConnectionState restatement, whatever their ts within the days read, as the identity). Kafka
  sends the group id to the group coordinator only, so a consumer's fetch connections carry
  none: a consumer row of a connection without a group takes its client's group when the
  client (client_address, client_id, principal; client_id not null) had exactly one group in
  the window, fleet-wide.
- a row: (topic, topic_id, role, software_name, software_version, identity_source, client_id,
  principal, client_address, group_id, transactional_id) with uses, connections, frames, bytes,
  first_seen, last_seen. Ordered by topic (names first, then unresolved ids), role (producer,
  consumer, admin, other) and the rest of the key.
"""

from __future__ import annotations

import time

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

ROLE_OF_USE = {"produce": "producer", "txn": "producer", "fetch": "consumer", "list_offsets": "consumer",
               "offset_commit": "consumer", "offset_fetch": "consumer", "subscribe": "consumer",
               "create": "admin", "delete": "admin", "replicate": "other", "metadata": "metadata"}
ROLES = ("producer", "consumer", "admin", "other")
USAGE_TYPES = ("ConnectionRollup", "TopicUsage")
LINEAGE_KEY = ["topic", "topic_id", "role", "software_name", "software_version", "identity_source", "client_id",
               "principal", "client_address", "group_id", "transactional_id"]
NAME = "topic_lineage"
_CONN = ["source", "conn_id"]


def _within(since: float | None, until: float | None):
    ts, inside = F.col("ts"), F.lit(True)
    if since is not None:
        inside = inside & (ts >= F.lit(since))
    if until is not None:
        inside = inside & (ts < F.lit(until))
    return inside


def topic_usage(rows: DataFrame, since: float | None = None, until: float | None = None) -> DataFrame:
    """(source, conn_id, use, name, id, frames, bytes, first_ts, last_ts): the topic entries of
    the table's rows (`pipeline.files.read_table`) with ts in [since, until), summed."""
    entries = (rows.where(F.col("type").isin(*USAGE_TYPES) & F.col("topics").isNotNull() & _within(since, until))
               .select(*_CONN, "ts", F.explode("topics").alias("t")))
    return (entries.groupBy(*_CONN, F.col("t.use").alias("use"), F.col("t.topic").alias("name"),
                            F.col("t.topic_id").alias("id"))
            .agg(F.sum("t.frames").alias("frames"), F.sum("t.bytes").alias("bytes"),
                 F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts")))


def topic_names(id_rows: DataFrame, usage: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(by_id: topic_id -> resolved, by_name: topic -> known_id): the pairs of the TopicIds rows
    of `id_rows` and those `usage` entries carried themselves, the latest of each winning."""
    logged = (id_rows.where((F.col("type") == "TopicIds") & F.col("topic_ids").isNotNull())
              .select("ts", F.explode("topic_ids").alias("p"))
              .select("ts", F.col("p.topic_id").alias("topic_id"), F.col("p.topic").alias("topic")))
    carried = (usage.where(F.col("name").isNotNull() & F.col("id").isNotNull())
               .select(F.col("last_ts").alias("ts"), F.col("id").alias("topic_id"), F.col("name").alias("topic")))
    pairs = logged.unionByName(carried)
    by_id = pairs.groupBy("topic_id").agg(F.max_by("topic", F.struct("ts", "topic")).alias("resolved"))
    by_name = pairs.groupBy("topic").agg(F.max_by("topic_id", F.struct("ts", "topic_id")).alias("known_id"))
    return by_id, by_name


def connection_groups(rows: DataFrame) -> DataFrame:
    """(source, conn_id, group_id, transactional_id): each connection's latest of each (an event
    before a restatement at one ts, as `pipeline.events` ranks them)."""
    rank = F.when(F.col("type") == "ConnectionState", 0).otherwise(1)
    latest = rows.where(F.col("type").isin("GroupMember", "TransactionalId", "ConnectionState")
                        & (F.col("group_id").isNotNull() | F.col("transactional_id").isNotNull()))
    return (latest.groupBy(*_CONN)
            .agg(F.max(F.when(F.col("group_id").isNotNull(), F.struct("ts", rank.alias("r"), "group_id")))
                 .alias("g"),
                 F.max(F.when(F.col("transactional_id").isNotNull(),
                              F.struct("ts", rank.alias("r"), "transactional_id"))).alias("x"))
            .select(*_CONN, F.col("g.group_id").alias("group_id"),
                    F.col("x.transactional_id").alias("transactional_id")))


def roles(usage: DataFrame) -> DataFrame:
    """Resolved usage (source, conn_id, use, topic, topic_id, ...) -> one row per connection,
    topic and role, with the role's uses, frames, bytes, first_ts and last_ts."""
    role_of = F.create_map(*[F.lit(x) for use, role in sorted(ROLE_OF_USE.items()) for x in (use, role)])
    per = (usage.withColumn("raw", F.coalesce(F.element_at(role_of, F.col("use")), F.lit("other")))
           .groupBy(*_CONN, "topic", "topic_id", "raw")
           .agg(F.array_sort(F.collect_set("use")).alias("uses"), F.sum("frames").alias("frames"),
                F.sum("bytes").alias("bytes"), F.min("first_ts").alias("first_ts"), F.max("last_ts").alias("last_ts")))
    acted = F.max((F.col("raw") != "metadata").cast("int")).over(Window.partitionBy(*_CONN, "topic", "topic_id"))
    return (per.withColumn("acted", acted).where((F.col("raw") != "metadata") | (F.col("acted") == 0))
            .withColumn("role", F.when(F.col("raw") == "metadata", F.lit("other")).otherwise(F.col("raw")))
            .withColumn("metadata_only", F.col("raw") == "metadata")
            .drop("raw", "acted"))


def lineage(rows: DataFrame, id_rows: DataFrame, idents: DataFrame, since: float | None = None,
            until: float | None = None) -> DataFrame:
    """The topic-lineage table (see the module docstring). `rows`: the table's rows of the
    window's days; `id_rows`: the rows the TopicIds are taken from (every day of the tables);
    `idents`: `pipeline.identity.identities` over `pipeline.events.connections` of the window."""
    from pipeline.jobs import _ordered

    usage = topic_usage(rows, since, until).cache()
    by_id, by_name = topic_names(id_rows, usage)
    topic = F.coalesce("name", "resolved")
    resolved = (usage.join(by_id, usage["id"] == by_id["topic_id"], "left").drop("topic_id")
                .withColumn("topic", topic)
                .join(by_name, "topic", "left")
                .withColumn("topic_id", F.when(F.col("topic").isNotNull(), F.col("known_id")).otherwise(F.col("id")))
                .select(*_CONN, "use", "topic", "topic_id", "frames", "bytes", "first_ts", "last_ts"))
    announced = F.col("identity_source") == "announced"
    who = idents.select(
        *_CONN, F.when(announced, F.col("client_software_name")).otherwise(F.col("inferred_software_name"))
        .alias("software_name"),
        F.when(announced, F.col("client_software_version")).otherwise(F.col("inferred_version_range"))
        .alias("software_version"),
        "identity_source", "client_id", "principal", "client_address")
    groups = connection_groups(rows)
    # A client's single group, for its consumer connections that sent none (their fetches).
    client = F.to_json(F.struct("client_address", "client_id", "principal"))
    client_group = (groups.where(F.col("group_id").isNotNull()).join(who, _CONN)
                    .where(F.col("client_id").isNotNull())
                    .groupBy(client.alias("_client"))
                    .agg(F.countDistinct("group_id").alias("n"), F.max("group_id").alias("client_group"))
                    .where(F.col("n") == 1).drop("n"))
    joined = (roles(resolved).join(who, _CONN, "left").join(groups, _CONN, "left")
              .withColumn("_client", F.when(F.col("client_id").isNotNull(), client))
              .join(client_group, "_client", "left")
              .withColumn("group_id", F.coalesce(F.col("group_id"), F.when(F.col("role") == "consumer",
                                                                            F.col("client_group")))))
    # A client's Metadata-only connection is no "other" row where the client (whatever the source
    # of its identity on each connection) has another role towards the topic, as in REST.
    same_client = Window.partitionBy("topic", "topic_id", "software_name", "client_id", "principal", "client_address")
    joined = (joined.withColumn("_acted", F.max((F.col("role") != "other").cast("int")).over(same_client))
              .where(~F.col("metadata_only") | (F.col("_acted") == 0)).drop("_acted", "metadata_only"))
    rank = F.array_position(F.array(*[F.lit(r) for r in ROLES]), F.col("role"))
    return (joined.groupBy(*LINEAGE_KEY)
            .agg(F.array_sort(F.array_distinct(F.flatten(F.collect_set("uses")))).alias("uses"),
                 F.count(F.lit(1)).alias("connections"), F.sum("frames").alias("frames"),
                 F.sum("bytes").alias("bytes"), F.timestamp_seconds(F.min("first_ts")).alias("first_seen"),
                 F.timestamp_seconds(F.max("last_ts")).alias("last_seen"))
            .transform(lambda df: _ordered(df, F.asc_nulls_last("topic"), "topic_id", rank,
                                           *LINEAGE_KEY[3:])))


def run_lineage(spark, args, progress) -> dict:
    """`kafka-census pipeline topic-lineage`: --input (an ingested table or event logs),
    --output, --since, --until. Writes OUTPUT/topic_lineage/ (Parquet) and topic_lineage.csv/."""
    from pipeline.files import load_input
    from pipeline.jobs import write_table

    started = time.perf_counter()
    loaded = load_input(spark, args, args.output, progress, "the outputs are empty")
    table = lineage_of(spark, loaded, args.since, args.until)
    rows = write_table(table, args.output, NAME)
    progress(f"topic-lineage: {rows} rows -> {args.output}/{NAME}/ (Parquet) and {args.output}/{NAME}.csv/ "
             f"({time.perf_counter() - started:.1f} s)")
    spark.catalog.clearCache()  # as pipeline.cli.run_tables: nothing cached here serves a later job
    return {"job": "topic-lineage", "events": loaded.events, "quarantined_lines": loaded.quarantined, "rows": rows,
            "output": args.output}


def lineage_of(spark, loaded, since: float | None, until: float | None, idents: DataFrame | None = None) -> DataFrame:
    """The lineage table of a `pipeline.files.load_input` result over [since, until); `idents`
    (of `pipeline.events.connections` over the same window) when the caller has them."""
    from pipeline import events as ev
    from pipeline.files import read_table
    from pipeline.identity import identities

    if idents is None:
        idents = identities(loaded.facts, ev.connections(loaded.facts, since, until))
    return lineage(read_table(spark, loaded.tables, since, until), read_table(spark, loaded.tables), idents,
                   since, until)
