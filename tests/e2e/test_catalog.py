"""The Glue Data Catalog kept in step by the functions, against moto's Glue: entries with
the table's real columns and types, a manifest table whose partitions follow the rows, no
Glue call for merges that change neither, entries deleted by hand restored by maintenance,
and a Glue outage that fails no merge and is repaired afterwards."""

import decimal
import io
import json
import os
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dms
from conftest import ENDPOINT, REGION, ROOT, read_table, record_timing, storage_options
from deltalake import DeltaTable
from test_pipeline import converge, upload

TABLE = "cat"
BASE_COLUMNS = [("trip_id", "int"), ("tstamp", "timestamp"), ("route_id", "string"),
                ("destination", "string"), ("source_location", "string"), ("_tributary_seq", "string")]


def hive(t):
    """The Hive type of an Arrow type, as Athena documents the mapping."""
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return {pa.int32(): "int", pa.int64(): "bigint", pa.string(): "string", pa.large_string(): "string",
            pa.string_view(): "string", pa.bool_(): "boolean", pa.float64(): "double"}[t]


def delta_columns(stack, name):
    """The Delta table's columns (read by another Delta reader) with their Hive types."""
    dt = DeltaTable(f"s3://{stack.curated}/delta/{name}", storage_options=storage_options())
    return [(f.name, hive(f.type)) for f in pa.schema(dt.schema().to_arrow())]


def with_column(rows, name, arrow_type, value):
    """A DMS CDC file of these rows with one more column (the source table gained it)."""
    table = pq.read_table(io.BytesIO(dms.parquet(rows, True)))
    table = table.append_column(pa.field(name, arrow_type), pa.array([value] * len(rows), arrow_type))
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def entry(glue, name):
    t = glue.client.get_table(DatabaseName=glue.database, Name=name)["Table"]
    return t, [(c["Name"], c["Type"]) for c in t["StorageDescriptor"]["Columns"]]


def partitions(glue, name):
    pages = glue.client.get_paginator("get_partitions").paginate(DatabaseName=glue.database, TableName=name)
    return {tuple(p["Values"]): p["StorageDescriptor"]["Location"] for page in pages for p in page["Partitions"]}


def partition_columns(glue, name):
    """Each registered partition's own columns, as (name, type)."""
    pages = glue.client.get_paginator("get_partitions").paginate(DatabaseName=glue.database, TableName=name)
    return {tuple(p["Values"]): [(c["Name"], c["Type"]) for c in p["StorageDescriptor"]["Columns"]]
            for page in pages for p in page["Partitions"]}


def routes(stack):
    _, rows = read_table(stack, TABLE)
    return {(route,) for route, _, _ in rows.values()}


def maintain(functions):
    payload, error = functions.invoke("tributary-maintenance", {"table": TABLE})
    assert error is None, payload
    return payload["catalog"][TABLE]


@pytest.fixture(scope="module")
def source():
    """The source table behind `cat`, shared by the scenarios of this module (in order)."""
    return dms.Source(seed=11)


def test_catalog_follows_the_table(aws, stack, poller, functions, glue, source):
    files = [("2022/10/26/20221026-0000000000.parquet", dms.parquet(source.insert_records(300), True))]
    start = time.time()
    upload(aws, stack, TABLE, files)
    converge(aws, stack, poller, TABLE, source.state(), "catalog: table created", start)

    # Created with the table: real columns and types, Delta parameters, the manifest entry
    # partitioned like the table with one partition per route, the history's entries.
    t, cols = entry(glue, TABLE)
    assert cols == BASE_COLUMNS == delta_columns(stack, TABLE), cols
    assert t["Parameters"]["table_type"] == "DELTA"
    assert t["Parameters"]["spark.sql.sources.provider"] == "delta"
    assert t["StorageDescriptor"]["Location"] == f"s3://{stack.curated}/delta/{TABLE}/"
    m, mcols = entry(glue, f"{TABLE}_manifest")
    assert [(k["Name"], k["Type"]) for k in m["PartitionKeys"]] == [("route_id", "string")]
    assert ("route_id", "string") not in mcols
    assert m["StorageDescriptor"]["InputFormat"] == "org.apache.hadoop.hive.ql.io.SymlinkTextInputFormat"
    manifest_root = f"s3://{stack.curated}/delta/{TABLE}/_symlink_format_manifest/"
    assert partitions(glue, f"{TABLE}_manifest") == {(r,): f"{manifest_root}route_id={r}/" for (r,) in routes(stack)}
    h, hcols = entry(glue, f"{TABLE}_history")
    assert hcols[:5] == BASE_COLUMNS[:5] and ("__START_AT", "timestamp") in hcols, hcols
    assert partitions(glue, f"{TABLE}_history_manifest"), "history partitions registered"

    # A steady stream of merges that change no schema and no partition: zero Glue calls.
    calls = glue.proxy.total()
    for i in range(1, 6):
        changes = source.update(lambda r, i=i: r["route_id"] == "ABCDEFGHIJ"[i], destination=dms.CITIES[i])
        upload(aws, stack, TABLE, [(f"2022/10/26/20221026-{i:010d}.parquet", dms.parquet(changes, True))])
        converge(aws, stack, poller, TABLE, source.state(), f"catalog: steady merge {i}", time.time())
    assert glue.proxy.total() == calls, f"Glue calls during steady merges: {glue.proxy.calls}"
    record_timing("catalog: 5 steady merges", 0, f"{glue.proxy.total() - calls} Glue calls")

    # A file with a new column updates the entries' columns.
    changes = source.update(lambda r: r["route_id"] == "A", destination="Tucson")
    upload(aws, stack, TABLE, [("2022/10/26/20221026-0000000010.parquet",
                                with_column(changes, "fare", pa.decimal128(10, 2), decimal.Decimal("12.50")))])
    converge(aws, stack, poller, TABLE, source.state(), "catalog: new column", time.time())
    cols = delta_columns(stack, TABLE)
    assert ("fare", "decimal(10,2)") in cols and entry(glue, TABLE)[1] == cols, (entry(glue, TABLE)[1], cols)
    assert ("fare", "decimal(10,2)") in entry(glue, f"{TABLE}_manifest")[1]

    # Rows leave route B for a new route K: partition K appears, B disappears.
    changes = source.update(lambda r: r["route_id"] == "B", route_id="K")
    upload(aws, stack, TABLE, [("2022/10/26/20221026-0000000011.parquet", dms.parquet(changes, True))])
    converge(aws, stack, poller, TABLE, source.state(), "catalog: partitions move", time.time())
    got = set(partitions(glue, f"{TABLE}_manifest"))
    assert ("K",) in got and ("B",) not in got and got == routes(stack), got

    # A widened column (numeric(10,2) -> numeric(12,3), #26): the entries and every registered
    # partition of the manifest entry take the new type (a partition keeps the columns it was
    # registered with otherwise, and Athena reads a partition's files by them).
    changes = source.update(lambda r: r["route_id"] == "C", destination="Reno")
    upload(aws, stack, TABLE, [("2022/10/26/20221026-0000000012.parquet",
                                with_column(changes, "fare", pa.decimal128(12, 3), decimal.Decimal("1.125")))])
    converge(aws, stack, poller, TABLE, source.state(), "catalog: widened column", time.time())
    cols = delta_columns(stack, TABLE)
    assert ("fare", "decimal(12,3)") in cols and entry(glue, TABLE)[1] == cols, (entry(glue, TABLE)[1], cols)
    parts = partition_columns(glue, f"{TABLE}_manifest")
    assert parts and all(("fare", "decimal(12,3)") in c for c in parts.values()), parts

    # Entries deleted by hand: the maintenance run restores them, partitions included.
    glue.client.delete_table(DatabaseName=glue.database, Name=f"{TABLE}_manifest")
    glue.client.delete_table(DatabaseName=glue.database, Name=TABLE)
    report = maintain(functions)
    assert report["entries_created"] == 2 and "error" not in report, report
    assert entry(glue, TABLE)[1] == delta_columns(stack, TABLE)
    assert set(partitions(glue, f"{TABLE}_manifest")) == routes(stack)

    # `tributary status` reads the same state: every entry in step; a partition removed by
    # hand is counted (and maintenance puts it back).
    st = status(stack, glue)
    states = {e["entry"]: e["state"] for e in st["catalog"]}
    assert set(states.values()) == {"in step"} and len(states) == 4, states
    manifest = next(e for e in st["catalog"] if e["entry"].endswith(f".{TABLE}_manifest"))
    assert manifest["partitions"] == {"in_catalog": len(routes(stack)), "in_table": len(routes(stack)),
                                      "differing": 0}, manifest
    assert st["rows"] == len(source.state()) and st["manifests"]["exact"], st
    assert st["freshness"]["newest_file"] == "20221026-0000000012.parquet", st["freshness"]
    glue.client.batch_delete_partition(DatabaseName=glue.database, TableName=f"{TABLE}_manifest",
                                       PartitionsToDelete=[{"Values": ["K"]}])
    manifest = next(e for e in status(stack, glue)["catalog"] if e["entry"].endswith(f".{TABLE}_manifest"))
    assert manifest["partitions"]["differing"] == 1, manifest
    maintain(functions)


def status(stack, glue):
    """`tributary status --json` for the table, run as an operator would (the CLI binary)."""
    env = dict(os.environ, AWS_ENDPOINT_URL=ENDPOINT, AWS_ENDPOINT_URL_GLUE=glue.endpoint,
               AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION=REGION)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    out = subprocess.run([str(target / "debug" / "tributary"), "status", "--json", "--config", stack.config, TABLE],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (st,) = json.loads(out.stdout)
    return st


def failed_syncs(functions):
    """`CatalogSyncFailed` metric points the merge function has emitted (EMF lines)."""
    return Path(functions.log.name).read_text().count('"CatalogSyncFailed":1')


def test_glue_outage_fails_no_merge_and_is_repaired(aws, stack, poller, functions, glue, source):
    failed_before = failed_syncs(functions)
    glue.proxy.set_down(True)
    try:
        start = time.time()
        inserted = source.insert_records(25)
        new = {c[2] for c in inserted}
        moved = source.update(lambda r, rows=source.rows: any(rows[t] is r for t in new), route_id="L")
        upload(aws, stack, TABLE, [("2022/10/27/20221027-0000000000.parquet",
                                    with_column(inserted + moved, "channel", pa.string(), "web"))])
        converge(aws, stack, poller, TABLE, source.state(), "catalog: merge during a Glue outage", start)
        dead = aws.sqs.receive_message(QueueUrl=stack.dlq_url, WaitTimeSeconds=0).get("Messages", [])
        assert not dead, "no message dead-lettered by the outage"
        # the catalog is behind: no new column, no new partition
        assert "channel" not in dict(entry(glue, TABLE)[1])
        assert ("L",) not in partitions(glue, f"{TABLE}_manifest")
        assert failed_syncs(functions) > failed_before, "the failed sync is a metric"
    finally:
        glue.proxy.set_down(False)
    report = maintain(functions)
    assert "error" not in report, report
    assert dict(entry(glue, TABLE)[1])["channel"] == "string"
    assert entry(glue, TABLE)[1] == delta_columns(stack, TABLE)
    assert ("L",) in routes(stack)
    assert set(partitions(glue, f"{TABLE}_manifest")) == routes(stack)
