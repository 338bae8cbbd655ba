"""S3 requests per merge as a table's log grows: a full load, then N small insert files merged
one per invocation by the release merge function (under `cargo lambda watch`), its S3 requests
counted through benches/s3_count.py. Printed per block of 10 merges: mean / max requests,
GETs of commit files, mean time (LocalStack on loopback, proxy included).

Usage (LocalStack running; release binaries built, or TRIBUTARY_BENCH_DEBUG=1 for debug;
TRIBUTARY_BENCH_CHANGES=1 for files of random changes instead of inserts):
  $CACHE/venv-e2e/bin/python benches/merge_requests.py [N=100] [K]
With K, the requests of merge K are printed in order (method, key, query).
"""
import os, sys, uuid, collections, json, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e")); sys.path.insert(0, str(ROOT / "benches"))
import boto3, dms
from s3_count import CountingProxy
from conftest import CREDS, ENDPOINT, REGION, Functions, table_config
n = int(sys.argv[1]) if len(sys.argv) > 1 else 60
dump = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "-" else None
# TRIBUTARY_BENCH_CHANGES=1: files of 20 random changes (inserts, updates moving rows between
# partitions, deletes: the freshness benchmark's files) instead of 20 inserts
changes = os.environ.get("TRIBUTARY_BENCH_CHANGES") == "1"
source = dms.Source(seed=14)
files = [("LOAD00000001.parquet", dms.parquet(source.insert_records(2000), False))]
for i in range(n):
    # one file a second, as DMS names them (distinct times: each merge moves the watermark)
    files.append((f"2022/10/26/20221026-{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}0000.parquet",
                  dms.parquet(source.random_changes(20) if changes else source.insert_records(20), True)))
s3 = boto3.client("s3", endpoint_url=ENDPOINT, **CREDS)
run = uuid.uuid4().hex[:8]; raw, curated = f"mg-raw-{run}", f"mg-cur-{run}"
for b in (raw, curated): s3.create_bucket(Bucket=b)
s3.put_object(Bucket=curated, Key="config/tributary.toml", Body=table_config(raw, curated, "t000").encode())
proxy = CountingProxy(ENDPOINT).start()
env = {"AWS_ENDPOINT_URL": proxy.endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
       "AWS_REGION": REGION, "TRIBUTARY_CONFIG": f"s3://{curated}/config/tributary.toml", "RUST_LOG": "warn"}
# TRIBUTARY_BENCH_DEBUG=1: the debug binaries (request counts do not depend on the build)
release = os.environ.get("TRIBUTARY_BENCH_DEBUG") != "1"
fn = Functions(None, None, environment=env, log="mg-cargo-lambda.log", release=release, concurrency=1)
block = []
try:
    for i, (name, body) in enumerate(files[1:], 1):
        if i == 1:
            k0 = f"dms/t000/travel_details/{files[0][0]}"
            s3.put_object(Bucket=raw, Key=k0, Body=files[0][1])
            fn.invoke("tributary-merge", {"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": raw}, "object": {"key": k0}}}]})
        key = f"dms/t000/travel_details/{name}"
        s3.put_object(Bucket=raw, Key=key, Body=body)
        proxy.take()
        t0 = time.time()
        p, e = fn.invoke("tributary-merge", {"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": raw}, "object": {"key": key}}}]})
        dt = time.time() - t0
        assert e is None, p
        reqs = proxy.take()
        if i == dump:
            for r in reqs:
                print("  ", *r[1:], flush=True)
        c = collections.Counter(op for _, op, _, _ in reqs)
        logs = sum(1 for _, op, _, k in reqs if op == "GET" and "_delta_log/" in k and k.endswith(".json"))
        block.append((len(reqs), logs, dt, c))
        if len(block) == 10:
            print(json.dumps({"merges": f"{i-9}-{i}", "requests_mean": sum(b[0] for b in block) / 10, "requests_max": max(b[0] for b in block),
                              "log_json_gets_mean": sum(b[1] for b in block) / 10, "log_json_gets_max": max(b[1] for b in block),
                              "ms_mean": round(sum(b[2] for b in block) * 100),
                              "by_method_mean": {m: sum(b[3][m] for b in block) / 10 for m in sorted({m for b in block for m in b[3]})}}), flush=True)
            block.clear()
finally:
    fn.stop(); proxy.stop()
