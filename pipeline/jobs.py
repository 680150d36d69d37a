"""The fleet tables, as Spark DataFrames over `pipeline.events.connections` and `requests`.

Owns the definitions of `inventory`, `adoption`, `api_usage`, `upgrade_readiness` and
`readiness_by_software` (who to upgrade by software, announced or inferred, over
`pipeline.identity.identities`) and `write_table` (Parquet plus a CSV for spreadsheets). Pure
DataFrame code: the same on `local[*]` and on a cluster. Imports pyspark and the generated API
table (which versions a target broker removes).

Definitions (docs/pipeline.md repeats them):
- a *client* is (client_software_name, client_software_version, client_id, principal,
  client_address, listener, broker): one inventory row;
- *distinct clients* in `adoption` are distinct (client_id, principal, client_address) per day;
- a day is a UTC day a connection was connected (`pipeline.events.connection_days`: a
  connection open for three days counts on each, with that day's requests and last_seen): the
  CLI's tables have a row per day and are written partitioned by it; the connections and
  requests carry a `day` column then, and the tables join them on it. Without a `day` column
  (`pipeline.events.connections`) a table covers the whole input (the report's);
- a missing software name/version is "unknown", as on the exporter's metrics.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from capture.kafka.upgrade_targets import UPGRADE_TARGETS

UNKNOWN = "unknown"
TARGETS = UPGRADE_TARGETS  # generated from what real brokers accepted (tools/gen_targets.py)
CLIENT_KEY = ["client_software_name", "client_software_version", "client_id", "principal", "client_address",
              "listener", "broker"]


def _days(df: DataFrame) -> list[str]:
    return ["day"] if "day" in df.columns else []


def _ordered(df: DataFrame, *cols) -> DataFrame:
    """`df` (a table: small) sorted in one partition: no range partitioning, whose sampling is
    a job of its own over everything upstream."""
    return df.coalesce(1).sortWithinPartitions(*cols)


def _conn_key(conns: DataFrame) -> list[str]:
    """What joins a connection's rows to its requests: per day when the connections are."""
    return ["source", "conn_id", *_days(conns)]


def _labelled(conns: DataFrame) -> DataFrame:
    return (conns.withColumn("client_software_name", F.coalesce("client_software_name", F.lit(UNKNOWN)))
            .withColumn("client_software_version", F.coalesce("client_software_version", F.lit(UNKNOWN))))


def _api_label(reqs: DataFrame) -> DataFrame:
    return reqs.withColumn("api_used", F.concat_ws(" v", "api", F.col("api_version").cast("string")))


def inventory(conns: DataFrame, reqs: DataFrame) -> DataFrame:
    key = _conn_key(conns)
    per_conn = (_api_label(reqs).groupBy(*key)
                .agg(F.collect_set("api_used").alias("apis"), F.sum("requests").alias("n")))
    # Joined on the connection key (never null); the client key may hold nulls (no principal),
    # which group by treats as equal, as a join would not.
    rows = _labelled(conns).join(per_conn, key, "left")
    return (rows.groupBy(*CLIENT_KEY, *_days(conns)).agg(
                F.min("first_seen").alias("first_seen_ts"), F.max("last_seen").alias("last_seen_ts"),
                F.count(F.lit(1)).alias("connections"),
                F.array_sort(F.array_distinct(F.flatten(F.collect_list(
                    F.coalesce("apis", F.array().cast("array<string>")))))).alias("apis_used"),
                F.coalesce(F.sum("n"), F.lit(0)).alias("requests"))
            .withColumn("first_seen", F.timestamp_seconds("first_seen_ts"))
            .withColumn("last_seen", F.timestamp_seconds("last_seen_ts"))
            .drop("first_seen_ts", "last_seen_ts")
            .transform(lambda df: _ordered(df, *_days(conns), *CLIENT_KEY)))


def adoption(conns: DataFrame) -> DataFrame:
    conns = _labelled(conns)
    client = F.concat_ws("\u0000", F.coalesce("client_id", F.lit("")), F.coalesce("principal", F.lit("")),
                         F.coalesce("client_address", F.lit("")))
    return (conns.groupBy("day", "client_software_name", "client_software_version")
            .agg(F.count(F.lit(1)).alias("connections"), F.countDistinct(client).alias("distinct_clients"))
            .transform(lambda df: _ordered(df, "day", "client_software_name", "client_software_version")))


def api_usage(conns: DataFrame, reqs: DataFrame) -> DataFrame:
    days = _days(conns)
    conns = _labelled(conns).select("source", "conn_id", "client_software_name", "client_software_version", *days)
    return (reqs.join(conns, ["source", "conn_id", *days])
            .groupBy(*days, "api_key", "api", "api_version", "client_software_name", "client_software_version")
            .agg(F.sum("requests").alias("requests"))
            .transform(lambda df: _ordered(df, *days, "api_key", "api_version", "client_software_name",
                                           "client_software_version")))


def _removed_table(spark: SparkSession, target: str) -> DataFrame:
    known = TARGETS.get(target)
    if known is None:
        raise ValueError(f"unknown upgrade target {target!r}; known: {', '.join(TARGETS)}")
    rows = []
    for key, versions in known.removed.items():
        rows.extend((key, v, known.minimum_version[key]) for v in versions)
    schema = T.StructType([T.StructField("api_key", T.IntegerType()), T.StructField("api_version", T.IntegerType()),
                           T.StructField("minimum_version", T.IntegerType())])
    return spark.createDataFrame(rows, schema)


def upgrade_readiness(spark: SparkSession, conns: DataFrame, reqs: DataFrame, target: str) -> DataFrame:
    """Every client that used an api version `target` removes: one row per client and api
    version, with its request count and the lowest version the target accepts (null when the
    target removed the api entirely)."""
    removed = F.broadcast(_removed_table(spark, target))
    days = _days(conns)
    conns = _labelled(conns).select("source", "conn_id", *CLIENT_KEY, "first_seen", "last_seen", *days)
    return (reqs.join(removed, ["api_key", "api_version"]).join(conns, ["source", "conn_id", *days])
            .groupBy(*CLIENT_KEY, *days, "api_key", "api", "api_version", "minimum_version")
            .agg(F.sum("requests").alias("requests"), F.count(F.lit(1)).alias("connections"),
                 F.timestamp_seconds(F.max("last_seen")).alias("last_seen"))
            .withColumn("target", F.lit(target))
            .transform(lambda df: _ordered(df, *days, *CLIENT_KEY, "api_key", "api_version")))


BY_SOFTWARE_KEY = ["software_name", "software_version", "identity_source", "client_id", "principal"]


def readiness_by_software(spark: SparkSession, idents: DataFrame, reqs: DataFrame, target: str) -> DataFrame:
    """Who to upgrade, as /api/v1/upgrade-readiness's `clients_by_software`: one row per
    (software, version or range, identity source, client_id, principal) whose connections used an
    api version `target` removes. software_name/version: the announced ones, else the inferred
    library and version range (identity_source sibling or fingerprint, pipeline.identity), else
    null ("none"). With the listeners, connections, requests, the removed versions used and the
    lowest versions the target accepts, and for an inferred library its first release compatible
    with the target (min_compatible), the inference's confidence and evidence (of the group's
    first connection)."""
    removed = F.broadcast(_removed_table(spark, target))
    key = [*BY_SOFTWARE_KEY, *_days(idents)]
    announced = F.col("identity_source") == "announced"
    named = (idents.withColumn("software_name", F.when(announced, F.col("client_software_name"))
                               .otherwise(F.col("inferred_software_name")))
             .withColumn("software_version", F.when(announced, F.col("client_software_version"))
                         .otherwise(F.col("inferred_version_range")))
             .select("source", "conn_id", *key, "listener", "first_seen", "last_seen",
                     "inferred_confidence", "min_compatible", "evidence"))
    used = (reqs.join(removed, ["api_key", "api_version"])
            .withColumn("api_used", F.concat_ws(" v", "api", F.col("api_version").cast("string")))
            .withColumn("api_minimum", F.when(F.col("minimum_version").isNull(), F.concat(F.col("api"),
                                                                                          F.lit(" (removed)")))
                        .otherwise(F.concat_ws(" v", "api", F.col("minimum_version").cast("string")))))
    first = F.struct("first_seen", "source", "conn_id")
    # Group keys as one JSON string each: they hold nulls (no principal, no name), which a join
    # would not match.
    named = (named.withColumn("_k", F.to_json(F.struct(*key)))
             .withColumn("_kl", F.to_json(F.struct(*key, "listener"))))
    # connections: all of the group's on each listener where it used a removed version (the REST
    # API's total_connections: its census rows are per listener), not only those that used one
    per_listener = named.groupBy("_k", "_kl").agg(F.countDistinct("source", "conn_id").alias("n"))
    offending = used.join(named, ["source", "conn_id", *_days(idents)])
    sizes = (offending.select("_kl").distinct().join(per_listener, "_kl")
             .groupBy("_k").agg(F.sum("n").alias("connections")))
    return (offending
            .groupBy(*key, "_k")
            .agg(F.array_sort(F.collect_set("listener")).alias("listeners"),
                 F.sum("requests").alias("requests"),
                 F.array_sort(F.collect_set("api_used")).alias("removed_apis"),
                 F.array_sort(F.collect_set("api_minimum")).alias("minimum_versions"),
                 F.min_by("min_compatible", first).alias("min_compatible"),
                 F.min_by("inferred_confidence", first).alias("inferred_confidence"),
                 F.min_by("evidence", first).alias("evidence"),
                 F.timestamp_seconds(F.max("last_seen")).alias("last_seen"))
            .join(sizes, "_k").drop("_k")
            .select(*key, "listeners", "connections", "requests", "removed_apis", "minimum_versions",
                    "min_compatible", "inferred_confidence", "evidence", "last_seen")
            .withColumn("target", F.lit(target))
            .transform(lambda df: _ordered(df, *key)))


def write_table(df: DataFrame, out_dir: str, name: str) -> int:
    """`out_dir/name/` as Parquet and `out_dir/name.csv/` as one CSV part with a header (arrays
    joined with ';'). Returns the row count.

    A table with a `day` column is written partitioned by it (`name/day=2026-11-20/`), and only
    the days it holds are replaced: re-running one day (--since/--until) leaves the others as
    they were. The CSV holds this run's rows only."""
    df = df.cache()
    if "day" in df.columns:
        (df.write.mode("overwrite").option("partitionOverwriteMode", "dynamic").partitionBy("day")
         .parquet(f"{out_dir}/{name}"))
    else:
        df.write.mode("overwrite").parquet(f"{out_dir}/{name}")
    flat = df.select([F.concat_ws(";", F.col(f.name)).alias(f.name) if isinstance(f.dataType, T.ArrayType)
                      else F.col(f.name) for f in df.schema.fields])
    # RFC 4180 quoting: Spark's default escape character, a backslash, would double every
    # backslash of an RFC 4514 certificate subject (`O=Acme\, Inc`) for other CSV readers.
    (flat.coalesce(1).write.mode("overwrite").option("header", "true").option("escape", '"')
     .csv(f"{out_dir}/{name}.csv"))
    count = df.count()
    df.unpersist()
    return count
