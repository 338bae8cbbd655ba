"""Full-load benchmark helpers: write a DMS full-load file in the walkthrough's shape, and
append it to a new Delta table with Python deltalake (the comparison).

  python full_load.py make --rows N --out FILE [--first K]   # DMS row groups; ids K+1..K+N
  python full_load.py append --file FILE --table DIR

`append` prints one JSON line: seconds and peak RSS (MB) of this process.
"""

import argparse
import json
import resource
import time

import random

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

CITIES = ["Seattle", "New York", "New Jersey", "Los Angeles", "Las Vegas", "Tucson",
          "Washington DC", "Philadelphia", "Miami", "San Francisco"]
# DMS writes Parquet row groups of RowGroupLength rows (default 10,000).
ROW_GROUP = 10_000


def make(rows, out, first=0):
    rng = random.Random(1)
    schema = pa.schema([("update_ts_dms", pa.string()), ("schema_name", pa.string()),
                        ("table_name", pa.string()), ("trip_id", pa.int32()),
                        ("tstamp", pa.timestamp("us")), ("route_id", pa.string()),
                        ("destination", pa.string()), ("source_location", pa.string())])
    cities = pa.array(CITIES)
    routes = pa.array([chr(65 + i) for i in range(10)])
    with pq.ParquetWriter(out, schema, compression="snappy") as w:
        for start in range(first, first + rows, 1_000_000):
            n = min(1_000_000, first + rows - start)
            ids = pa.array(range(start + 1, start + n + 1), pa.int32())
            pick = lambda: pc.take(cities, pa.array([rng.randrange(10) for _ in range(n)]))
            t = pa.table({
                "update_ts_dms": pa.array(["2022-10-25 23:59:59.000000"] * n),
                "schema_name": pa.array(["delta_emr_source"] * n),
                "table_name": pa.array(["travel_details"] * n),
                "trip_id": ids,
                "tstamp": pa.array([1666728000_000000] * n, pa.timestamp("us")),
                "route_id": pc.take(routes, pa.array([i % 10 for i in range(start + 1, start + n + 1)])),
                "destination": pick(),
                "source_location": pick(),
            }, schema=schema)
            w.write_table(t, row_group_size=ROW_GROUP)


def append(file, table):
    from deltalake import write_deltalake
    t0 = time.time()
    t = pq.read_table(file).drop_columns(["update_ts_dms", "schema_name", "table_name"])
    write_deltalake(table, t, partition_by=["route_id"], mode="append")
    secs = time.time() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"engine": "python-deltalake", "seconds": round(secs, 2), "peak_rss_mb": round(rss)}))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["make", "append"])
    p.add_argument("--rows", type=int)
    p.add_argument("--first", type=int, default=0, help="trip_id of the first row minus one")
    p.add_argument("--out")
    p.add_argument("--file")
    p.add_argument("--table")
    a = p.parse_args()
    if a.cmd == "make":
        make(a.rows, a.out, a.first)
    else:
        append(a.file, a.table)
