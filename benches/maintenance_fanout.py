"""Maintenance of many small tables, one invocation per table, as the template's state
machine runs it: the release maintenance function under `cargo lambda watch`, S3 on
LocalStack (loopback), N invocations at a time (the template's MaintenanceConcurrency).

Set-up: T tables of the walkthrough's shape (partitioned by route_id), each fed the same
DMS files by the release merge function, one file per invocation: a full load, F CDC files
of new rows (each appended as a small file per partition: what compaction has to fix) and
one CDC file of updates and deletes (a MERGE). Then: the list invocation, then one
invocation per table, `--concurrency` at a time. Reported: wall time of the fan-out,
per-invocation time (p50 / p95 / max), files before / after, failures, peak RSS of one
function instance; every table is read back and compared with the simulated source
(maintenance never changes rows).

Usage (LocalStack running, e.g. `scripts/localstack start`; release binaries built):
  $CACHE/venv-e2e/bin/python benches/maintenance_fanout.py --tables 500 [--files 3]
"""

import argparse
import concurrent.futures
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
from deltalake import DeltaTable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "benches"))
import dms  # noqa: E402
from burst import rss_of  # noqa: E402
from s3_count import CountingProxy  # noqa: E402
from conftest import CREDS, ENDPOINT, REGION, Functions, storage_options, table_config  # noqa: E402


def pct(v, p):
    s = sorted(v)
    return s[round((len(s) - 1) * p)] if s else 0.0


def pids(binary):
    out = subprocess.run(["pgrep", "-f", f"release/{binary}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=500)
    ap.add_argument("--rows", type=int, default=2000, help="rows of each table's full load")
    ap.add_argument("--files", type=int, default=4, help="CDC files of new rows per table")
    ap.add_argument("--changes", type=int, default=100, help="changes per CDC file")
    ap.add_argument("--concurrency", type=int, default=5)
    ap.add_argument("--out", default=None, help="JSON file for the result")
    ap.add_argument("--count-requests", action="store_true",
                    help="route the functions' S3 requests through a counting proxy and report them "
                         "(adds the proxy's latency to every request)")
    args = ap.parse_args()
    source = dms.Source(seed=14)
    files = [("LOAD00000001.parquet", dms.parquet(source.insert_records(args.rows), False))]
    for i in range(args.files):
        files.append((f"2022/10/26/20221026-{i:010d}.parquet", dms.parquet(source.insert_records(args.changes), True)))
    files.append((f"2022/10/26/20221026-{args.files:010d}.parquet", dms.parquet(source.random_changes(args.changes), True)))
    want = source.state()

    s3 = boto3.client("s3", endpoint_url=ENDPOINT, **CREDS)
    run = uuid.uuid4().hex[:8]
    raw, curated = f"fanout-raw-{run}", f"fanout-curated-{run}"
    for b in (raw, curated):
        s3.create_bucket(Bucket=b)
    tables = [f"t{i:03d}" for i in range(args.tables)]
    s3.put_object(Bucket=curated, Key="config/tributary.toml",
                  Body="".join(table_config(raw, curated, t) for t in tables).encode())
    proxy = CountingProxy(ENDPOINT).start() if args.count_requests else None
    environment = {"AWS_ENDPOINT_URL": proxy.endpoint if proxy else ENDPOINT, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                   "AWS_REGION": REGION, "TRIBUTARY_CONFIG": f"s3://{curated}/config/tributary.toml",
                   "RUST_LOG": "warn"}
    functions = Functions(None, None, environment=environment, log="fanout-cargo-lambda.log",
                          release=True, concurrency=max(8, args.concurrency))
    try:
        t0 = time.time()
        key = lambda t, name: f"dms/{t}/travel_details/{name}"
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            uploads = [(t, f) for t in tables for f in files]
            list(pool.map(lambda tf: s3.put_object(Bucket=raw, Key=key(tf[0], tf[1][0]), Body=tf[1][1]), uploads))
        setup_upload = time.time() - t0

        def merge(tf):
            t, f = tf
            record = {"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
                      "s3": {"bucket": {"name": raw}, "object": {"key": key(t, f[0])}}}
            payload, error = functions.invoke("tributary-merge", {"Records": [record]})
            assert error is None, payload
            return payload

        # Each table's files in order, tables in parallel (8 at a time).
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda t: [merge((t, f)) for f in files], tables))
        setup_merge = time.time() - t0

        merge_requests = proxy.take() if proxy else None
        listed, error = functions.invoke("tributary-maintenance", {"list": True})
        assert error is None and sorted(listed["tables"]) == tables, listed

        def maintain(t):
            start = time.time()
            payload, error = functions.invoke("tributary-maintenance", {"table": t})
            return t, time.time() - start, payload, error

        start = time.time()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(maintain, listed["tables"]))
        elapsed = time.time() - start
        requests = proxy.take() if proxy else None
        failed = [(t, p) for t, _, p, e in results if e is not None or p.get("failed")]
        reports = [m for _, _, p, e in results if e is None for m in p["maintained"]]
        durations = [s for _, s, _, _ in results]
        peak = max(rss_of(pids("tributary-maintenance")), 0)
        # Maintenance never changes rows: every table equals the source.
        for t in tables:
            dt = DeltaTable(f"s3://{curated}/delta/{t}", storage_options=storage_options())
            rows = dt.to_pyarrow_table(columns=["trip_id", "route_id", "destination", "source_location"]).to_pylist()
            got = {r["trip_id"]: (r["route_id"], r["destination"], r["source_location"]) for r in rows}
            assert len(got) == len(rows) and got == want, f"{t} differs from the source"
    finally:
        functions.stop()
        if proxy:
            proxy.stop()
    result = {
        "tables": args.tables, "rows_per_table": len(want), "files_merged_per_table": len(files),
        "concurrency": args.concurrency, "setup_upload_s": round(setup_upload, 1),
        "setup_merge_s": round(setup_merge, 1), "fanout_s": round(elapsed, 1),
        "invocation_s_p50": round(pct(durations, 0.5), 3), "invocation_s_p95": round(pct(durations, 0.95), 3),
        "invocation_s_max": round(max(durations), 3),
        "files_before": sum(r["files_before"] for r in reports), "files_after": sum(r["files_after"] for r in reports),
        "files_compacted": sum(r["files_compacted"] for r in reports), "failed": len(failed),
        "peak_rss_mb_one_instance": peak, "rows_identical": True,
    }
    if requests is not None:
        # Which requests reached beyond the table an invocation was given: every key must be
        # the configuration or under one table's `delta/<table>/`.
        def scope(key):
            parts = key.split("/")
            return "table" if len(parts) > 2 and parts[0] == "delta" and parts[1] in tables else key
        by_op = {}
        for _, op, _, _ in requests:
            by_op[op] = by_op.get(op, 0) + 1
        outside = sorted({(op, key) for _, op, _, key in requests if scope(key) != "table"})
        result["s3_requests_per_merge"] = round(len(merge_requests) / (len(tables) * len(files)), 1)
        (ROOT / "target" / "fanout-merge-requests.tsv").write_text("".join("\t".join(r) + "\n" for r in merge_requests))
        (ROOT / "target" / "fanout-requests.tsv").write_text("".join("\t".join(r) + "\n" for r in requests))
        result["s3_requests"] = len(requests)
        result["s3_requests_per_table"] = round(len(requests) / len(tables), 1)
        result["s3_requests_by_op"] = by_op
        result["s3_requests_outside_tables"] = [f"{op} {key}" for op, key in outside]
    if args.out:
        Path(args.out).write_text(json.dumps(result) + "\n")
    print(json.dumps(result, indent=1))
    if failed:
        print("failed:", failed[:5])
        sys.exit(1)


if __name__ == "__main__":
    main()
