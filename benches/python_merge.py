#!/usr/bin/env python3
"""What a Python Lambda user would write with the `deltalake` package: for each DMS CDC file,
keep the latest change per key, then MERGE it into the Delta table (update / delete /
insert). Same workload and same starting table as `tributary-bench run`; prints one JSON
line in the same shape.

usage: python_merge.py --dir D --rows N --changes C --mix M --count K
"""
import argparse
import json
import resource
import shutil
import time
from pathlib import Path

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable


def pct(v, p):
    s = sorted(v)
    return s[round((len(s) - 1) * p)] if s else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--changes", type=int, required=True)
    ap.add_argument("--mix", required=True)
    ap.add_argument("--count", type=int, default=10)
    a = ap.parse_args()
    d = Path(a.dir).resolve()
    files = sorted((d / f"files-{a.rows}-{a.changes}-{a.mix}").glob("*.parquet"))[: a.count]
    table = d / "work-python" / "bench"
    if table.exists():
        shutil.rmtree(table)
    table.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(d / f"base-{a.rows}", table)
    latency, rewritten, rewritten_bytes = [], 0, 0
    for f in files:
        dt = DeltaTable(str(table))
        adds = pa.table(dt.get_add_actions(flatten=True))
        before = dict(zip(adds.column("path").to_pylist(), adds.column("size_bytes").to_pylist()))
        t0 = time.perf_counter()
        src = pq.read_table(f)
        # latest change per key: order by (commit timestamp, row), keep the last row of each key
        src = src.append_column("_row", pa.array(range(src.num_rows)))
        src = src.sort_by([("trip_id", "ascending"), ("update_ts_dms", "ascending"), ("_row", "ascending")])
        keys = src.column("trip_id")
        last = pc.not_equal(keys.slice(0, len(keys) - 1), keys.slice(1)).to_pylist() + [True] if len(keys) else []
        src = src.filter(pa.array(last))
        src = src.append_column("_tributary_seq", pc.binary_join_element_wise("1 ", src.column("update_ts_dms"), ""))
        src = src.drop_columns(["_row", "update_ts_dms"])
        (
            dt.merge(source=src, predicate="t.trip_id = s.trip_id", source_alias="s", target_alias="t")
            .when_matched_delete(predicate="s.Op = 'D'")
            .when_matched_update(updates={c: f"s.{c}" for c in ["tstamp", "route_id", "destination", "source_location", "_tributary_seq"]})
            .when_not_matched_insert(updates={c: f"s.{c}" for c in ["trip_id", "tstamp", "route_id", "destination", "source_location", "_tributary_seq"]}, predicate="s.Op != 'D'")
            .execute()
        )
        latency.append((time.perf_counter() - t0) * 1000)
        after = set(pa.table(DeltaTable(str(table)).get_add_actions(flatten=True)).column("path").to_pylist())
        for p, s in before.items():
            if p not in after:
                rewritten += 1
                rewritten_bytes += s
    t0 = time.perf_counter()
    dt = DeltaTable(str(table))
    dt.optimize.compact()
    dt = DeltaTable(str(table))
    dt.create_checkpoint()
    maintenance_ms = (time.perf_counter() - t0) * 1000
    n = len(files)
    print(json.dumps({
        "engine": f"python-deltalake-{deltalake.__version__}",
        "rows": a.rows, "changes": a.changes, "mix": a.mix, "files": n,
        "latency_ms": [round(x, 1) for x in latency],
        "p50_ms": pct(latency, 0.5), "p95_ms": pct(latency, 0.95),
        "changes_per_s": a.changes * n / (sum(latency) / 1000),
        "freshness_p50_ms": pct(latency, 0.5),
        "files_rewritten_per_merge": rewritten / n, "bytes_rewritten_per_merge": rewritten_bytes / n,
        "table_files_after": len(DeltaTable(str(table)).file_uris()),
        "maintenance_ms": maintenance_ms,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


if __name__ == "__main__":
    main()
