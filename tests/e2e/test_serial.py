"""One writer per table: notifications go through a standard queue, the merge function
forwards each batch's files to a FIFO queue, one message per table (the message group), and
merges what the FIFO queue gives it — each table's files by one invocation at a time, in
batches, however many invocations run. A file that cannot be merged is moved to the dead
queue at once (alone: the files its message shares are merged) instead of holding up its
table."""

import concurrent.futures
import json
import re
import time
from pathlib import Path

import dms
from conftest import Poller, read_table, record_timing


def test_a_burst_for_one_table_is_merged_by_one_writer_in_batches(aws, stack, functions):
    source = dms.Source(seed=21)
    load = [(None, "2022-10-25 23:59:59.000000", *r[2:]) for r in source.insert_records(2000)]
    files = [("LOAD00000001.parquet", dms.parquet(load, False))]
    files += [(f"2022/10/26/20221026-{i:010d}.parquet", dms.parquet(source.random_changes(20), True))
              for i in range(40)]
    bad_key = "fifo/serial/travel_details/2022/10/26/20221026-0000000020-bad.parquet"
    start = time.time()
    for key, body in files:
        aws.s3.put_object(Bucket=stack.raw, Key=f"fifo/serial/travel_details/{key}", Body=body)
    aws.s3.put_object(Bucket=stack.raw, Key=bad_key, Body=b"not parquet")
    route = Poller(aws, stack, functions, stack.route_url, stack.route_arn)
    fifo = Poller(aws, stack, functions, stack.fifo_url, stack.fifo_arn)
    log_start = Path(functions.log.name).stat().st_size

    def pump(poller):
        messages = poller.receive(10, wait=0)
        if messages:
            poller.deliver(messages)
        return len(messages)

    # Lambda's pollers: 8 concurrent consumers of each queue (SQS FIFO hands a message
    # group to one consumer at a time).
    deadline = time.time() + 240
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        while time.time() < deadline:
            got = sum(pool.map(pump, [route] * 4 + [fifo] * 4))
            if not got and read_table(stack, "serial")[1] == source.state():
                break
    elapsed = time.time() - start
    assert read_table(stack, "serial")[1] == source.state(), "the table converged without the bad file"
    dead = aws.sqs.receive_message(QueueUrl=stack.dead_url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                   MessageAttributeNames=["All"]).get("Messages", [])
    assert len(dead) == 1, dead
    assert [r["s3"]["object"]["key"] for r in json.loads(dead[0]["Body"])["Records"]] == [bad_key]
    assert "not a readable Parquet file" in dead[0]["MessageAttributes"]["tributary_error"]["StringValue"]
    # Every commit of the table by one writer: no commit conflict; files batched.
    log = Path(functions.log.name).read_text()[log_start:]
    attempts = [int(a) for a in re.findall(r'"table":"serial"[^\n]*?\\"commit_attempts\\":(\d+)', log)]
    commits = len(attempts)
    assert commits and max(attempts) == 1, attempts
    assert commits <= 10, f"{commits} commits for {len(files)} files"
    # The routed batches went to the FIFO queue as one message per table, many files each.
    forwarded = [int(n) for n in re.findall(r'"group":"serial"[^\n]*?"files":(\d+)', log)]
    assert sum(forwarded) >= len(files) + 1 and max(forwarded) > 1, forwarded
    record_timing("one writer per table (FIFO)", elapsed, f"{len(files)} files + 1 bad, {commits} commits, no conflict")
