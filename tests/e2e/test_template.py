"""The pipeline on the resources as template.yaml defines them: the template (SAM
transform, minus the functions and what exists only around them: template_stack.py) is
deployed to LocalStack's CloudFormation twice, side by side; DMS files land in the bucket
it made, its S3 notification configuration sends them to its queue, the function binaries
run with the environment the template gives them (resolved from the deployed stack:
queues, FIFO queue, dead-letter queue, configuration location), forward through its FIFO
queue, merge, and move an unreadable file to its dead-letter queue. The second stack, on
the first one's bucket, gets its files through its EventBridge rule. A change to the
template's queues, notifications, rule, outputs or function environment changes what this
test runs against."""

import json
import time
import uuid
from types import SimpleNamespace
from urllib.parse import urlparse

import dms
import pytest
import template_stack
from conftest import CREDS, ENDPOINT, REGION, Functions, Poller, read_table, record_timing, table_config


@pytest.fixture(scope="module")
def stacks(aws):
    """Two stacks of template.yaml side by side: the first creates its buckets; the second
    (an upper-case, long name) uses the first's raw bucket — the existing-bucket variant, an
    EventBridge rule instead of S3 notifications — and keeps its tables under delta/."""
    run = uuid.uuid4().hex[:6]
    creds = {k: v for k, v in CREDS.items() if k != "region_name"}
    start = time.time()
    out, res, resolve = template_stack.deploy(ENDPOINT, creds, REGION, f"tributary-e2e-{run}")
    out2, res2, resolve2 = template_stack.deploy(ENDPOINT, creds, REGION, f"Tributary-E2E-{run}-Second-Stack-With-A-Long-Name",
                                                 {"RawBucketName": out["RawBucket"], "TablesPrefix": "delta/"})
    record_timing("template: two stacks created", time.time() - start, f"{len(res)} + {len(res2)} resources")
    # "Send notifications to Amazon EventBridge" on the existing bucket, as the template's
    # parameter description asks (keeping the first stack's queue notifications).
    notifications = aws.s3.get_bucket_notification_configuration(Bucket=out["RawBucket"])
    notifications.pop("ResponseMetadata", None)
    notifications["EventBridgeConfiguration"] = {}
    aws.s3.put_bucket_notification_configuration(Bucket=out["RawBucket"], NotificationConfiguration=notifications)
    return SimpleNamespace(out=out, res=res, resolve=resolve, out2=out2, res2=res2, resolve2=resolve2)


def run_functions(aws, out, resolve, table, log):
    """Upload a configuration with `table` where the stack's outputs say, and start the
    function binaries with the environment the template gives them."""
    location = urlparse(out["ConfigLocation"])
    source_bucket = out["RawBucket"]
    aws.s3.put_object(Bucket=location.netloc, Key=location.path.lstrip("/"),
                      Body=table_config(source_bucket, out["CuratedBucket"], table).encode())
    environment = resolve.environment("MergeFunction")
    assert environment["TRIBUTARY_CONFIG"] == out["ConfigLocation"]
    assert environment["TRIBUTARY_ROUTE_TO"] == out["TableQueueUrl"], environment
    environment.update(AWS_ENDPOINT_URL=ENDPOINT, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
                       AWS_REGION=REGION)
    return Functions(None, None, environment=environment, log=log)


def drain(aws, out, resolve, functions, table, source, files, bad_key=None, timeout=180):
    """Play Lambda's pollers on the stack's queue and FIFO queue until the table equals the
    source (and the bad file reached the dead-letter queue); returns the seconds taken and
    the keys dead-lettered."""
    route = Poller(aws, None, functions, out["MergeQueueUrl"], out["MergeQueueArn"])
    fifo = Poller(aws, None, functions, out["TableQueueUrl"], resolve.arn("TableQueue"))
    stack = SimpleNamespace(curated=out["CuratedBucket"])
    dead = []
    start = time.time()
    deadline = start + timeout
    while time.time() < deadline:
        moved = 0
        for poller in (route, fifo):
            messages = poller.receive(10, wait=0)
            if messages:
                poller.deliver(messages)
                moved += len(messages)
        for m in aws.sqs.receive_message(QueueUrl=out["DeadLetterQueueUrl"], MaxNumberOfMessages=10,
                                         WaitTimeSeconds=0).get("Messages", []):
            body = json.loads(m["Body"])
            record = body["Records"][0]["s3"]["object"]["key"] if "Records" in body else body["detail"]["object"]["key"]
            dead.append(record)
            aws.sqs.delete_message(QueueUrl=out["DeadLetterQueueUrl"], ReceiptHandle=m["ReceiptHandle"])
        if not moved and (bad_key is None or dead) and read_table(stack, table)[1] == source.state():
            break
        if not moved:
            time.sleep(0.5)
    _, got = read_table(stack, table)
    assert got == source.state(), f"table has {len(got)} rows, source {len(source.state())}"
    return time.time() - start, dead


def test_two_stacks_and_the_pipeline_through_the_templates_resources(aws, stacks):
    out, res, resolve = stacks.out, stacks.res, stacks.resolve
    out2, res2, resolve2 = stacks.out2, stacks.res2, stacks.resolve2
    # (LocalStack names every dashboard "unknown": not a name of the template's.)
    shared = {r for r in set(res.values()) & set(res2.values()) if r != "unknown"}
    assert not shared, f"the stacks share resource names: {shared}"
    assert "ObjectCreatedRule" in res2 and "RawBucket" not in res2 and "RawBucket" in res
    assert out2["CuratedBucket"] == out2["CuratedBucket"].lower() and out2["RawBucket"] == out["RawBucket"]
    assert resolve2.environment("MergeFunction")["TRIBUTARY_TABLES_LOCATION"] == f"s3://{out2['CuratedBucket']}/delta/"
    # The outputs the README's commands use.
    for key in ("RawBucket", "CuratedBucket", "ConfigLocation", "MergeQueueUrl", "MergeQueueArn",
                "DeadLetterQueueUrl", "DeadLetterQueueArn", "TableQueueUrl", "MetricsNamespace"):
        assert out.get(key), (key, out)
    redrive = json.loads(aws.sqs.get_queue_attributes(
        QueueUrl=out["MergeQueueUrl"], AttributeNames=["RedrivePolicy"])["Attributes"]["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == out["DeadLetterQueueArn"], redrive

    # The functions as the template configures them, on the stack's S3 notifications.
    functions = run_functions(aws, out, resolve, "tmpl", "e2e-template-cargo-lambda.log")
    try:
        source = dms.Source(seed=41)
        files = dms.seed_files(source, full_load_rows=1000, new_rows=40)
        prefix = "dms/tmpl/travel_details/"
        bad_key = prefix + "2022/10/26/20221026-0000000099.parquet"
        for key, body in files:
            aws.s3.put_object(Bucket=out["RawBucket"], Key=prefix + key, Body=body)
        aws.s3.put_object(Bucket=out["RawBucket"], Key=bad_key, Body=b"not parquet")
        elapsed, dead = drain(aws, out, resolve, functions, "tmpl", source, files, bad_key)
        assert dead == [bad_key], dead
        record_timing("template resources: S3 -> queue -> FIFO -> merge", elapsed,
                      f"{len(files)} files + 1 bad (to the template's DLQ)")
    finally:
        functions.stop()


def test_the_second_stack_gets_the_existing_buckets_files_through_eventbridge(aws, stacks):
    """The existing-bucket variant: the second stack's EventBridge rule (bucket and prefix
    as the template filters them) delivers Object Created events to its queue, and its
    functions merge them into its curated bucket, under its TablesPrefix."""
    out, resolve = stacks.out2, stacks.resolve2
    functions = run_functions(aws, out, resolve, "tmplb", "e2e-template-b-cargo-lambda.log")
    try:
        source = dms.Source(seed=42)
        files = dms.seed_files(source, full_load_rows=500, new_rows=20)
        for key, body in files:
            aws.s3.put_object(Bucket=out["RawBucket"], Key=f"dms/tmplb/travel_details/{key}", Body=body)
        # outside RawPrefix: the rule does not forward it
        aws.s3.put_object(Bucket=out["RawBucket"], Key="elsewhere/tmplb/x.parquet", Body=b"x")
        elapsed, dead = drain(aws, out, resolve, functions, "tmplb", source, files)
        assert dead == [], dead
        record_timing("template, existing bucket: EventBridge -> queue -> FIFO -> merge", elapsed,
                      f"{len(files)} files")
    finally:
        functions.stop()
