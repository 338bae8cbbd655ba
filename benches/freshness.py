"""Freshness: how long from a CDC file landing in S3 to its changes being committed to the
Delta table, and how far each table's watermark trails the clock, under a steady load of
several tables and then a burst (issue #27, item 4).

The template's real path: files land in S3 under DMS date folders with DMS names (the time
they are written), S3 notifications queue them on the standard "merge" queue, the merge
function (release binary under `cargo lambda watch`) forwards them to the FIFO queue (table
= message group), and the same function merges each table's files from there. Python
threads play Lambda's SQS event source mappings: batch size 10, the standard queue's
batching window (`--window`, the template's `MergeBatchingWindowSeconds`; a FIFO queue has
none), a fixed number of concurrent pollers per mapping.

Phases, every table alike: a full load (not measured), `--steady` seconds with one file of
`--changes` random changes per table every `--interval` seconds, then `--burst` files per
table at once, then `--tail` seconds of the steady load again.

Measured, after the run, from the tables' own logs:
  latency    file landed (its PUT returned) -> the commit that records it
             (`tributary.file/<key>`, that commit's commitInfo.timestamp)
  lag        at each second t, t minus the table's watermark (`tributary.watermark`, the
             latest watermark commit at or before t); the group's is the largest
Checked: every table equals its simulated source table at the end.

Usage (LocalStack running, e.g. `scripts/localstack start`; the release merge function is
built by `cargo lambda watch --release` on first use):
  $CACHE/venv-e2e/bin/python benches/freshness.py [--tables 5] [--steady 120] [--window 5] \
      [--out benches/results/X.jsonl] [--plot docs/img/freshness.png]
(--plot needs matplotlib, not part of the e2e environment: `$CACHE/venv-e2e/bin/pip install matplotlib`.)
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import dms  # noqa: E402
from burst import emulator, queued, rss_of  # noqa: E402
from conftest import ENDPOINT, REGION, Functions, Poller, storage_options  # noqa: E402

TABLE = """
[[table]]
name = "{name}"
source = "s3://{raw}/dms/public/{name}/"
target = "s3://{curated}/tables/{name}"
primary_key = ["trip_id"]
partition_by = ["route_id"]
sequence_by = ["update_ts_dms"]
drop_columns = ["schema_name", "table_name", "update_ts_dms"]
"""


class Source(dms.Source):
    """dms.Source with a commit clock that keeps increasing past 3,600 statements (its
    `21:MM:SS` wraps after an hour of statements, fine for the tests' few hundred)."""

    def _ts(self):
        self.clock += 1
        return (datetime.datetime(2022, 10, 25, 21) + datetime.timedelta(milliseconds=self.clock)).strftime(
            "%Y-%m-%d %H:%M:%S.%f")


def dms_key(table, when):
    """DMS's CDC object key for a file written at `when` (UTC), default date folders."""
    return (f"dms/public/{table}/{when:%Y/%m/%d}/{when:%Y%m%d-%H%M%S}"
            f"{when.microsecond // 1000:03d}.parquet")


def cpu_seconds():
    """CPU seconds (user + system) used so far by LocalStack, by the merge function's
    processes and by this script, with the wall clock: where the two cores went."""
    tick = os.sysconf("SC_CLK_TCK")

    def of(pattern):
        pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
        total = 0
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
            except OSError:
                pass
        return total / tick
    me = os.times()
    return {"wall": time.time(), "localstack": of("localstack.runtime.main"), "merge_function": of("tributary-merge"),
            "this_script": me.user + me.system}


def percentile(values, p):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


class Mapping:
    """One SQS event source mapping: `pollers` threads, each receiving up to 10 messages,
    gathering for up to `window` seconds (Lambda's batching window), then invoking."""

    def __init__(self, poller, pollers, window):
        self.poller, self.pollers, self.window = poller, pollers, window
        self.invocations = 0
        self.lock = threading.Lock()
        # object key -> (queued: the message's SentTimestamp, received, invoked, returned),
        # in s, for the first time the key came off this queue: where a file's latency went
        self.seen = {}

    def receive(self, n):
        got = self.poller.receive(n, wait=1)
        now = time.time()
        for m in got:
            m["_received"] = now
        return got

    def run(self, stop):
        p = self.poller
        while not stop.is_set():
            messages = self.receive(10)
            if not messages:
                continue
            started = time.time()
            while len(messages) < 10 and time.time() - started < self.window:
                messages += self.receive(10 - len(messages))
            invoked = time.time()
            p.deliver(messages)
            returned = time.time()
            with self.lock:
                self.invocations += 1
                for m in messages:
                    queued_at = int(m["Attributes"]["SentTimestamp"]) / 1000
                    for r in json.loads(m["Body"]).get("Records", []):
                        key = urllib.parse.unquote_plus(r["s3"]["object"]["key"])
                        self.seen.setdefault(key, (queued_at, m["_received"], invoked, returned))


def read_log(s3, bucket, prefix):
    """(commit version, commitInfo.timestamp in s, [files it records, as paths under the
    source], watermark in s or None) for every JSON commit of the table at `prefix`."""
    out = []
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/_delta_log/")
    for page in pages:
        for o in page.get("Contents", []):
            name = o["Key"].rsplit("/", 1)[1]
            if not name.endswith(".json") or not name[:20].isdigit():
                continue
            ts, files, mark = None, [], None
            for line in s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read().splitlines():
                action = json.loads(line)
                if "commitInfo" in action:
                    ts = action["commitInfo"]["timestamp"] / 1000
                txn = action.get("txn")
                if txn and txn["appId"].startswith(("tributary.file/", "tributary.load/")):
                    files.append(txn["appId"].split("/", 1)[1])
                if txn and txn["appId"] == "tributary.watermark":
                    mark = (txn["version"] >> 8) / 1e6
            out.append((int(name[:20]), ts, files, mark))
    return sorted(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=5)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between a table's files")
    ap.add_argument("--steady", type=float, default=120, help="seconds of steady load before the burst")
    ap.add_argument("--burst", type=int, default=40, help="files per table landing at once")
    ap.add_argument("--tail", type=float, default=60, help="seconds of steady load after the burst")
    ap.add_argument("--changes", type=int, default=20, help="changes per file")
    ap.add_argument("--load-rows", type=int, default=10000, help="full-load rows per table")
    ap.add_argument("--window", type=int, default=5, help="the merge queue's batching window, s")
    ap.add_argument("--pollers", type=int, default=5, help="concurrent invocations per mapping")
    ap.add_argument("--batch-interval", type=float, default=60,
                    help="the DMS batch interval the goal is stated in (CdcMaxBatchInterval)")
    ap.add_argument("--out", default=None, help="JSON lines: one summary line, then the timeline")
    ap.add_argument("--plot", default=None, help="PNG of latency and watermark lag over time")
    args = ap.parse_args()

    s3, sqs, run, raw, curated, arn = emulator("fresh")
    merge_url = sqs.create_queue(QueueName=f"fresh-merge-{run}", Attributes={"VisibilityTimeout": "120"})["QueueUrl"]
    fifo_url = sqs.create_queue(QueueName=f"fresh-{run}.fifo",
                                Attributes={"FifoQueue": "true", "VisibilityTimeout": "120"})["QueueUrl"]
    dead_url = sqs.create_queue(QueueName=f"fresh-dead-{run}")["QueueUrl"]
    s3.put_bucket_notification_configuration(Bucket=raw, NotificationConfiguration={"QueueConfigurations": [
        {"QueueArn": arn(merge_url), "Events": ["s3:ObjectCreated:*"],
         "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "dms/"}]}}}]})
    tables = [f"t{i:02d}" for i in range(args.tables)]
    config = "".join(TABLE.format(name=t, raw=raw, curated=curated) for t in tables)
    s3.put_object(Bucket=curated, Key="config/tributary.toml", Body=config.encode())
    environment = {"AWS_ENDPOINT_URL": ENDPOINT, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                   "AWS_REGION": REGION, "TRIBUTARY_CONFIG": f"s3://{curated}/config/tributary.toml",
                   "TRIBUTARY_ROUTE_TO": fifo_url, "TRIBUTARY_ROUTE_FROM": arn(merge_url),
                   "TRIBUTARY_DEAD_LETTER_TO": dead_url, "RUST_LOG": "info"}
    # TRIBUTARY_BENCH_DEBUG=1: the debug binaries (to try the harness; not for the numbers)
    release = os.environ.get("TRIBUTARY_BENCH_DEBUG") != "1"
    functions = Functions(None, None, environment=environment, log="freshness-cargo-lambda.log",
                          release=release, concurrency=2 * args.pollers)
    aws = type("Aws", (), dict(s3=s3, sqs=sqs))
    stack = type("Stack", (), {})
    sources = {t: Source(seed=i) for i, t in enumerate(tables)}
    landed = {}  # key -> (table, phase, seconds when its PUT returned)
    lock = threading.Lock()

    def put(table, key, body, phase):
        s3.put_object(Bucket=raw, Key=key, Body=body)
        with lock:
            landed[key] = (table, phase, time.time())

    bodies = {}

    def cdc_file(table, when):
        return dms_key(table, when), bodies[table].pop()

    stop = threading.Event()
    mappings = [Mapping(Poller(aws, stack, functions, merge_url, arn(merge_url)), args.pollers, args.window),
                Mapping(Poller(aws, stack, functions, fifo_url, arn(fifo_url)), args.pollers, 0)]
    pool = concurrent.futures.ThreadPoolExecutor(2 * args.pollers + 2 * args.tables + 4)
    try:
        # warm the function instances (cold starts are not what is measured)
        list(pool.map(lambda _: functions.invoke("tributary-merge", {"Records": []}), range(2 * args.pollers)))
        workers = [pool.submit(m.run, stop) for m in mappings for _ in range(m.pollers)]

        for t in tables:
            load = sources[t].insert_records(args.load_rows)
            rows = [(None, "2022-10-25 20:00:00.000000", *r[2:]) for r in load]
            put(t, f"dms/public/{t}/LOAD00000001.parquet", dms.parquet(rows, False), "load")
        deadline = time.time() + 300
        while time.time() < deadline and not all(
                any(f == "LOAD00000001.parquet" for _, _, fs, _ in read_log(s3, curated, f"tables/{t}") for f in fs)
                for t in tables):
            time.sleep(1)
        # Every file's changes, made before the clock starts (generating them costs CPU the
        # merges would share) and all sent (the source's state is the model); each file is
        # named when it lands, as DMS names a file when it writes it.
        ticks = {"steady": round(args.steady / args.interval), "tail": round(args.tail / args.interval)}
        per_table = ticks["steady"] + ticks["tail"] + args.burst
        for t in tables:
            bodies[t] = [dms.parquet(sources[t].random_changes(args.changes), True) for _ in range(per_table)][::-1]

        t0 = time.time()
        cpu0 = cpu_seconds()
        marks = {}

        def steady(phase):
            tick = time.time()
            for _ in range(ticks[phase]):
                now = datetime.datetime.now(datetime.timezone.utc)
                for t in tables:
                    key, body = cdc_file(t, now)
                    pool.submit(put, t, key, body, phase)
                tick += args.interval
                time.sleep(max(0.0, tick - time.time()))

        steady("steady")
        marks["burst"] = time.time()
        # a backlog at once (DMS catching up after a pause): names a millisecond apart
        base = datetime.datetime.now(datetime.timezone.utc)
        burst = [(t, *cdc_file(t, base + datetime.timedelta(milliseconds=i))) for i in range(args.burst) for t in tables]
        list(pool.map(lambda f: put(f[0], f[1], f[2], "burst"), burst))
        marks["burst_landed"] = time.time()
        steady("tail")
        marks["load_end"] = time.time()
        deadline = time.time() + 600
        while time.time() < deadline and (queued(sqs, merge_url) or queued(sqs, fifo_url)):
            time.sleep(0.5)
        time.sleep(2)
        cpu1 = cpu_seconds()
        stop.set()
        for w in workers:
            w.result()
        peak = rss_of([int(p) for p in subprocess.run(
            ["pgrep", "-f", "tributary-merge"], capture_output=True, text=True).stdout.split()])
    finally:
        stop.set()
        pool.shutdown(wait=False)
        functions.stop()

    # -- measured from the tables' logs
    logs = {t: read_log(s3, curated, f"tables/{t}") for t in tables}
    committed = {}
    for t, commits in logs.items():
        for _, ts, files, _ in commits:
            for f in files:
                committed.setdefault(f"dms/public/{t}/{f}", ts)
    latency = {"steady": [], "burst": [], "tail": []}
    missing = []
    for key, (t, phase, at) in landed.items():
        if phase == "load":
            continue
        if key not in committed:
            missing.append(key)
            continue
        latency[phase].append(committed[key] - at)
    end = max(ts for commits in logs.values() for _, ts, _, _ in commits)
    timeline = []
    second = t0
    while second <= end + 1:
        row = {"t": round(second - t0, 1)}
        for t, commits in logs.items():
            marks_before = [m for _, ts, _, m in commits if m is not None and ts <= second]
            row[t] = round(second - marks_before[-1], 2) if marks_before else None
        known = [row[t] for t in tables if row[t] is not None]
        row["group"] = max(known) if len(known) == len(tables) else None
        timeline.append(row)
        second += 1

    from deltalake import DeltaTable
    for t in tables:
        got = DeltaTable(f"s3://{curated}/tables/{t}", storage_options=storage_options()).to_pyarrow_table(
            columns=["trip_id", "route_id", "destination", "source_location"]).to_pylist()
        got = {r["trip_id"]: (r["route_id"], r["destination"], r["source_location"]) for r in got}
        want = sources[t].state()
        assert got == want, (f"table {t} differs from its source: {len(set(want) - set(got))} rows missing, "
                             f"{len(set(got) - set(want))} extra, "
                             f"{sum(1 for k in set(got) & set(want) if got[k] != want[k])} different")
    dead = queued(sqs, dead_url)

    def stats(values):
        return {"files": len(values), "p50_s": percentile(values, 50), "p99_s": percentile(values, 99),
                "max_s": max(values) if values else None,
                "mean_s": statistics.fmean(values) if values else None}

    in_phase = lambda a, b: [r["group"] for r in timeline if r["group"] is not None and a <= r["t"] + t0 < b]
    steady_lag = in_phase(t0 + 10, marks["burst"])
    after_burst = in_phase(marks["burst"], marks["load_end"])
    recovered = next((r["t"] + t0 - marks["burst_landed"] for r in timeline
                      if r["t"] + t0 > marks["burst_landed"] and r["group"] is not None
                      and r["group"] <= (max(steady_lag) if steady_lag else 0)), None)
    # Where a file's latency went, from the pollers' records (first delivery of each key on
    # each queue) and the commit: the median of each stage, per phase.
    stages = {"steady": {}, "burst": {}, "tail": {}}
    for key, (t, phase, at) in landed.items():
        mq, fq = mappings[0].seen.get(key), mappings[1].seen.get(key)
        if phase == "load" or key not in committed or not mq or not fq:
            continue
        for name, v in (("s3_notification", mq[0] - at), ("merge_queue_wait", mq[1] - mq[0]),
                        ("batching_window", mq[2] - mq[1]), ("route_invocation", fq[0] - mq[2]),
                        ("fifo_wait", fq[1] - fq[0]), ("merge_to_commit", committed[key] - fq[2]),
                        ("after_commit", fq[3] - committed[key])):
            stages[phase].setdefault(name, []).append(v)
    stages = {ph: {k: round(percentile(v, 50), 3) for k, v in st.items()} for ph, st in stages.items()}
    summary = {
        "kind": "summary", "tables": args.tables, "interval_s": args.interval, "steady_s": args.steady,
        "burst_files_per_table": args.burst, "changes_per_file": args.changes, "window_s": args.window,
        "pollers_per_mapping": args.pollers, "steady": stats(latency["steady"]), "burst": stats(latency["burst"]),
        "tail": stats(latency["tail"]), "commits": sum(len(c) for c in logs.values()),
        "invocations": {"merge_queue": mappings[0].invocations, "fifo_queue": mappings[1].invocations},
        "group_lag_steady_s": {"p50": percentile(steady_lag, 50), "p99": percentile(steady_lag, 99),
                               "max": max(steady_lag) if steady_lag else None},
        "group_lag_max_after_burst_s": max(after_burst) if after_burst else None,
        "lag_back_to_steady_max_after_burst_landed_s": recovered,
        "goal_lag_s": 2 * args.batch_interval, "missing_files": len(missing), "dead_lettered": dead,
        "wall_s": round(cpu1["wall"] - cpu0["wall"], 1),
        "cpu_s": {k: round(cpu1[k] - cpu0.get(k, 0), 1) for k in cpu1 if k != "wall"},
        "stages_p50_s": stages, "peak_rss_mb_max_instance": peak, "identical_to_source": True, "release": release,
    }
    out = Path(args.out) if args.out else ROOT / "target" / "freshness.jsonl"
    with open(out, "w") as f:
        f.write(json.dumps(summary) + "\n")
        for r in timeline:
            f.write(json.dumps({"kind": "lag", **r}) + "\n")
        for key, (t, phase, at) in sorted(landed.items()):
            f.write(json.dumps({"kind": "file", "key": key, "phase": phase, "landed": round(at - t0, 3),
                                "latency_s": round(committed[key] - at, 3) if key in committed else None}) + "\n")
    print(json.dumps(summary, indent=1))
    print("| phase | files | p50 s | p99 s | max s |")
    print("|---|---|---|---|---|")
    for phase in ("steady", "burst", "tail"):
        s = summary[phase]
        print(f"| {phase} | {s['files']} | {s['p50_s']:.2f} | {s['p99_s']:.2f} | {s['max_s']:.2f} |")
    print(f"results in {out}")
    if missing:
        raise SystemExit(f"{len(missing)} files were never committed, e.g. {missing[:3]}")
    if args.plot:
        plot(args.plot, out, marks, t0, tables, summary)


def plot(path, results, marks, t0, tables, summary):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [json.loads(line) for line in open(results)]
    files = [r for r in rows if r["kind"] == "file" and r["latency_s"] is not None and r["phase"] != "load"]
    lag = [r for r in rows if r["kind"] == "lag"]
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    colours = {"steady": "tab:blue", "burst": "tab:red", "tail": "tab:green"}
    for phase, c in colours.items():
        xs = [r["landed"] for r in files if r["phase"] == phase]
        ys = [r["latency_s"] for r in files if r["phase"] == phase]
        a.scatter(xs, ys, s=4, c=c, label=f"{phase} files")
    a.set_ylabel("landed -> committed (s)")
    a.set_title(f"{summary['tables']} tables, a file per table every {summary['interval_s']:g} s, "
                f"then {summary['burst_files_per_table']} files per table at once "
                f"(merge-queue batching window {summary['window_s']} s)", fontsize=9)
    a.legend(fontsize=8, loc="upper right")
    for t in tables:
        b.plot([r["t"] for r in lag], [r[t] for r in lag], lw=0.6, alpha=0.6)
    b.plot([r["t"] for r in lag], [r["group"] for r in lag], lw=1.6, c="black", label="group (largest)")
    b.axhline(summary["goal_lag_s"], ls="--", c="grey", lw=0.8, label="goal: 2 x DMS batch interval")
    b.set_ylabel("watermark lag (s)")
    b.set_xlabel("seconds since the steady load started")
    b.set_yscale("log")
    b.legend(fontsize=8, loc="upper right")
    for ax in (a, b):
        ax.axvline(marks["burst"] - t0, c="tab:red", lw=0.8, ls=":")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot in {path}")


if __name__ == "__main__":
    main()
