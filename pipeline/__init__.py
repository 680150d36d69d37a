"""PySpark jobs over kafka-census event logs and pcap archives: the fleet view.

`ingest` parses event logs once into a Parquet table by day and source (pyarrow in the
executors, quarantining bad lines); `events` reduces the table's rows once to the facts every
table reads and models connections and the UTC days they were connected; `identity` names the
connections that announced no software (sibling or fingerprint, with
`exporter.census.fingerprint`, a pure module; never the registry); `jobs` defines the tables;
`pcaps` turns pcap archives into event logs with `capture`; `report` renders one HTML file;
`ship` zips the sources that executors on a cluster need; `errors` (UsageError, InputError) and
`files` (read_table, load_input: the table of --input, ingested first if it is event logs;
write_file) are what the jobs share; `cli` runs one job and is imported by none of them.
Nothing imports `pipeline`: the `kafka-census pipeline` command starts it as `python -m pipeline`.
"""
