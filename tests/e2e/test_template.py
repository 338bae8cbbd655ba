"""The pipeline on the resources as template.yaml defines them: the template (SAM
transform, minus the functions and what exists only around them: template_stack.py) is
deployed to LocalStack's CloudFormation twice, side by side; DMS files land in the bucket
it made, its S3 notification configuration sends them to its queue, the function binaries
run with the environment the template gives them (resolved from the deployed stack:
queues, FIFO queue, dead-letter queue, configuration location), forward through its FIFO
queue, merge, and move an unreadable file to its dead-letter queue. A change to the
template's queues, notifications, outputs or function environment changes what this test
runs against."""

import json
import time
import uuid
from types import SimpleNamespace
from urllib.parse import urlparse

import dms
import template_stack
from conftest import CREDS, ENDPOINT, REGION, Functions, Poller, read_table, record_timing, table_config


def test_two_stacks_and_the_pipeline_through_the_templates_resources(aws):
    run = uuid.uuid4().hex[:6]
    creds = {k: v for k, v in CREDS.items() if k != "region_name"}
    start = time.time()
    out, res, resolve = template_stack.deploy(ENDPOINT, creds, REGION, f"tributary-e2e-{run}")
    # A second stack beside it: an upper-case, long name, on the first stack's raw bucket
    # (the existing-bucket variant: an EventBridge rule instead of S3 notifications).
    out2, res2, resolve2 = template_stack.deploy(ENDPOINT, creds, REGION, f"Tributary-E2E-{run}-Second-Stack-With-A-Long-Name",
                                          {"RawBucketName": out["RawBucket"], "TablesPrefix": "delta/"})
    record_timing("template: two stacks created", time.time() - start, f"{len(res)} + {len(res2)} resources")
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

    # The configuration where the template says, the functions as the template configures them.
    raw, curated = out["RawBucket"], out["CuratedBucket"]
    location = urlparse(out["ConfigLocation"])
    aws.s3.put_object(Bucket=location.netloc, Key=location.path.lstrip("/"),
                      Body=table_config(raw, curated, "tmpl").encode())
    environment = resolve.environment("MergeFunction")
    assert environment["TRIBUTARY_CONFIG"] == out["ConfigLocation"]
    assert environment["TRIBUTARY_ROUTE_TO"] == out["TableQueueUrl"], environment
    environment.update(AWS_ENDPOINT_URL=ENDPOINT, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
                       AWS_REGION=REGION)
    functions = Functions(None, None, environment=environment, log="e2e-template-cargo-lambda.log")
    try:
        route = Poller(aws, None, functions, out["MergeQueueUrl"], out["MergeQueueArn"])
        fifo = Poller(aws, None, functions, out["TableQueueUrl"], resolve.arn("TableQueue"))
        source = dms.Source(seed=41)
        files = dms.seed_files(source, full_load_rows=1000, new_rows=40)
        prefix = "dms/tmpl/travel_details/"
        bad_key = prefix + "2022/10/26/20221026-0000000099.parquet"
        start = time.time()
        for key, body in files:
            aws.s3.put_object(Bucket=raw, Key=prefix + key, Body=body)
        aws.s3.put_object(Bucket=raw, Key=bad_key, Body=b"not parquet")
        stack = SimpleNamespace(curated=curated)
        dead = []
        deadline = time.time() + 180
        while time.time() < deadline:
            moved = 0
            for poller in (route, fifo):
                messages = poller.receive(10, wait=0)
                if messages:
                    poller.deliver(messages)
                    moved += len(messages)
            for m in aws.sqs.receive_message(QueueUrl=out["DeadLetterQueueUrl"], MaxNumberOfMessages=10,
                                             WaitTimeSeconds=0).get("Messages", []):
                dead.append(json.loads(m["Body"])["Records"][0]["s3"]["object"]["key"])
                aws.sqs.delete_message(QueueUrl=out["DeadLetterQueueUrl"], ReceiptHandle=m["ReceiptHandle"])
            if not moved and dead and read_table(stack, "tmpl")[1] == source.state():
                break
            if not moved:
                time.sleep(0.5)
        elapsed = time.time() - start
        _, got = read_table(stack, "tmpl")
        assert got == source.state(), f"table has {len(got)} rows, source {len(source.state())}"
        assert dead == [bad_key], dead
        record_timing("template resources: S3 -> queue -> FIFO -> merge", elapsed,
                      f"{len(files)} files + 1 bad (to the template's DLQ)")
    finally:
        functions.stop()
