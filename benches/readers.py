"""What a table's layout costs its readers: a full scan and a key lookup, timed in DuckDB's
delta extension (delta-kernel-rs) and Python deltalake (its DataFusion scan), on the bench
table as the merges left it or after maintenance (#46: deletion vectors against
copy-on-write). Prints one JSON line.

Usage: readers.py --table PATH --key TRIP_ID [--repeat 3] [--label TEXT]
"""

import argparse
import glob
import json
import os
import statistics
import time

import duckdb
import duckdb_extension_delta
from deltalake import DeltaTable, QueryBuilder


def best_of(repeat, fn):
    times = []
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", required=True)
    ap.add_argument("--key", type=int, required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    ext = glob.glob(os.path.join(os.path.dirname(duckdb_extension_delta.__file__),
                                 "extensions", "*", "delta.duckdb_extension"))[0]
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{ext}'")
    t = a.table
    scan_sql = "SELECT count(*), count(DISTINCT destination), max(tstamp) FROM {}"
    key_sql = "SELECT trip_id, route_id, destination FROM {} WHERE trip_id = " + str(a.key)
    duck_scan_ms, duck_scan = best_of(a.repeat, lambda: con.execute(
        scan_sql.format(f"delta_scan('{t}')")).fetchall())
    duck_key_ms, duck_key = best_of(a.repeat, lambda: con.execute(
        key_sql.format(f"delta_scan('{t}')")).fetchall())

    def py(sql):
        dt = DeltaTable(t)
        return QueryBuilder().register("t", dt).execute(sql).read_all()

    py_scan_ms, py_scan = best_of(a.repeat, lambda: py(scan_sql.format("t")))
    py_key_ms, py_key = best_of(a.repeat, lambda: py(key_sql.format("t")))
    rows = duck_scan[0][0]
    py_rows = py_scan.column(0).to_pylist()[0]
    assert rows == py_rows, (rows, py_rows)
    assert len(duck_key) == py_key.num_rows, (duck_key, py_key.num_rows)
    files = len(DeltaTable(t).file_uris())
    print(json.dumps({
        "label": a.label, "rows": rows, "files": files,
        "duckdb_scan_ms": round(duck_scan_ms, 1), "duckdb_key_ms": round(duck_key_ms, 1),
        "deltalake_scan_ms": round(py_scan_ms, 1), "deltalake_key_ms": round(py_key_ms, 1),
    }))


if __name__ == "__main__":
    main()
