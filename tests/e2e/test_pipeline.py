"""End-to-end scenarios against LocalStack: real S3 notifications into a real SQS queue,
the real function binaries, and the curated table read back from S3 by another reader."""

import concurrent.futures
import json
import time
from pathlib import Path

import dms
import pyarrow
import pyarrow.parquet
import tempfile

from conftest import ENDPOINT, ROOT, TABLES, catalog_partitions, duckdb_reads, manifests_exact, read_history, read_table, record_timing


def curated_fs(stack):
    """The curated bucket as a pyarrow file system (LocalStack)."""
    import pyarrow.fs
    return pyarrow.fs.SubTreeFileSystem(stack.curated, pyarrow.fs.S3FileSystem(
        access_key="test", secret_key="test", region="us-east-1",
        endpoint_override=ENDPOINT.replace("http://", ""), scheme="http"))


def upload(aws, stack, table, files):
    for key, body in files:
        aws.s3.put_object(Bucket=stack.raw, Key=f"dms/{table}/travel_details/{key}", Body=body)


def converge(aws, stack, poller, table, expected, scenario, start, times=1, batch=10, timeout=240):
    def done():
        _, got = read_table(stack, table)
        return got == expected
    ok = poller.run_until(done, timeout=timeout, times=times, batch=batch)
    elapsed = time.time() - start
    _, got = read_table(stack, table)
    assert ok, f"{scenario}: table has {len(got)} rows, source has {len(expected)}; " \
               f"missing {len(set(expected) - set(got))}, extra {len(set(got) - set(expected))}"
    exact, why = manifests_exact(aws, stack, table)
    assert exact, why
    with tempfile.TemporaryDirectory() as tmp:
        why = duckdb_reads(aws, stack, table, expected, tmp)
        assert why is None, f"{scenario}: {why}"
    record_timing(scenario, elapsed, f"{len(expected)} rows, {poller.invocations} invocations so far")
    return elapsed


def test_seed_scenario(aws, stack, poller):
    source = dms.Source(seed=1)
    files = dms.seed_files(source)
    start = time.time()
    upload(aws, stack, "seed", files)
    converge(aws, stack, poller, "seed", source.state(), "seed: full load + 3 CDC files", start)
    _, got = read_table(stack, "seed")
    destinations = {d for _, d, _ in got.values()}
    assert "Miami" not in destinations and "Los Angeles" not in destinations
    assert 20000 < max(got) <= 20200, "the 200 new trips are there (minus those deleted)"


def test_every_notification_delivered_twice(aws, stack, poller):
    source = dms.Source(seed=2)
    files = dms.seed_files(source, full_load_rows=3000, new_rows=100)
    files += [(f"2022/10/26/20221026-{i:010d}.parquet", dms.parquet(source.random_changes(20), True)) for i in range(5)]
    start = time.time()
    upload(aws, stack, "twice", files)
    # one message per invocation, each invocation made twice
    converge(aws, stack, poller, "twice", source.state(), "every notification twice", start, times=2, batch=1)


def test_files_uploaded_in_reverse_order(aws, stack, poller):
    source = dms.Source(seed=3)
    files = dms.seed_files(source, full_load_rows=3000, new_rows=100)
    files += [(f"2022/10/26/20221026-{i:010d}.parquet", dms.parquet(source.random_changes(20), True)) for i in range(5)]
    start = time.time()
    upload(aws, stack, "reverse", list(reversed(files)))
    # one message per invocation: the files are merged newest first
    converge(aws, stack, poller, "reverse", source.state(), "files uploaded in reverse order", start, batch=1)
    # The table keeps zstd files with delta-encoded order keys (conftest): what Python
    # deltalake just read back. Check that the files really are written that way.
    dt, _ = read_table(stack, "reverse")
    meta = pyarrow.parquet.ParquetFile(dt.file_uris()[0].replace(f"s3://{stack.curated}/", ""), filesystem=curated_fs(stack)).metadata
    seq = next(meta.row_group(0).column(i) for i in range(meta.num_columns) if meta.row_group(0).column(i).path_in_schema == "_tributary_seq")
    assert seq.compression == "ZSTD" and "DELTA_BYTE_ARRAY" in seq.encodings, (seq.compression, seq.encodings)


def test_burst_of_concurrent_invocations(aws, stack, poller, glue):
    source = dms.Source(seed=4)
    files = [("LOAD00000001.parquet", dms.parquet([(None, "2022-10-25 23:59:59.000000", *r[2:]) for r in source.insert_records(500)], False))]
    for i in range(23):
        changes = source.random_changes(15)
        if i == 12:  # a partition emptied and another created, amid concurrent commits
            changes += source.update(lambda r: r["route_id"] == "J", route_id="Z")
        files.append((f"2022/10/26/20221026-{i:010d}.parquet", dms.parquet(changes, True)))
    start = time.time()
    upload(aws, stack, "burst", files)
    # Collect every notification first, then fire 8 invocations at once (3 messages each).
    messages, deadline = [], time.time() + 60
    while len(messages) < len(files) and time.time() < deadline:
        messages += [m for m in poller.receive(10) if "burst/" in m["Body"]]
    assert len(messages) == len(files), f"got {len(messages)} notifications for {len(files)} files"
    failed = poller.deliver_concurrently(messages, workers=8, per_invocation=3)
    assert not failed, f"{len(failed)} messages failed in the burst"
    converge(aws, stack, poller, "burst", source.state(), "burst: 8 concurrent invocations", start)
    # The manifest entry's partitions followed the concurrent commits (no maintenance run).
    routes = {(r,) for r, _, _ in source.state().values()}
    assert catalog_partitions(glue, "burst_manifest") == routes


def cuts(functions):
    """What the scheduled run's last step does: every watermark moved, every group's cut
    published (`{"cuts": true}`)."""
    payload, error = functions.invoke("tributary-maintenance", json.loads(
        Path(ROOT / "events" / "maintenance-cuts.json").read_text()))
    assert error is None and not payload["failed"], payload
    w = payload["watermarks"]
    return dict((t, p) for t, p in w["tables"]), {g["group"]: g for g in w["groups"]}


def test_bad_files_go_to_the_dlq_and_replay_converges(aws, stack, poller, functions):
    source = dms.Source(seed=5)
    load = source.insert_records(200)
    good_before = source.state()
    files = [("LOAD00000001.parquet", dms.parquet([(None, "2022-10-25 23:59:59.000000", *r[2:]) for r in load], False))]
    changes = source.random_changes(10)
    bad_op = [("X" if i == 3 else op, ts, t, row) for i, (op, ts, t, row) in enumerate(changes)]
    corrupt_key = "2022/10/26/20221026-0000000001.parquet"
    bad_op_key = "2022/10/26/20221026-0000000002.parquet"
    start = time.time()
    upload(aws, stack, "bad", files + [(corrupt_key, b"PAR1 not a parquet file"), (bad_op_key, dms.parquet(bad_op, True))])
    # Good files land; the bad ones are retried, then dead-lettered by SQS (maxReceiveCount 2).
    dead = []

    def bad_ones_dead():
        dead.extend(aws.sqs.receive_message(QueueUrl=stack.dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", []))
        return len(dead) >= 2
    assert poller.run_until(bad_ones_dead, timeout=120), f"{len(dead)} messages in the DLQ"
    dead_keys = sorted(json.loads(m["Body"])["Records"][0]["s3"]["object"]["key"] for m in dead)
    assert dead_keys == [f"dms/bad/travel_details/{corrupt_key}", f"dms/bad/travel_details/{bad_op_key}"], dead_keys
    _, got = read_table(stack, "bad")
    assert got == good_before, "the good file of the same table landed, nothing of the bad ones"
    # The raw files are untouched.
    assert aws.s3.get_object(Bucket=stack.raw, Key=f"dms/bad/travel_details/{corrupt_key}")["Body"].read() == b"PAR1 not a parquet file"
    # The dead-lettered file holds the table's watermark (before every CDC file: only the
    # full load is in), and so the cut of its group (the tables under dms/); the published
    # object says so.
    tables, groups = cuts(functions)
    held = tables["bad"]["held_by"]
    assert tables["bad"]["watermark"] is None and held["file"].endswith(corrupt_key), tables["bad"]
    dms_group = groups["dms"]
    assert dms_group["cut"] is None, dms_group
    published = json.loads(aws.s3.get_object(Bucket=stack.curated, Key="delta/_tributary_cuts/dms.json")["Body"].read())
    assert published["group"] == "dms" and published["cut"] is None
    assert [t["held_by"]["file"] for t in published["tables"] if t["table"] == "bad"] == [held["file"]]
    # Fix and replay: upload the corrected files (as a user would after fixing them).
    fixed_start = time.time()
    upload(aws, stack, "bad", [(corrupt_key, dms.parquet(changes[:1], True)),
                               (bad_op_key, dms.parquet(changes[1:], True))])
    converge(aws, stack, poller, "bad", source.state(), "bad files fixed and replayed", fixed_start)
    # The replay released it (the replayed merges moved it): the watermark is the newest file's time.
    tables, groups = cuts(functions)
    assert tables["bad"]["held_by"] is None and tables["bad"]["caught_up"], tables["bad"]
    assert tables["bad"]["watermark"] == "2022-10-26T00:00:00.000200Z", tables["bad"]
    # A second computation finds nothing new to record.
    again, _ = cuts(functions)
    assert not again["bad"]["advanced"] and again["bad"]["watermark"] == tables["bad"]["watermark"], again["bad"]
    record_timing("bad files → DLQ", fixed_start - start, "2 bad files dead-lettered after 2 receives")


def test_scheduled_maintenance_after_merges(aws, stack, poller, functions):
    before = {t: read_table(stack, t)[1] for t in ["seed", "twice", "burst"]}
    # What the template's state machine does: list the tables, then one invocation per
    # table, a few at a time.
    listed, error = functions.invoke("tributary-maintenance", json.loads(
        Path(ROOT / "events" / "maintenance-list.json").read_text()))
    assert error is None and sorted(listed["tables"]) == sorted(TABLES + ["serial"]), listed
    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        results = list(pool.map(lambda t: functions.invoke("tributary-maintenance", {"table": t}), listed["tables"]))
    elapsed = time.time() - start
    assert all(error is None for _, error in results), [p for p, e in results if e]
    reports = {m["table"]: m for payload, _ in results for m in payload["maintained"]}
    # The scheduled event of a single-invocation setup maintains every table too.
    event = json.loads(Path(ROOT / "events" / "scheduled-maintenance.json").read_text())
    payload, error = functions.invoke("tributary-maintenance", event)
    assert error is None and not payload["failed"], payload
    assert {m["table"] for m in payload["maintained"]} == set(TABLES + ["serial"])
    for t in before:
        r = reports[t]
        assert r["files_after"] <= r["files_before"], r
        assert read_table(stack, t)[1] == before[t], f"{t}: maintenance changed rows"
        exact, why = manifests_exact(aws, stack, t)
        assert exact, why
    compacted = sum(r["files_compacted"] for r in reports.values())
    record_timing("maintenance (one invocation per table, 5 at once)", elapsed,
                  f"{compacted} files compacted; " + ", ".join(f"{t}: {reports[t]['files_before']}→{reports[t]['files_after']} files" for t in before))


def test_gzip_csv_through_sqs_and_unreadable_files_to_the_dlq(aws, stack, poller):
    """DMS CSV with CompressionType=GZIP writes *.csv.gz: merged like any file (before: ignored
    as "not a CSV data file", the SQS message deleted, the changes lost). A file under the
    table's folder that tributary cannot read is never skipped: it reaches the DLQ."""
    source = dms.Source(seed=7)
    load = [(None, "2022-10-25 23:59:59.000000", *r[2:]) for r in source.insert_records(300)]
    files = [("LOAD00000001.csv.gz", dms.csv_gz(load, False))]
    files += [(f"2022/10/26/20221026-{i:010d}.csv.gz", dms.csv_gz(source.random_changes(12), True))
              for i in range(3)]
    start = time.time()
    upload(aws, stack, "csvgz", files + [("2022/10/26/notes.txt", b"not a DMS file")])
    converge(aws, stack, poller, "csvgz", source.state(), "gzip CSV through SQS", start)
    dead = []

    def notes_dead():
        for m in aws.sqs.receive_message(QueueUrl=stack.dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", []):
            dead.append(json.loads(m["Body"])["Records"][0]["s3"]["object"]["key"])
            aws.sqs.delete_message(QueueUrl=stack.dlq_url, ReceiptHandle=m["ReceiptHandle"])
        return "dms/csvgz/travel_details/2022/10/26/notes.txt" in dead
    assert poller.run_until(notes_dead, timeout=120), dead


def test_history_table_from_files_in_reverse_order(aws, stack, poller):
    """A history (SCD type 2) table fed from the same notifications as the current table:
    every version of every trip with its interval, whatever the delivery order."""
    source = dms.Source(seed=8)
    changes, files = [], []
    for i in range(6):
        batch = source.random_changes(15) if i else source.insert_records(40)
        changes += batch
        files.append((f"2022/10/26/20221026-{i:010d}.parquet", dms.parquet(batch, True)))
    start = time.time()
    upload(aws, stack, "hist", list(reversed(files)))
    converge(aws, stack, poller, "hist", source.state(), "history: files in reverse order", start, batch=1)
    want = dms.history_model(changes)
    assert poller.run_until(lambda: read_history(stack, "hist") == want, timeout=60), \
        f"history has {len(read_history(stack, 'hist'))} versions, the model {len(want)}"
    closed = [v for v in want if not v[4]]
    assert closed, "the scenario has updates and deletes"


def test_history_table_instead_of_the_current_table(aws, stack, poller):
    """A table with a history table and no `target`: the same files (in reverse order, one
    delivered twice) build the history alone; no current table, no tombstone table."""
    source = dms.Source(seed=10)
    changes, files = [], []
    for i in range(5):
        batch = source.random_changes(15) if i else source.insert_records(40)
        changes += batch
        files.append((f"2022/10/26/20221026-{i:010d}.parquet", dms.parquet(batch, True)))
    start = time.time()
    upload(aws, stack, "histonly", list(reversed(files)) + files[2:3])
    want = dms.history_model(changes)
    ok = poller.run_until(lambda: read_history(stack, "histonly") == want, timeout=120, batch=1)
    assert ok, f"history has {len(read_history(stack, 'histonly'))} versions, the model {len(want)}"
    record_timing("history only: reverse order", time.time() - start, f"{len(want)} versions")
    listed = aws.s3.list_objects_v2(Bucket=stack.curated, Prefix="delta/histonly/")
    assert listed.get("KeyCount", 0) == 0, [o["Key"] for o in listed.get("Contents", [])]
    assert [v for v in want if not v[4]], "the scenario has updates and deletes"


def test_change_data_feed_read_back_by_another_reader(aws, stack, poller):
    """`change_data_feed = true`: Python deltalake's CDF reader (`load_cdf`) sees each
    merge's inserts, updates and deletes; replayed from an empty table they give the
    source state."""
    source = dms.Source(seed=9)
    files = dms.seed_files(source, full_load_rows=1500, new_rows=60)
    start = time.time()
    upload(aws, stack, "cdf", files)
    converge(aws, stack, poller, "cdf", source.state(), "change data feed", start, batch=1)
    dt, _ = read_table(stack, "cdf")
    assert dt.metadata().configuration.get("delta.enableChangeDataFeed") == "true"
    feed = pyarrow.table(dt.load_cdf(starting_version=0).read_all()).to_pylist()
    kinds = {r["_change_type"] for r in feed}
    assert {"insert", "update_postimage", "delete"} <= kinds, kinds
    state = {}
    for r in sorted(feed, key=lambda r: r["_commit_version"]):
        if r["_change_type"] in ("insert", "update_postimage"):
            state[r["trip_id"]] = (r["route_id"], r["destination"], r["source_location"])
        elif r["_change_type"] == "delete":
            state.pop(r["trip_id"], None)
    assert state == source.state(), f"replayed feed: {len(state)} rows, source {len(source.state())}"


def test_large_files_spilled_to_disk_and_merged_in_slices(aws, stack, poller, functions):
    """Files larger than the spill threshold are streamed to a temporary file; a full load of
    more rows than `slice_rows` into a new table is appended whole in one commit, and a CDC
    file of more rows is merged in slices: the table is the same."""
    source = dms.Source(seed=9)
    load = [(None, "2022-10-25 23:59:59.000000", *r[2:]) for r in source.insert_records(200_000)]
    loaded = source.state()
    changes = source.update(lambda r: r["route_id"] in "ABC", destination="Tucson")
    changes += source.delete(lambda r: r["route_id"] == "D")
    files = [("LOAD00000001.parquet", dms.parquet(load, False)),
             ("2022/10/26/20221026-0000000000.parquet", dms.parquet(changes, True))]
    assert all(len(body) > 0.4 * 1024 * 1024 for _, body in files), "both files above the 0.4 MB spill threshold"
    start = time.time()
    upload(aws, stack, "big", files[:1])
    converge(aws, stack, poller, "big", loaded, "large full load: appended whole", start, timeout=400)
    upload(aws, stack, "big", files[1:])
    converge(aws, stack, poller, "big", source.state(), "large files: spilled, in slices", start, timeout=400)
    log = Path(functions.log.name).read_text().splitlines()
    for (key, _), how in zip(files, ["appended the whole file in one commit", "slice by slice"]):
        name = f"dms/big/travel_details/{key}"
        assert any(name in line and "spilled to a temporary file" in line for line in log), name
        assert any(name in line and how in line for line in log), (name, how)
    dt, _ = read_table(stack, "big")
    writes = [h for h in dt.history() if "tributary.files" in json.dumps(h) and "LOAD00000001" in json.dumps(h)]
    assert len(writes) == 1, f"the full load in one commit: {len(writes)}"
