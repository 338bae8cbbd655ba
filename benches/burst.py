"""Bursts: many CDC files of one table (or of many tables) delivered at once to concurrent
workers, through the real queues (LocalStack SQS, S3 notifications) and the release
function binary under `cargo lambda watch`, each worker playing Lambda's SQS poller.

Modes, each on its own copy of the same base table and the same files:
  sequential   one worker, standard queue, 10 messages per invocation (the baseline)
  fifo         N workers: standard queue -> the function forwards to the FIFO queue (table =
               message group) -> one invocation per table at a time merges 10 files
  storm        N workers straight on the standard queue (no FIFO): concurrent writers
and for T tables x F files: one worker and N workers, both through the FIFO queue.

Reported per mode: wall time from "all notifications queued" to "queues empty", commits,
commit attempts beyond the first (conflicts), failed files, and the peak RSS of the largest
function process during that mode (the reset starts a mode's peak at the process's current
RSS, so heap the allocator kept from an earlier mode counts in later ones: read a mode's
growth against the one before it; the JSON lines also hold every process's peak, and its RSS
when the mode ended); the final tables of all modes are compared row by row.

Usage (LocalStack running, e.g. `scripts/localstack start`; release harness built):
  $CACHE/venv-e2e/bin/python benches/burst.py --dir /tmp/tributary-burst [--rows 1000000]
      [--modes sequential,storm] [--env KEY=VALUE]
"""

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import boto3
from deltalake import DeltaTable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from conftest import CREDS, ENDPOINT, REGION, Functions, Poller, storage_options  # noqa: E402

TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
BENCH = TARGET / "release" / "tributary-bench"


def table_toml(name, raw, curated, prefix):
    return f"""
[[table]]
name = "{name}"
source = "s3://{raw}/{prefix}/{name}/"
target = "s3://{curated}/{name}"
primary_key = ["trip_id"]
partition_by = ["route_id"]
sequence_by = ["update_ts_dms"]
drop_columns = ["update_ts_dms"]
"""


def upload_dir(s3, local, bucket, prefix):
    for p in sorted(Path(local).rglob("*")):
        if p.is_file():
            s3.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(local)}")


def emulator(name):
    """S3 and SQS clients on the emulator, a run id, two new buckets (`<name>-raw-<run>`,
    `<name>-curated-<run>`) and a function giving a queue URL's ARN."""
    s3 = boto3.client("s3", endpoint_url=ENDPOINT, **CREDS)
    sqs = boto3.client("sqs", endpoint_url=ENDPOINT, **CREDS)
    run = uuid.uuid4().hex[:8]
    raw, curated = f"{name}-raw-{run}", f"{name}-curated-{run}"
    for b in (raw, curated):
        s3.create_bucket(Bucket=b)
    arn = lambda url: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return s3, sqs, run, raw, curated, arn


def queued(sqs, url):
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return int(a["ApproximateNumberOfMessages"]) + int(a["ApproximateNumberOfMessagesNotVisible"])


def rss_of(pids, field="VmHWM"):
    """Each process's `field` of /proc/<pid>/status (VmHWM: peak RSS; VmRSS: RSS now), in
    MB, largest first."""
    out = []
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    out.append(int(line.split()[1]) // 1024)
        except OSError:
            pass
    return sorted(out, reverse=True)


def reset_peaks(pids):
    """Start each process's peak RSS (VmHWM) again from its current RSS (Linux `clear_refs`
    "5"), so a mode's peak is its own and not an earlier mode's."""
    for pid in pids:
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except (FileNotFoundError, ProcessLookupError):
            pass  # the process ended; any other failure would make the peaks wrong, so it raises


def function_pids():
    out = subprocess.run(["pgrep", "-f", "release/tributary-merge"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def table_rows(curated, name):
    dt = DeltaTable(f"s3://{curated}/{name}", storage_options=storage_options())
    t = dt.to_pyarrow_table(columns=["trip_id", "route_id", "destination", "source_location"])
    return t.sort_by("trip_id"), dt.version()


def run_mode(env, label, tables, files, prefix, workers, use_fifo):
    """Upload `files` for each table, wait until every notification is queued, then drain
    with `workers` threads; returns the measurements."""
    aws, s = env["aws"], env["stack"]
    for t in tables:
        upload_dir(aws.s3, env["base"], s.curated, t)
    log_start = Path(env["functions"].log.name).stat().st_size
    queue = s.route_url if use_fifo else s.std_url
    for t in tables:
        for f in files:
            aws.s3.upload_file(str(f), s.raw, f"{prefix}/{t}/{f.name}")
    expected = len(tables) * len(files)
    deadline = time.time() + 120
    while queued(aws.sqs, queue) < expected and time.time() < deadline:
        time.sleep(0.2)
    assert queued(aws.sqs, queue) >= expected, f"{label}: only {queued(aws.sqs, queue)} of {expected} notifications"
    std = Poller(aws, s, env["functions"], queue, s.route_arn if use_fifo else s.std_arn)
    fifo = Poller(aws, s, env["functions"], s.fifo_url, s.fifo_arn)
    # As Lambda's event source mappings: each queue has its own pollers (up to `workers`
    # concurrent invocations per mapping), long polling.
    pollers = ([std] * workers + [fifo] * workers) if use_fifo else [std] * workers
    stop = threading.Event()

    def worker(p):
        while not stop.is_set():
            messages = p.receive(10, wait=1)
            if messages:
                p.deliver(messages)

    reset_peaks(function_pids())
    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(len(pollers)) as pool:
        futures = [pool.submit(worker, p) for p in pollers]
        while True:
            time.sleep(0.2)
            if all(queued(aws.sqs, q) == 0 for q in ([queue, s.fifo_url] if use_fifo else [queue])):
                break
        stop.set()
        for f in futures:
            f.result()
    elapsed = time.time() - start
    peaks, now = rss_of(function_pids()), rss_of(function_pids(), "VmRSS")
    env["functions"].log.flush()
    log = Path(env["functions"].log.name).read_text()[log_start:]
    commits, conflicts = 0, 0
    for t in tables:
        attempts = [int(a) for a in re.findall(rf'"table":"{t}"[^\n]*?\\"commit_attempts\\":(\d+)', log)]
        commits += len(attempts)
        conflicts += sum(a - 1 for a in attempts)
    failed = sum(int(n) for n in re.findall(r'"FilesFailed":(\d+)', log))
    dead = queued(aws.sqs, s.dead_url)
    return {"mode": label, "tables": len(tables), "files": expected, "workers": workers,
            "seconds": round(elapsed, 2), "commits": commits, "conflicts": conflicts,
            "failed_files": failed, "dead_lettered": dead, "peak_rss_mb": max(peaks, default=0),
            "peak_rss_mb_by_process": peaks, "rss_mb_after_by_process": now}


MODES = ("sequential", "fifo", "storm", "tables")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/tributary-burst")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--changes", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=10)
    ap.add_argument("--tables", type=int, default=20)
    ap.add_argument("--table-files", type=int, default=20)
    ap.add_argument("--table-rows", type=int, default=100_000)
    ap.add_argument("--out", default=None, help="JSON lines file for the results")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra variable for the function (e.g. TRIBUTARY_LOG_CACHE_MB=0); repeatable")
    ap.add_argument("--modes", default=",".join(MODES), metavar="M,M",
                    help=f"the modes to run, of {','.join(MODES)} (sequential always runs: the others are compared with it)")
    args = ap.parse_args()
    modes = set(args.modes.split(",")) | {"sequential"}
    if not modes <= set(MODES):
        ap.error(f"--modes {args.modes}: modes are {','.join(MODES)}")
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    for rows, count in ((args.rows, args.files), (args.table_rows, args.table_files))[:2 if "tables" in modes else 1]:
        subprocess.run([BENCH, "prepare", "--dir", d, "--rows", str(rows)], check=True)
        subprocess.run([BENCH, "files", "--dir", d, "--rows", str(rows), "--changes", str(args.changes),
                        "--mix", "realistic", "--count", str(count)], check=True, stdout=subprocess.DEVNULL)
    big_files = sorted((d / f"files-{args.rows}-{args.changes}-realistic").glob("*.parquet"))[:args.files]
    small_files = sorted((d / f"files-{args.table_rows}-{args.changes}-realistic").glob("*.parquet"))[:args.table_files]

    s3, sqs, run, raw, curated, arn = emulator("burst")
    std_url = sqs.create_queue(QueueName=f"burst-std-{run}", Attributes={"VisibilityTimeout": "120"})["QueueUrl"]
    route_url = sqs.create_queue(QueueName=f"burst-route-{run}", Attributes={"VisibilityTimeout": "120"})["QueueUrl"]
    fifo_url = sqs.create_queue(QueueName=f"burst-{run}.fifo", Attributes={"FifoQueue": "true", "VisibilityTimeout": "120"})["QueueUrl"]
    dead_url = sqs.create_queue(QueueName=f"burst-dead-{run}")["QueueUrl"]
    s3.put_bucket_notification_configuration(Bucket=raw, NotificationConfiguration={"QueueConfigurations": [
        {"QueueArn": arn(std_url), "Events": ["s3:ObjectCreated:*"],
         "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "std/"}]}}},
        {"QueueArn": arn(route_url), "Events": ["s3:ObjectCreated:*"],
         "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "fifo/"}]}}},
    ]})
    one = ["sequential", "fifo", "storm"]
    many = [f"m1_{i:02d}" for i in range(args.tables)] + [f"mn_{i:02d}" for i in range(args.tables)]
    config = "".join(table_toml(t, raw, curated, "fifo" if t == "fifo" or t.startswith("m") else "std")
                     for t in one + many)
    s3.put_object(Bucket=curated, Key="config/tributary.toml", Body=config.encode())
    stack = type("Stack", (), dict(raw=raw, curated=curated, std_url=std_url, std_arn=arn(std_url),
                                   route_url=route_url, route_arn=arn(route_url), fifo_url=fifo_url,
                                   fifo_arn=arn(fifo_url), dead_url=dead_url))
    environment = {"AWS_ENDPOINT_URL": ENDPOINT, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                   "AWS_REGION": REGION, "TRIBUTARY_CONFIG": f"s3://{curated}/config/tributary.toml",
                   "TRIBUTARY_ROUTE_TO": fifo_url, "TRIBUTARY_ROUTE_FROM": arn(route_url),
                   "TRIBUTARY_DEAD_LETTER_TO": dead_url, "RUST_LOG": "info"}
    for kv in args.env:
        key, sep, value = kv.partition("=")
        if not sep:
            ap.error(f"--env {kv}: expected KEY=VALUE")
        environment[key] = value
    functions = Functions(None, None, environment=environment, log="burst-cargo-lambda.log",
                          release=True, concurrency=args.workers)
    results = []
    try:
        # warm every function instance (cold starts are not what is measured)
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            list(pool.map(lambda _: functions.invoke("tributary-merge", {"Records": []}), range(args.workers * 2)))
        env = {"aws": type("Aws", (), dict(s3=s3, sqs=sqs)), "stack": stack, "functions": functions,
               "base": d / f"base-{args.rows}"}
        results.append(run_mode(env, "sequential", ["sequential"], big_files, "std", 1, False))
        if "fifo" in modes:
            results.append(run_mode(env, "fifo", ["fifo"], big_files, "fifo", args.workers, True))
        if "storm" in modes:
            results.append(run_mode(env, "storm", ["storm"], big_files, "std", args.workers, False))
        if "tables" in modes:
            env["base"] = d / f"base-{args.table_rows}"
            results.append(run_mode(env, f"{args.tables} tables, 1 worker", [t for t in many if t.startswith("m1_")],
                                    small_files, "fifo", 1, True))
            results.append(run_mode(env, f"{args.tables} tables, {args.workers} workers", [t for t in many if t.startswith("mn_")],
                                    small_files, "fifo", args.workers, True))
        # The same files give the same table, however they were delivered.
        want, _ = table_rows(curated, "sequential")
        for t in ("fifo", "storm"):
            if t in modes:
                got, _ = table_rows(curated, t)
                assert got.equals(want), f"{t} differs from sequential"
        if "tables" in modes:
            want, _ = table_rows(curated, "m1_00")
            for t in many:
                got, _ = table_rows(curated, t)
                assert got.equals(want), f"{t} differs from m1_00"
        for r in results:
            r["identical_to_sequential"] = True
            r["rows"] = args.rows if r["tables"] == 1 else args.table_rows
    finally:
        functions.stop()
    out = Path(args.out) if args.out else d / "burst.jsonl"
    with open(out, "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    print("| mode | tables x files | workers | seconds | vs sequential | commits | conflicts | failed files | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = {1: results[0]["seconds"]}
    base.update({r["tables"]: r["seconds"] for r in results if r["tables"] > 1 and r["workers"] == 1})
    for r in results:
        ratio = r["seconds"] / base[r["tables"]]
        print(f"| {r['mode']} | {r['tables']} x {r['files'] // r['tables']} | {r['workers']} | {r['seconds']} | "
              f"{ratio:.2f}x | {r['commits']} | {r['conflicts']} | {r['failed_files']} | {r['peak_rss_mb']} |")
    print(f"peak RSS: of the largest function instance during each mode; results in {out}")


if __name__ == "__main__":
    main()
